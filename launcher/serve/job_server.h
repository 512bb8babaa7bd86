// The server's logic behind `launcher --serve` (the JobService of job_service.h): submissions are
// resolved exactly as a foreground launch resolves its flags, queued for their devices, and run as
// JobRuns on the serve loop's thread; the store (SQLite) keeps every job and token across restarts,
// and each job's events stream to its watchers.
//
// Threads: gRPC threads call the JobService methods; one thread (the serve loop, which must live as
// long as the workers: PR_SET_PDEATHSIG) calls Tick(), which alone starts, drives and ends runs.
#ifndef STAGEHAND_LAUNCHER_SERVE_JOB_SERVER_H_
#define STAGEHAND_LAUNCHER_SERVE_JOB_SERVER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "launcher/serve/access.h"
#include "launcher/plan/devices.h"
#include "launcher/serve/job_events.h"
#include "launcher/serve/job_queue.h"
#include "launcher/run/job_run.h"
#include "launcher/serve/job_service.h"
#include "launcher/serve/job_store.h"
#include "launcher/run/launch.h"
#include "launcher/supervise/terminal.h"

namespace stagehand {

// The most a SubmitJobRequest may carry, serialized (a job file, a --schedule_file's text): every
// job comes back whole in `client list` and `status`, and a reply must stay far below gRPC's 4 MiB.
inline constexpr size_t kMaxSubmissionBytes = 256 * 1024;
// A ListJobs reply stops adding jobs past this many bytes (its next page starts there).
inline constexpr size_t kMaxListReplyBytes = 1024 * 1024;

struct JobServerOptions {
  std::string state_dir;      // jobs.db, admin.token, runs/<job id>
  std::string worker_binary;  // "" to find it beside the launcher
  DeviceInventory inventory;  // the host's devices (QueryDevices)
  int max_cpu_workers = 0;    // CPU workers running at once, over all jobs (0: the cores)
  // The directories a job's paths (data, layout_profiles, init_from, resume, export_dir) must lie in,
  // links resolved: the server reads and writes them as its own user. Empty: <state_dir>/runs and
  // <state_dir>/data.
  std::vector<std::string> job_roots;
  bool new_admin_token = false;  // mint another admin token even when one exists (the first was lost)
  // --allow_commands: a submission may carry a command (`client submit -- PROGRAM ARGS`), run on this
  // host as the server's user, which makes every token that may submit a shell here. Off: refused at
  // submit, and a command job still queued from a start that allowed them fails when this one opens.
  bool allow_commands = false;
  // How many ended jobs keep their events (each up to JobEvents::kMaxLines lines) in memory; a watch of
  // an older one gets its final state only, as for jobs that ended before a restart.
  size_t ended_jobs_with_events = 64;
  double peak_tflops_per_device = 989.0;
  // Each submission is checked (ValidateLaunch, which reads its input files) on a thread of its own,
  // at most max_validations at once (RESOURCE_EXHAUSTED beyond), for at most validation_deadline
  // (DEADLINE_EXCEEDED; the check is abandoned at low priority), so that no job can hold a gRPC thread
  // or the server's shutdown. `validate` is the check (tests replace it).
  int max_validations = 4;
  absl::Duration validation_deadline = absl::Seconds(20);
  std::function<absl::StatusOr<ValidatedLaunch>(const LaunchOptions&, const DeviceInventory&)> validate =
      ValidateLaunch;
  bool tls = false;  // for GetServerInfo
  bool mutual_tls = false;
  // The server's own log: a line when a job is queued, starts and ends (serve.cc prints them).
  std::function<void(const std::string&)> log = [](const std::string&) {};
};

// What a server's start created in its state directory (the paths that were not there), so that a
// start that fails leaves nothing behind.
struct StartCreated {
  std::vector<std::string> files;
  std::vector<std::string> dirs;  // deepest first
};
// Removes them: the files, then the directories that are empty. Call it with the store closed.
void RemoveCreated(const StartCreated& created);

class JobServer : public JobService {
 public:
  // Opens (or creates) the state directory and its store; jobs the store says were running are
  // marked lost (the server that ran them is gone); queued ones are queued again in their order;
  // on a first start, mints the admin token into <state_dir>/admin.token. `notes` gets the lines to
  // print. INVALID_ARGUMENT for a state directory or store that cannot be used; a failed Open removes
  // what it created.
  static absl::StatusOr<std::unique_ptr<JobServer>> Open(JobServerOptions options, std::vector<std::string>& notes);
  // What this start created: a caller that cannot serve after all destroys the server, then calls
  // RemoveCreated with it.
  const StartCreated& created() const { return created_; }
  ~JobServer() override;

