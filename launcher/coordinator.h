// The coordinator's state machine: registration and rank assignment, the write-once key-value store,
// barriers, heartbeats and progress, milestones, step reports and the end of each worker. It knows
// nothing of gRPC (coordinator_service.h adapts it); every call returns absl::Status with the codes
// that protos/coordinator.proto documents. Thread-safe. Waits (Register's wait for all, KeyValueGet,
// Barrier, WaitForStop) are callbacks, as in TSL's coordination service, so that a waiting RPC holds
// no thread; one timer thread ends those whose deadline passes.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_H_

#include <functional>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "protos/coordinator.pb.h"
#include "protos/job.pb.h"

namespace stagehand {

// What the supervisor sees of one worker slot.
struct WorkerState {
  bool registered = false;
  int64_t incarnation = 0;
  int pid = 0;
  std::string host;
  DeviceInfo device;
  absl::Time registered_at = absl::InfinitePast();
  absl::Time last_heartbeat = absl::InfinitePast();  // coordinator clock
  int64_t steps_done = 0;
  absl::Time last_progress = absl::InfinitePast();   // when steps_done last grew (or registration)
  std::map<int, absl::Time> milestones;              // Milestone -> worker clock time
  LayerProfile profile;                              // GPT jobs: the model's costs on its device
  bool finished = false;
  bool ok = false;
  bool failed_before_stop = false;  // reported a failure while the job still ran: a candidate root cause
  std::string error;
  int failed_action = -1;  // the index of the action that failed in its schedule (-1: none or unknown)
};


// How the model's pipeline layers are split into stages, decided once every worker has registered.
struct Partition {
  std::vector<int> layers_per_stage;  // per (virtual) stage of the schedule
  std::string description;            // for the log and the assignment
  std::vector<RankSchedule> schedules;  // per rank: the action list its Assignment ships
  // Data parallelism: per rank, the ranks that hold its stages, one per replica (empty: one replica).
  std::vector<std::vector<int>> replica_groups;
  double predicted_step_ms = 0;  // the simulated step (with the replicas' all-reduce), for the report
};
// Given every worker's registration (profiles included); an error stops the job with its message.
using PartitionFn = std::function<absl::StatusOr<Partition>(const std::vector<WorkerState>&)>;

class CoordinatorState {
 public:
  // Completions of the waits. Each runs exactly once, on the thread that ended the wait (the caller
  // itself when it can end at once, the caller of the call that ended it, or the timer thread), and
  // never under the state's lock, so it may call back into the state.
  using AssignmentCallback = std::function<void(absl::StatusOr<Assignment>)>;
  using ValueCallback = std::function<void(absl::StatusOr<std::string>)>;
  using StatusCallback = std::function<void(absl::Status)>;
  using StopCallback = std::function<void(absl::StatusOr<WaitForStopResponse>)>;

  // `now` is the clock for heartbeats and progress (absl::Now in production, a fake in tests).
  // Deadlines of waits are always on the real clock.
  CoordinatorState(JobSpec job, std::string job_id, std::string secret,
                   std::function<absl::Time()> now = absl::Now);
  ~CoordinatorState();  // ends pending waits as Shutdown() does
  CoordinatorState(const CoordinatorState&) = delete;
  CoordinatorState& operator=(const CoordinatorState&) = delete;

  const JobSpec& job() const { return job_; }
  const std::string& job_id() const { return job_id_; }
  const std::string& secret() const { return secret_; }  // handed to spawned workers, never logged

  // GPT jobs: decides the stages when the last worker registers. Set before serving.
  void SetPartitioner(PartitionFn fn) { partition_fn_ = std::move(fn); }

  // UNAUTHENTICATED unless `presented` equals the job secret (compared in constant time).
  absl::Status CheckSecret(absl::string_view presented) const;

  // Records the worker, then completes `done` once every slot has registered (or `deadline`, or the
  // job stops, or a newer incarnation replaces this one) with its Assignment. Rank = worker_index; a
  // re-registration with a newer incarnation replaces the slot.
  void RegisterAsync(const RegisterRequest& request, absl::Time deadline, AssignmentCallback done);
  // Write-once; `rank` and `incarnation` name the writer (stale writers are ABORTED).
  absl::Status KeyValueSet(int rank, int64_t incarnation, const std::string& key,
                           const std::string& value);
  // Completes `done` with the key's value once it is set (or `deadline`, or the job stops).
  void KeyValueGetAsync(const std::string& key, absl::Time deadline, ValueCallback done);
  // Enters `rank` into the barrier; completes `done` once every rank has entered it.
  void BarrierAsync(const std::string& barrier_id, int rank, int64_t incarnation,
                    absl::Time deadline, StatusCallback done);
  // Completes `done` when the job stops, with the reason and its origin (TSL's PollForError).
  void WaitForStopAsync(int rank, int64_t incarnation, absl::Time deadline, StopCallback done);

