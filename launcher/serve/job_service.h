// The control service's logic, free of gRPC types: what `launcher --serve` does for each call of the
// Control service (protos/control.proto). The gRPC adapter (control_service.h) extracts the token,
// calls Authenticate, then the method, and converts the status; everything else (roles, the queue,
// the store, the runs) lives behind this interface. A fake (fake_job_service.h) serves the adapter's
// tests.
#ifndef STAGEHAND_LAUNCHER_SERVE_JOB_SERVICE_H_
#define STAGEHAND_LAUNCHER_SERVE_JOB_SERVICE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "protos/control.pb.h"

namespace stagehand {

// Who is calling: the token's name and role (access.h decides what each role may do).
struct Caller {
  std::string name;
  control::Role role = control::ROLE_UNSPECIFIED;
};

struct EventBatch {
  std::vector<control::JobEvent> events;  // in seq order, after the asked seq
  bool ended = false;                     // the last event is the job's final state: nothing follows
};

struct LogRead {
  std::string data;
  int64_t offset = 0;  // of data's first byte
  bool ended = false;  // the job has ended and data reaches the end of the log
};

struct FileRead {
  std::string data;
  int64_t total_bytes = 0;
  bool eof = false;
};

// ReadLog's rank for the launcher's own log of the job (launcher.log).
inline constexpr int kLauncherLogRank = -1;

class JobService {
 public:
  virtual ~JobService() = default;

  virtual control::GetServerInfoResponse Info() = 0;

  // UNAUTHENTICATED when the token is empty or unknown (compared in constant time).
  virtual absl::StatusOr<Caller> Authenticate(absl::string_view token) = 0;

  // The errors of each method are those of the RPC of the same name (protos/control.proto).
  virtual absl::StatusOr<control::JobInfo> Submit(const Caller& caller, const control::SubmitJobRequest& request) = 0;
  virtual absl::StatusOr<control::JobInfo> Get(const Caller& caller, const std::string& id) = 0;
  // One page of jobs, newest first, and the token of the next ("" after the last).
  virtual absl::StatusOr<control::ListJobsResponse> List(const Caller& caller,
                                                         const control::ListJobsRequest& request) = 0;
  // Removes an ended job from the store; returns its run directory (kept on the server). Admin only.
  virtual absl::StatusOr<std::string> Delete(const Caller& caller, const std::string& id) = 0;

  // The events after `after_seq`, waiting up to `wait` for the first when there is none yet (an
  // empty batch then, not an error). `lines`: include output lines.
  virtual absl::StatusOr<EventBatch> Events(const Caller& caller, const std::string& id, int64_t after_seq, bool lines,
                                            absl::Duration wait) = 0;

  virtual absl::StatusOr<control::JobInfo> Cancel(const Caller& caller, const std::string& id) = 0;

  // Up to `max_bytes` of rank `rank`'s log (kLauncherLogRank: the launcher's own, launcher.log) from
  // `offset`, waiting up to `wait` for more when there is none yet and the job still runs.
  virtual absl::StatusOr<LogRead> ReadLog(const Caller& caller, const std::string& id, int rank, int64_t offset,
                                          int64_t max_bytes, absl::Duration wait) = 0;

  // Up to `max_bytes` of a run-directory file from `offset` (`path` relative to the run directory,
  // confined to it).
  virtual absl::StatusOr<FileRead> ReadFile(const Caller& caller, const std::string& id, const std::string& path,
                                            int64_t offset, int64_t max_bytes) = 0;

  // The new token's text (shown once).
  virtual absl::StatusOr<std::string> MintToken(const Caller& caller, const std::string& name, control::Role role) = 0;
  virtual absl::Status RevokeToken(const Caller& caller, const std::string& name) = 0;
  // Every token's record (name, role, times; the revoked ones too), by name. Admin only.
  virtual absl::StatusOr<std::vector<control::TokenInfo>> ListTokens(const Caller& caller) = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_JOB_SERVICE_H_
