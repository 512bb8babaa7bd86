// The coordinator's state machine: registration and rank assignment, the write-once key-value store,
// barriers, heartbeats and progress, milestones, step reports and the end of each worker. It knows
// nothing of gRPC (coordinator_service.h adapts it); every call returns absl::Status with the codes
// that protos/coordinator.proto documents. Thread-safe: gRPC handler threads block in it.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
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
};


// How the model's pipeline layers are split into stages, decided once every worker has registered.
struct Partition {
  std::vector<int> layers_per_stage;  // per (virtual) stage of the schedule
  std::string description;            // for the log and the assignment
  std::vector<RankSchedule> schedules;  // per rank: the action list its Assignment ships
};
// Given every worker's registration (profiles included); an error stops the job with its message.
using PartitionFn = std::function<absl::StatusOr<Partition>(const std::vector<WorkerState>&)>;

class CoordinatorState {
 public:
  // `now` is the clock for heartbeats and progress (absl::Now in production, a fake in tests).
  CoordinatorState(JobSpec job, std::string job_id, std::string secret,
                   std::function<absl::Time()> now = absl::Now);

  const JobSpec& job() const { return job_; }
  const std::string& job_id() const { return job_id_; }
  const std::string& secret() const { return secret_; }  // handed to spawned workers, never logged

  // GPT jobs: decides the stages when the last worker registers. Set before serving.
  void SetPartitioner(PartitionFn fn) { partition_fn_ = std::move(fn); }

  // UNAUTHENTICATED unless `presented` equals the job secret (compared in constant time).
  absl::Status CheckSecret(absl::string_view presented) const;

  // Records the worker, then waits until every slot has registered (or `deadline`) and returns its
  // Assignment. Rank = worker_index; a re-registration with a newer incarnation replaces the slot.
  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Time deadline);

  absl::Status KeyValueSet(const std::string& key, const std::string& value);
  absl::StatusOr<std::string> KeyValueGet(const std::string& key, absl::Time deadline);
  absl::Status Barrier(const std::string& barrier_id, int rank, absl::Time deadline);

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status ReportMilestone(const ReportMilestoneRequest& request);
  absl::Status ReportStep(const ReportStepRequest& request);
  absl::Status Finish(const FinishRequest& request);

  // Moves the job to stopping: waiters wake with CANCELLED, new registrations and writes fail with
  // FAILED_PRECONDITION, heartbeats answer stop=true with the reason. The first reason is kept.
  void Stop(const std::string& reason);
  bool stopping() const;
  std::optional<std::string> stop_reason() const;  // the first reason given to Stop()

  // Snapshots for the supervisor and the reports.
  std::vector<WorkerState> Workers() const;
  std::vector<ReportStepRequest> Steps() const;  // every step report, in arrival order
  std::optional<Partition> partition() const;  // once planned

 private:
  absl::Status CheckRank(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Register's steps: fill (or replace, or confirm) the slot; wait for the others; answer.
  absl::Status RecordRegistration(const RegisterRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AwaitAllRegistered(int rank, int64_t incarnation, absl::Time deadline)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Assignment BuildAssignment(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void StopLocked(const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Partitioned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

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
  std::optional<std::string> stop_reason_ ABSL_GUARDED_BY(mu_);
  std::optional<Partition> partition_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_H_
