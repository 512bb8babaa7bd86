// The coordinator's state machine (see coordinator.h). Every blocking call waits on mu_ with an
// absl::Condition, so any state change (a registration, a key, an arrival, Stop) wakes its waiters.
#include "launcher/coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"

namespace stagehand {
namespace {

// Indices whose flag is false, as "1, 3" (for messages that say who is missing).
std::string MissingIndices(const std::vector<bool>& present) {
  std::vector<int> missing;
  for (int i = 0; i < static_cast<int>(present.size()); ++i) {
    if (!present[i]) missing.push_back(i);
  }
  return absl::StrJoin(missing, ", ");
}

bool AllTrue(const std::vector<bool>& flags) {
  return std::all_of(flags.begin(), flags.end(), [](bool b) { return b; });
}

}  // namespace

CoordinatorState::CoordinatorState(JobSpec job, std::string job_id, std::string secret,
                                   std::function<absl::Time()> now)
    : job_(std::move(job)),
      job_id_(std::move(job_id)),
      secret_(std::move(secret)),
      now_(std::move(now)),
      workers_(std::max(job_.workers(), 0)) {}

absl::Status CoordinatorState::CheckSecret(absl::string_view presented) const {
  // Only the length may leak: the loop always runs over the whole secret.
  bool ok = presented.size() == secret_.size();
  unsigned char diff = 0;
  if (ok) {
    for (size_t i = 0; i < secret_.size(); ++i) {
      diff |= static_cast<unsigned char>(presented[i]) ^ static_cast<unsigned char>(secret_[i]);
    }
  }
  if (ok && diff == 0) return absl::OkStatus();
  return absl::UnauthenticatedError(
      "wrong job secret; the worker must read the secret the launcher handed it");
}

absl::Status CoordinatorState::CheckRank(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(workers_.size())) return absl::OkStatus();
  const int workers = static_cast<int>(workers_.size());
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range: job \"", job_id_,
                                                 "\" has ", workers, " workers (ranks 0 to ",
                                                 workers - 1, ")"));
}

