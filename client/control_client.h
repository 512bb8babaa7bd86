// A client of the Control service (protos/control.proto) returning absl types: the token in every
// call's metadata, 10 s deadlines on unary calls, watches that survive a cut stream, fetched files
// written atomically. Every error has passed ExplainRpcError, so its message says what to check.
#ifndef STAGEHAND_CLIENT_CONTROL_CLIENT_H_
#define STAGEHAND_CLIENT_CONTROL_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "protos/control.grpc.pb.h"

namespace stagehand {

struct ControlClientOptions {
  std::string server;                              // HOST:PORT
  std::string token;                               // sent as "authorization: Bearer <token>"; "" sends none
  ClientTlsFiles tls;                              // all empty: plaintext
  absl::Duration rpc_timeout = absl::Seconds(10);  // unary calls
  // SubmitJob: the server may check a job for up to 20 s (job_server.h) before it answers.
  absl::Duration submit_timeout = absl::Seconds(30);
  // A cut watch stream (UNAVAILABLE) is resumed from the last seq seen, at most this many times
  // within the window; the count starts over once a resumed stream delivers an event.
  int watch_retries = 20;
  absl::Duration watch_retry_window = absl::Seconds(60);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
};

class ControlClient {
 public:
  // INVALID_ARGUMENT for a bad TLS file (named). Connects lazily: a server that is down shows at the
  // first call.
  static absl::StatusOr<std::unique_ptr<ControlClient>> Create(const ControlClientOptions& options);

  absl::StatusOr<control::GetServerInfoResponse> Info();
  // Retries UNAVAILABLE and DEADLINE_EXCEEDED (the reply may have been lost) with the same
  // submission id, which the server makes idempotent: a job is never queued twice.
  absl::StatusOr<control::JobInfo> Submit(const control::SubmitJobRequest& request);
  absl::StatusOr<control::JobInfo> Get(const std::string& id);
  // One page (the request's page_token and page_size).
  absl::StatusOr<control::ListJobsResponse> List(const control::ListJobsRequest& request);
  // Every page, newest first, until `limit` jobs (0: all of them).
  absl::StatusOr<std::vector<control::JobInfo>> ListAll(const control::ListJobsRequest& request, int limit);
  // Removes an ended job from the server's store (admin); returns its run directory, kept there.
  absl::StatusOr<std::string> Delete(const std::string& id);
  absl::StatusOr<control::JobInfo> Cancel(const std::string& id);

  // Calls `on_event` for each event after `after_seq`, in order and once each across reconnects,
  // and returns the job's final state. UNAVAILABLE when the stream could not be resumed within the
  // retry budget (the message says from which seq to resume).
  absl::StatusOr<control::JobInfo> Watch(const std::string& id, bool no_lines, int64_t after_seq,
                                         const std::function<void(const control::JobEvent&)>& on_event);

  // Rank `rank`'s log (rank -1: the launcher's own, launcher.log) from `offset`, each chunk to
  // `on_data`; with `follow`, until the job ends.
  absl::Status Logs(const std::string& id, int rank, int64_t offset, bool follow,
                    const std::function<void(absl::string_view)>& on_data);

  // The run-directory file `path` of job `id` into `local_path`, through a temporary file beside
  // it renamed at the end, so that a failed fetch leaves nothing (and an old file as it was). The
  // bytes written. DATA_LOSS when the stream ends short of the size the server announced.
  absl::StatusOr<int64_t> Fetch(const std::string& id, const std::string& path, const std::string& local_path);
  // The same, each chunk to `write` (stdout, say); a failed write ends the fetch with its status.
  absl::StatusOr<int64_t> FetchTo(const std::string& id, const std::string& path,
                                  const std::function<absl::Status(absl::string_view)>& write);

  absl::StatusOr<std::string> Mint(const std::string& name, control::Role role);
  absl::Status Revoke(const std::string& name);
  absl::StatusOr<std::vector<control::TokenInfo>> ListTokens();

  const ClientTlsInfo& tls_info() const { return info_; }

 private:
  ControlClient(const ControlClientOptions& options, std::unique_ptr<control::Control::Stub> stub, ClientTlsInfo info)
      : options_(options), stub_(std::move(stub)), info_(std::move(info)) {}

  // A context with the token and, for unary calls, the deadline (`timeout`, else rpc_timeout).
  std::unique_ptr<grpc::ClientContext> Context(bool unary, absl::Duration timeout = absl::ZeroDuration()) const;
  absl::Status Explain(const grpc::Status& status) const { return ExplainRpcError(status, info_); }

  // One WatchJob stream from `last_seq`, advancing it; `final_state` set when the job's end arrived.
  grpc::Status WatchOnce(const control::WatchJobRequest& request, int64_t& last_seq, bool& progressed,
                         std::optional<control::JobInfo>& final_state,
                         const std::function<void(const control::JobEvent&)>& on_event);

  const ControlClientOptions options_;
  std::unique_ptr<control::Control::Stub> stub_;
  const ClientTlsInfo info_;
};

}  // namespace stagehand

#endif  // STAGEHAND_CLIENT_CONTROL_CLIENT_H_
