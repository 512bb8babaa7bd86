// The durable state of `launcher --serve`: its jobs and its clients' token hashes, in one SQLite file
// (<state_dir>/jobs.db) that survives a restart and a kill -9 of the server with every committed
// change.
#ifndef STAGEHAND_LAUNCHER_SERVE_JOB_STORE_H_
#define STAGEHAND_LAUNCHER_SERVE_JOB_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/fd.h"
#include "protos/control.pb.h"
#include "protos/job.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace stagehand {

// One job as the store keeps it. Times are absl::InfinitePast() while unset.
struct JobRecord {
  std::string id;
  std::string submission_id;
  std::string submitted_by;  // the token's name
  std::string cancelled_by;
  std::string run_dir;
  std::string root_cause;
  control::JobState state = control::JOB_STATE_QUEUED;
  JobSpec spec;              // as the server resolved it
  control::Devices devices;  // the ask; gpu_ordinals once it runs
  absl::Time submitted = absl::InfinitePast();
  absl::Time started = absl::InfinitePast();
  absl::Time ended = absl::InfinitePast();
  int exit_code = 0;
  int64_t steps_done = 0;
  int64_t seq = 0;          // insertion order, set by Insert
  std::string spec_digest;  // SubmissionDigest of the request: what makes a retried submit the same
};

// The job as the Control service shows it (times as Unix milliseconds, 0 while unset). The queue
// position is not the store's: the caller sets it.
control::JobInfo ToJobInfo(const JobRecord& job);

// A hex SHA-256 of what the client asked for (the request less its submission id, serialized
// deterministically), so that a retried SubmitJob is recognized as the same and a reused submission id
// with another job is not.
std::string SubmissionDigest(const control::SubmitJobRequest& request);

struct TokenRecord {
  std::string name;
  control::Role role = control::ROLE_UNSPECIFIED;
  std::string hash;  // hex SHA-256 of the token (access.h's TokenHash)
  absl::Time created = absl::InfinitePast();
  absl::Time revoked = absl::InfinitePast();  // InfinitePast: valid
  bool is_revoked() const { return revoked != absl::InfinitePast(); }
};

control::TokenInfo ToTokenInfo(const TokenRecord& token);

// Thread-safe: one connection, every call under one lock (a job server's rate of changes is a few per
// second at most). Each method is one transaction. Errors name the database file and SQLite's message;
// UNAVAILABLE for a database locked past the busy timeout, RESOURCE_EXHAUSTED for a full disk,
// DATA_LOSS for a corrupt file or an I/O error.
class JobStore {
 public:
  // Opens (creating on a first start) <dir>/jobs.db, creating `dir` (mode 0700) when absent.
  // FAILED_PRECONDITION when the file is not a stagehand job store (not SQLite, or another program's
  // SQLite database) or was written by a newer stagehand, and when another process holds the store
  // (a second server on the same --state_dir would run the same jobs twice).
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& dir);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  const std::string& path() const { return path_; }

  // Adds `job` (its seq is assigned) and returns it as stored. Idempotent by (submitted_by,
  // submission_id): when that pair exists, returns the existing job if its spec_digest matches and
  // ALREADY_EXISTS ("submission id X was used for another job") otherwise. ALREADY_EXISTS too for a
  // job id that exists under another submission; INVALID_ARGUMENT for an empty id or submission id.
  absl::StatusOr<JobRecord> Insert(JobRecord job);

  absl::StatusOr<std::optional<JobRecord>> Get(const std::string& id);

  // Newest first, at most `limit` (0: no limit), of the given states (empty: every state), and only
  // those older than the job with seq `before_seq` when it is > 0 (the next page after that job).
  absl::StatusOr<std::vector<JobRecord>> List(int limit, const std::vector<control::JobState>& states = {},
                                              int64_t before_seq = 0);

  // Removes an ended job's row. NOT_FOUND for an unknown id; FAILED_PRECONDITION when it is queued or
  // running.
  absl::Status Delete(const std::string& id);

  // The queued jobs, oldest first: the order to enqueue them in after a restart.
  absl::StatusOr<std::vector<JobRecord>> Queued();

  // QUEUED -> RUNNING. NOT_FOUND for an unknown id; FAILED_PRECONDITION when the job is not queued.
  absl::Status MarkRunning(const std::string& id, absl::Time started, const control::Devices& devices,
                           const std::string& run_dir);

  // QUEUED or RUNNING -> `state` (SUCCEEDED, FAILED, CANCELLED or LOST). INVALID_ARGUMENT for another
  // state; NOT_FOUND for an unknown id; FAILED_PRECONDITION when the job has already ended.
  absl::Status MarkEnded(const std::string& id, control::JobState state, absl::Time ended, int exit_code,
                         const std::string& root_cause, int64_t steps_done);

  // The steps a job did, as its run directory says (a lost job's, counted after the fact).
  absl::Status SetStepsDone(const std::string& id, int64_t steps_done);

  // Who asked to cancel (set before the job's processes are stopped). NOT_FOUND for an unknown id.
  absl::Status SetCancelledBy(const std::string& id, const std::string& name);

  // At server start: every RUNNING job (its server died under it) becomes LOST, ended `now`, with
  // `reason` as its root cause. Returns those jobs as they are now.
  absl::StatusOr<std::vector<JobRecord>> MarkRunningLost(absl::Time now, const std::string& reason);

  // ALREADY_EXISTS when the name is taken, by a valid token or a revoked one.
  absl::Status AddToken(const TokenRecord& token);
  // Every token, the revoked ones too (marked), by name.
  absl::StatusOr<std::vector<TokenRecord>> FindTokens();
  // Marks the token revoked at `when`; its row stays, so AddToken refuses its name from then on.
  // NOT_FOUND when there is no such token or it is revoked already.
  absl::Status RevokeToken(const std::string& name, absl::Time when);

  // PRAGMA integrity_check: OK, or DATA_LOSS with SQLite's first complaint. It reads the whole file.
  absl::Status CheckIntegrity();

 private:
  class Statement;

  JobStore(std::string path, sqlite3* db, UniqueFd lock);
  absl::Status Init() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckHeader() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UseWal() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CreateSchema() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // One transaction: `sql`, then user_version = to_version.
  absl::Status Migrate(const char* sql, int64_t to_version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Error(int rc, const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> QueryInt(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Statement> Prepare(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Begin() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Commit(absl::Status body) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobRecord> InsertLocked(JobRecord job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<JobRecord>> MarkRunningLostLocked(absl::Time now, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<JobRecord>> GetLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::optional<JobRecord>> FindSubmission(const std::string& by, const std::string& submission_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::vector<JobRecord>> Rows(Statement& st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobRecord> Row(sqlite3_stmt* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Changed(const std::string& id, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const UniqueFd lock_;  // flock'd <dir>/jobs.lock
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_GUARDED_BY(mu_);
  // Prepared once, by the address of their SQL text (each a string literal of job_store.cc).
  absl::flat_hash_map<const char*, sqlite3_stmt*> statements_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_JOB_STORE_H_