  // The serve loop's pass: starts the queued jobs whose devices are free, drives the running ones,
  // records the ended ones.
  void Tick();
  // The server is stopping: every running job is stopped (SIGTERM, SIGKILL after its grace period;
  // `force`: SIGKILL now) and recorded as cancelled by the server; queued jobs stay queued for the
  // next start. Keep calling Tick() until Running() is 0. Submissions being checked are answered
  // UNAVAILABLE at once; their checks are abandoned (ValidationsRunning()).
  void Shutdown(bool force);
  int Running() const;
  // Submission checks still running (abandoned ones too): the process must then end with _exit,
  // since their threads may use anything static.
  int ValidationsRunning() const;

  // JobService.
  control::GetServerInfoResponse Info() override;
  absl::StatusOr<Caller> Authenticate(absl::string_view token) override;
  absl::StatusOr<control::JobInfo> Submit(const Caller& caller, const control::SubmitJobRequest& request) override;
  absl::StatusOr<control::JobInfo> Get(const Caller& caller, const std::string& id) override;
  absl::StatusOr<control::ListJobsResponse> List(const Caller& caller,
                                                 const control::ListJobsRequest& request) override;
  absl::StatusOr<std::string> Delete(const Caller& caller, const std::string& id) override;
  absl::StatusOr<EventBatch> Events(const Caller& caller, const std::string& id, int64_t after_seq, bool lines,
                                    absl::Duration wait) override;
  absl::StatusOr<control::JobInfo> Cancel(const Caller& caller, const std::string& id) override;
  absl::StatusOr<LogRead> ReadLog(const Caller& caller, const std::string& id, int rank, int64_t offset,
                                  int64_t max_bytes, absl::Duration wait) override;
  absl::StatusOr<FileRead> ReadFile(const Caller& caller, const std::string& id, const std::string& path,
                                    int64_t offset, int64_t max_bytes) override;
  absl::StatusOr<std::string> MintToken(const Caller& caller, const std::string& name, control::Role role) override;
  absl::Status RevokeToken(const Caller& caller, const std::string& name) override;
  absl::StatusOr<std::vector<control::TokenInfo>> ListTokens(const Caller& caller) override;

 private:
  struct Live;         // a job this server process knows: its events and, while it runs, its run
  struct Validations;  // the submission checks in flight, shared with their threads (which may outlive this)

  JobServer(JobServerOptions options, std::unique_ptr<JobStore> store, std::unique_ptr<Access> access);
  // Open's work; `locked` is set once the store (and its lock) is this server's.
  static absl::StatusOr<std::unique_ptr<JobServer>> OpenAt(JobServerOptions options, std::vector<std::string>& notes,
                                                           bool& locked);
  absl::StatusOr<ResolvedJob> Resolve(const Caller& caller, const control::SubmitJobRequest& request);
  absl::StatusOr<JobRecord> Record(const std::string& id) const;
  control::JobInfo Info(const JobRecord& record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Live> LiveJob(const std::string& id) ABSL_LOCKS_EXCLUDED(mu_);
  void StartGranted(const Grant& grant);
  void Drive(const std::string& id, Live& live);
  void End(const std::string& id, Live& live, control::JobState state, int exit_code, const std::string& cause,
           int64_t steps_done);
  void Publish(const std::string& id, Live& live, bool final);
  // An ended job: its events stay in memory while it is among the last ended_jobs_with_events to end.
  void RetireLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JobServerOptions options_;
  const std::unique_ptr<JobStore> store_;
  const std::unique_ptr<Access> access_;
  const std::shared_ptr<Validations> validations_;
  StartCreated created_;
  mutable absl::Mutex mu_;
  DeviceQueue queue_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<Live>> live_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ended_ ABSL_GUARDED_BY(mu_);  // ended jobs still in live_, oldest first
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  bool force_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_JOB_SERVER_H_