absl::StatusOr<Assignment> CoordinatorState::Register(const RegisterRequest& request,
                                                      absl::Time deadline) {
  if (request.job_id() != job_id_) {
    return absl::InvalidArgumentError(absl::StrCat("worker belongs to job \"", request.job_id(),
                                                   "\" but this coordinator runs job \"", job_id_,
                                                   "\"; check the coordinator address"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(request.worker_index()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("worker_index: ", s.message()));
  }
  if (stop_reason_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job is stopping (", *stop_reason_, "); no new registrations"));
  }
  if (absl::Status s = RecordRegistration(request); !s.ok()) return s;
  if (absl::Status s = AwaitAllRegistered(request.worker_index(), request.incarnation(), deadline);
      !s.ok()) {
    return s;
  }
  return BuildAssignment(request.worker_index());
}

absl::Status CoordinatorState::RecordRegistration(const RegisterRequest& request) {
  WorkerState& slot = workers_[request.worker_index()];
  if (slot.registered) {
    if (request.incarnation() < slot.incarnation) {
      return absl::AbortedError(absl::StrCat("stale incarnation ", request.incarnation(),
                                             ", current ", slot.incarnation,
                                             ": this worker was replaced; exit"));
    }
    if (request.incarnation() == slot.incarnation) {
      if (request.pid() == slot.pid) return absl::OkStatus();  // a retry: wait again
      return absl::AlreadyExistsError(absl::StrCat(
          "worker index ", request.worker_index(), " incarnation ", request.incarnation(),
          " is already registered by pid ", slot.pid, " (this is pid ", request.pid(),
          "); a restarted worker must use a higher incarnation"));
    }
    LOG(INFO) << "worker " << request.worker_index() << " incarnation " << request.incarnation()
              << " (pid " << request.pid() << ") replaces incarnation " << slot.incarnation
              << " (pid " << slot.pid << ")";
  } else {
    ++registered_count_;
  }
  // A new incarnation is a fresh start: nothing of the old one's progress carries over.
  const absl::Time now = now_();
  slot = WorkerState();
  slot.registered = true;
  slot.incarnation = request.incarnation();
  slot.pid = request.pid();
  slot.host = request.host();
  slot.device = request.device();
  slot.profile = request.profile();
  slot.registered_at = now;
  slot.last_heartbeat = now;
  slot.last_progress = now;
  return absl::OkStatus();
}

absl::Status CoordinatorState::AwaitAllRegistered(int rank, int64_t incarnation,
                                                  absl::Time deadline) {
  const int workers = static_cast<int>(workers_.size());
  auto replaced = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return workers_[rank].incarnation != incarnation;
  };
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return registered_count_ == workers || stop_reason_.has_value() || replaced();
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (replaced()) {
    return absl::AbortedError(absl::StrCat("stale incarnation ", incarnation, ", current ",
                                           workers_[rank].incarnation,
                                           ": this worker was replaced; exit"));
  }
  if (stop_reason_) {
    return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
  }
  if (registered_count_ == workers) return Partitioned();
  std::vector<bool> registered;
  for (const WorkerState& w : workers_) registered.push_back(w.registered);
  return absl::DeadlineExceededError(absl::StrCat(
      registered_count_, " of ", workers, " workers registered before the deadline; missing worker "
      "indices ", MissingIndices(registered), " (see their logs: did they start and reach the "
      "coordinator?)"));
}

// The first worker to see the whole world plans the partition for all; a failure stops the job.
absl::Status CoordinatorState::Partitioned() {
  if (!partition_fn_ || partition_) return absl::OkStatus();
  if (stop_reason_) return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
  absl::StatusOr<Partition> p = partition_fn_(workers_);
  if (!p.ok()) {
    StopLocked(absl::StrCat("cannot partition the model: ", p.status().message()));
    return absl::Status(p.status().code(), *stop_reason_);
  }
  LOG(INFO) << "partition: " << p->description;
  partition_ = *std::move(p);
  return absl::OkStatus();
}

Assignment CoordinatorState::BuildAssignment(int rank) const {
  const int workers = static_cast<int>(workers_.size());
  Assignment a;
  a.set_job_id(job_id_);
  a.set_rank(rank);
  a.set_world_size(workers);
  // One stage per worker until the planner lands and assigns stages from the cost profiles.
  a.set_stage(rank);
  a.set_num_stages(workers);
  for (int r = 0; r < workers; ++r) {
    Peer* peer = a.add_peers();
    peer->set_rank(r);
    peer->set_host(workers_[r].host);
    peer->set_pid(workers_[r].pid);
    *peer->mutable_device() = workers_[r].device;
  }
  *a.mutable_job() = job_;
  if (partition_) {
    int first = 0;
    for (int r = 0; r < rank; ++r) first += partition_->layers_per_stage[r];
    a.set_first_layer(first);
    a.set_last_layer(first + partition_->layers_per_stage[rank]);
    for (int n : partition_->layers_per_stage) a.add_layers_per_stage(n);
    a.set_plan(partition_->description);
    if (rank < static_cast<int>(partition_->schedules.size())) *a.mutable_schedule() = partition_->schedules[rank];
  }
  return a;
}

absl::Status CoordinatorState::KeyValueSet(const std::string& key, const std::string& value) {
  if (key.empty()) return absl::InvalidArgumentError("key-value set: the key is empty");
  absl::MutexLock lock(&mu_);
  if (stop_reason_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job is stopping (", *stop_reason_, "); key \"", key, "\" not written"));
  }
  auto [it, inserted] = kv_.emplace(key, value);
  if (inserted || it->second == value) return absl::OkStatus();
  // Values may be secrets (NCCL unique ids): never print them.
  return absl::AlreadyExistsError(
      absl::StrCat("key \"", key, "\" is already set to a different value; keys are write-once"));
}

absl::StatusOr<std::string> CoordinatorState::KeyValueGet(const std::string& key,
                                                          absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_reason_.has_value() || kv_.count(key) > 0;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (stop_reason_) {
    return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
  }
  auto it = kv_.find(key);
  if (it != kv_.end()) return it->second;
  return absl::DeadlineExceededError(
      absl::StrCat("key \"", key, "\" was not set before the deadline; did its writer fail?"));
}