  // Blocking forms of the waits for in-process callers and tests (the gRPC service uses the above).
  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Time deadline);
  absl::StatusOr<std::string> KeyValueGet(const std::string& key, absl::Time deadline);
  absl::Status Barrier(const std::string& barrier_id, int rank, int64_t incarnation,
                       absl::Time deadline);

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status ReportMilestone(const ReportMilestoneRequest& request);
  // A repeat of the same (rank, incarnation, step) is recorded once: retries are safe.
  absl::Status ReportStep(const ReportStepRequest& request);
  absl::Status Finish(const FinishRequest& request);

  // Moves the job to stopping: waiters complete (WaitForStop with the reason and `origin`, the
  // others with CANCELLED), new registrations and writes fail with FAILED_PRECONDITION, heartbeats
  // answer stop=true with the reason. The first reason is kept.
  void Stop(const std::string& reason, const std::string& origin = "the launcher");
  bool stopping() const;
  std::optional<std::string> stop_reason() const;  // the first reason given to Stop()

  // For the server's shutdown, which must finish every call before it returns: completes every
  // pending wait with UNAVAILABLE, and later waits at once. The job's state stays readable.
  void Shutdown();

  // Snapshots for the supervisor and the reports.
  std::vector<WorkerState> Workers() const;
  std::vector<ReportStepRequest> Steps() const;  // every step once, in arrival order
  // The steps from the `from`-th on (arrival order): what arrived since a reader's last call, without
  // copying the whole history each time.
  std::vector<ReportStepRequest> StepsSince(size_t from) const;
  std::optional<Partition> partition() const;  // once planned

  // For tests: true once at least `count` waits are pending (false if `deadline` passes first), so
  // that a test knows its calls are waiting without sleeping.
  bool AwaitPendingWaits(int count, absl::Time deadline) const;

 private:
  // A pending wait. `poll` runs under mu_ after every change that may end the wait (a registration,
  // a key, a barrier arrival, Stop, Shutdown) and once `deadline` passes (`expired`); it returns the
  // completion to run outside the lock, or nullptr to keep waiting.
  using Completion = std::function<void()>;
  struct Wait {
    absl::Time deadline;
    std::function<Completion(bool expired)> poll;
  };
  // Completions to run once mu_ is released: declared before the MutexLock in a scope, it runs them
  // after the lock's destructor has unlocked.
  class Completions {
   public:
    ~Completions() {
      for (Completion& c : ready_) c();
    }
    void Add(Completion c) { ready_.push_back(std::move(c)); }

   private:
    std::vector<Completion> ready_;
  };

  absl::Status CheckRank(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Rank in range, registered, and not of an older incarnation than the slot's.
  absl::Status CheckCaller(int rank, int64_t incarnation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status StaleError(int rank, int64_t incarnation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status StoppingError() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Register's steps: fill (or replace, or confirm) the slot; then a wait whose poll answers.
  absl::Status RecordRegistration(const RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::StatusOr<Assignment>> RegistrationResult(int rank, int64_t incarnation,
                                                               bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::Status> BarrierResult(const std::string& barrier_id, int rank,
                                            int64_t incarnation, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Assignment BuildAssignment(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void StopLocked(const std::string& reason, const std::string& origin)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Partitioned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Polls `wait` at once; keeps it if it is not over.
  void AddWaitLocked(Wait wait, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls every pending wait, again while a pass ends some (one ending may stop the job).
  void PollWaitsLocked(Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  const JobSpec job_;
  const std::string job_id_;
  const std::string secret_;
  const std::function<absl::Time()> now_;
  PartitionFn partition_fn_;

  mutable absl::Mutex mu_;
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  int registered_count_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::vector<bool>> barriers_ ABSL_GUARDED_BY(mu_);  // id -> arrived per rank
  std::vector<ReportStepRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::set<std::tuple<int, int64_t, int64_t>> step_keys_ ABSL_GUARDED_BY(mu_);  // rank, inc., step
  std::optional<std::string> stop_reason_ ABSL_GUARDED_BY(mu_);
  std::string stop_origin_ ABSL_GUARDED_BY(mu_);
  std::optional<Partition> partition_ ABSL_GUARDED_BY(mu_);
  std::list<Wait> waits_ ABSL_GUARDED_BY(mu_);
  int64_t waits_added_ ABSL_GUARDED_BY(mu_) = 0;  // wakes the timer to look at a new deadline
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;  // last: starts once the members above exist
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_H_