absl::Status CoordinatorState::Barrier(const std::string& barrier_id, int rank,
                                       absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  std::vector<bool>& arrived = barriers_[barrier_id];
  if (arrived.empty()) arrived.assign(workers_.size(), false);
  if (AllTrue(arrived)) return absl::OkStatus();  // completed before: a retry passes at once
  arrived[rank] = true;
  // `arrived` stays valid: std::map never moves its elements and barriers are never erased.
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_reason_.has_value() || AllTrue(arrived);
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
  if (stop_reason_) {
    return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
  }
  if (AllTrue(arrived)) return absl::OkStatus();
  const int count = static_cast<int>(std::count(arrived.begin(), arrived.end(), true));
  return absl::DeadlineExceededError(absl::StrCat(
      "barrier \"", barrier_id, "\": ", count, " of ", arrived.size(),
      " ranks arrived before the deadline; missing ranks ", MissingIndices(arrived),
      " (the barrier stays open for them)"));
}

absl::StatusOr<HeartbeatResponse> CoordinatorState::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(request.rank()); !s.ok()) return s;
  WorkerState& slot = workers_[request.rank()];
  if (request.incarnation() < slot.incarnation) {
    return absl::AbortedError(absl::StrCat("stale incarnation ", request.incarnation(),
                                           ", current ", slot.incarnation,
                                           ": this worker was replaced; exit"));
  }
  const absl::Time now = now_();
  slot.last_heartbeat = now;
  if (request.steps_done() > slot.steps_done) {
    slot.steps_done = request.steps_done();
    slot.last_progress = now;
  }
  HeartbeatResponse response;
  response.set_stop(stop_reason_.has_value());
  if (stop_reason_) response.set_stop_reason(*stop_reason_);
  return response;
}

absl::Status CoordinatorState::ReportMilestone(const ReportMilestoneRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(request.rank()); !s.ok()) return s;
  const int milestone = request.milestone();
  if (!Milestone_IsValid(milestone) || milestone == MILESTONE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown milestone ", milestone, " from rank ", request.rank(),
                     "; is the worker built from a newer protos/coordinator.proto?"));
  }
  WorkerState& slot = workers_[request.rank()];
  slot.milestones[milestone] = absl::FromUnixMicros(request.unix_micros());
  slot.last_heartbeat = now_();  // a report is a sign of life too
  return absl::OkStatus();
}

absl::Status CoordinatorState::ReportStep(const ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(request.rank()); !s.ok()) return s;
  steps_.push_back(request);
  WorkerState& slot = workers_[request.rank()];
  if (request.step() + 1 > slot.steps_done) {
    slot.steps_done = request.step() + 1;
    slot.last_progress = now_();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::Finish(const FinishRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckRank(request.rank()); !s.ok()) return s;
  WorkerState& slot = workers_[request.rank()];
  slot.finished = true;
  slot.ok = request.ok();
  slot.error = request.error();
  slot.failed_before_stop = !request.ok() && !stop_reason_;
  slot.steps_done = std::max(slot.steps_done, request.steps_done());
  // The first failure names the root cause; later ones are usually its consequences.
  if (!request.ok() && !stop_reason_) {
    StopLocked(absl::StrCat("rank ", request.rank(), " (host ", slot.host, ", pid ", slot.pid, ") failed after ",
                            slot.steps_done, " steps: ", request.error()));
  }
  return absl::OkStatus();
}

void CoordinatorState::Stop(const std::string& reason) {
  absl::MutexLock lock(&mu_);
  StopLocked(reason);
}

void CoordinatorState::StopLocked(const std::string& reason) {
  if (stop_reason_) return;  // the first reason is the root cause
  LOG(INFO) << "stopping job " << job_id_ << ": " << reason;
  stop_reason_ = reason;  // waiters' conditions see it when mu_ is released
}

bool CoordinatorState::stopping() const {
  absl::ReaderMutexLock lock(&mu_);
  return stop_reason_.has_value();
}

std::optional<std::string> CoordinatorState::stop_reason() const {
  absl::MutexLock lock(&mu_);
  return stop_reason_;
}

std::vector<WorkerState> CoordinatorState::Workers() const {
  absl::ReaderMutexLock lock(&mu_);
  return workers_;
}

std::vector<ReportStepRequest> CoordinatorState::Steps() const {
  absl::ReaderMutexLock lock(&mu_);
  return steps_;
}

}  // namespace stagehand

namespace stagehand {

std::optional<Partition> CoordinatorState::partition() const {
  absl::MutexLock lock(&mu_);
  return partition_;
}

}  // namespace stagehand
