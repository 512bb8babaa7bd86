// The coordinator's state machine (see coordinator.h). A wait is a poll function kept in waits_:
// every change that may end a wait (a registration, a key, a barrier arrival, Stop, Shutdown) polls
// them all under mu_, and the completions run after mu_ is released. One timer thread polls them
// when the earliest deadline passes. Polling every wait on each change is O(waits), and a job has a
// few per worker; that buys one mechanism for all kinds of wait instead of one per kind.
#include "launcher/coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
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

// The completion that hands `result` to `done`, or none while there is no result yet.
template <typename T>
std::function<void()> Complete(const std::function<void(T)>& done, std::optional<T> result) {
  if (!result) return nullptr;
  return [done, r = *std::move(result)]() mutable { done(std::move(r)); };
}

// Runs an asynchronous call and waits for its completion: the blocking forms of the waits.
template <typename T, typename Start>
T AwaitResult(Start start) {
  absl::Notification finished;
  std::optional<T> result;
  start([&](T r) {
    result = std::move(r);
    finished.Notify();
  });
  finished.WaitForNotification();
  return *std::move(result);
}

absl::Status ShuttingDown() {
  return absl::UnavailableError("the coordinator is shutting down: the job is over");
}

}  // namespace

CoordinatorState::CoordinatorState(JobSpec job, std::string job_id, std::string secret,
                                   std::function<absl::Time()> now)
    : job_(std::move(job)),
      job_id_(std::move(job_id)),
      secret_(std::move(secret)),
      now_(std::move(now)),
      workers_(std::max(job_.workers(), 0)),
      timer_([this] { TimerLoop(); }) {}

CoordinatorState::~CoordinatorState() {
  Shutdown();
  {
    absl::MutexLock lock(&mu_);
    timer_exit_ = true;
  }
  timer_.join();
}

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

absl::Status CoordinatorState::CheckCaller(int rank, int64_t incarnation) const {
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  if (!workers_[rank].registered) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank, " has not registered; Register first"));
  }
  if (incarnation < workers_[rank].incarnation) return StaleError(rank, incarnation);
  // A newer incarnation than the registered one has not registered: it may not speak for the slot
  // (refresh its heartbeat, record steps, or fail the job) before it does.
  if (incarnation > workers_[rank].incarnation) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " incarnation ", incarnation,
                                                      " has not registered (incarnation ",
                                                      workers_[rank].incarnation, " has); Register first"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::StaleError(int rank, int64_t incarnation) const {
  return absl::AbortedError(absl::StrCat("stale incarnation ", incarnation, ", current ",
                                         workers_[rank].incarnation,
                                         ": this worker was replaced; exit"));
}

absl::Status CoordinatorState::StoppingError() const {
  return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
}

void CoordinatorState::AddWaitLocked(Wait wait, Completions& done) {
  if (Completion c = wait.poll(absl::Now() >= wait.deadline)) {
    done.Add(std::move(c));
    return;
  }
  waits_.push_back(std::move(wait));
  ++waits_added_;
}

void CoordinatorState::PollWaitsLocked(Completions& done) {
  for (bool ended = true; ended;) {
    ended = false;
    const absl::Time now = absl::Now();
    for (auto it = waits_.begin(); it != waits_.end();) {
      if (Completion c = it->poll(now >= it->deadline)) {
        done.Add(std::move(c));
        it = waits_.erase(it);
        ended = true;
      } else {
        ++it;
      }
    }
  }
}

void CoordinatorState::TimerLoop() {
  for (;;) {
    Completions expired;  // before the lock: runs once it is released
    absl::MutexLock lock(&mu_);
    absl::Time next = absl::InfiniteFuture();
    for (const Wait& w : waits_) next = std::min(next, w.deadline);
    const int64_t added = waits_added_;
    // A new wait may have an earlier deadline than `next`: it wakes the timer to look again.
    auto woken = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return timer_exit_ || waits_added_ != added;
    };
    mu_.AwaitWithDeadline(absl::Condition(&woken), next);
    if (timer_exit_) return;
    PollWaitsLocked(expired);
  }
}

void CoordinatorState::RegisterAsync(const RegisterRequest& request, absl::Time deadline,
                                     AssignmentCallback done) {
  if (request.job_id() != job_id_) {
    done(absl::InvalidArgumentError(absl::StrCat("worker belongs to job \"", request.job_id(),
                                                 "\" but this coordinator runs job \"", job_id_,
                                                 "\"; check the coordinator address")));
    return;
  }
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  absl::Status s = CheckRank(request.worker_index());
  if (!s.ok()) s = absl::InvalidArgumentError(absl::StrCat("worker_index: ", s.message()));
  if (s.ok() && stop_reason_) {
    s = absl::FailedPreconditionError(
        absl::StrCat("the job is stopping (", *stop_reason_, "); no new registrations"));
  }
  if (s.ok() && shut_down_) s = ShuttingDown();
  if (s.ok()) s = RecordRegistration(request);
  if (!s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  const int rank = request.worker_index();
  const int64_t incarnation = request.incarnation();
  AddWaitLocked({deadline,
                 [this, rank, incarnation, done](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                   return Complete(done, RegistrationResult(rank, incarnation, expired));
                 }},
                completions);
  PollWaitsLocked(completions);  // this registration may be the last, or replace a waiting one
}

absl::StatusOr<Assignment> CoordinatorState::Register(const RegisterRequest& request,
                                                      absl::Time deadline) {
  return AwaitResult<absl::StatusOr<Assignment>>(
      [&](AssignmentCallback done) { RegisterAsync(request, deadline, std::move(done)); });
}

absl::Status CoordinatorState::RecordRegistration(const RegisterRequest& request) {
  WorkerState& slot = workers_[request.worker_index()];
  if (slot.registered) {
    if (request.incarnation() < slot.incarnation) {
      return StaleError(request.worker_index(), request.incarnation());
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

std::optional<absl::StatusOr<Assignment>> CoordinatorState::RegistrationResult(
    int rank, int64_t incarnation, bool expired) {
  const int workers = static_cast<int>(workers_.size());
  if (workers_[rank].incarnation != incarnation) return StaleError(rank, incarnation);
  if (stop_reason_) return StoppingError();
  if (registered_count_ == workers) {
    if (absl::Status s = Partitioned(); !s.ok()) return s;
    return BuildAssignment(rank);
  }
  if (shut_down_) return ShuttingDown();
  if (!expired) return std::nullopt;
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
  if (stop_reason_) return StoppingError();
  absl::StatusOr<Partition> p = partition_fn_(workers_);
  if (!p.ok()) {
    StopLocked(absl::StrCat("cannot partition the model: ", p.status().message()),
               "the coordinator");
    return absl::Status(p.status().code(), *stop_reason_);
  }
  LOG(INFO) << "partition: " << p->description;
  partition_ = *std::move(p);
  return absl::OkStatus();
}

namespace {
// Data parallelism: the ranks holding this rank's stages, named by their first member.
void AddReplicaGroup(const Partition& partition, int rank, Assignment& a) {
  if (rank >= static_cast<int>(partition.replica_groups.size())) return;
  const std::vector<int>& group = partition.replica_groups[rank];
  for (int r : group) a.add_replica_group(r);
  if (!group.empty()) a.set_replica_group_color(group[0]);
}
}  // namespace

Assignment CoordinatorState::BuildAssignment(int rank) const {
  const int workers = static_cast<int>(workers_.size());
  Assignment a;
  a.set_job_id(job_id_);
  a.set_rank(rank);
  a.set_world_size(workers);
  a.set_stage(rank);  // a job without a partition ("allreduce"): one rank, one stage
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
    // The rank's stages come from its schedule (several when interleaved); stage and layers name the
    // first of them, layers_per_stage and the schedule say the rest.
    const std::vector<int>& counts = partition_->layers_per_stage;
    int stage = rank;
    if (rank < static_cast<int>(partition_->schedules.size())) {
      const RankSchedule& schedule = partition_->schedules[rank];
      *a.mutable_schedule() = schedule;
      for (int s = 0; s < schedule.stage_rank_size(); ++s) {
        if (schedule.stage_rank(s) == rank) {
          stage = s;
          break;
        }
      }
    }
    int first = 0;
    for (int s = 0; s < stage && s < static_cast<int>(counts.size()); ++s) first += counts[s];
    a.set_stage(stage);
    a.set_num_stages(static_cast<int>(counts.size()));
    a.set_first_layer(first);
    a.set_last_layer(stage < static_cast<int>(counts.size()) ? first + counts[stage] : first);
    for (int n : counts) a.add_layers_per_stage(n);
    a.set_plan(partition_->description);
    AddReplicaGroup(*partition_, rank, a);
  }
  return a;
}

absl::Status CoordinatorState::KeyValueSet(int rank, int64_t incarnation, const std::string& key,
                                           const std::string& value) {
  if (key.empty()) return absl::InvalidArgumentError("key-value set: the key is empty");
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(rank, incarnation); !s.ok()) return s;
  if (stop_reason_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the job is stopping (", *stop_reason_, "); key \"", key, "\" not written"));
  }
  auto [it, inserted] = kv_.emplace(key, value);
  if (inserted) {
    PollWaitsLocked(completions);
    return absl::OkStatus();
  }
  if (it->second == value) return absl::OkStatus();
  // Values may be secrets (NCCL unique ids): never print them.
  return absl::AlreadyExistsError(
      absl::StrCat("key \"", key, "\" is already set to a different value; keys are write-once"));
}

void CoordinatorState::KeyValueGetAsync(const std::string& key, absl::Time deadline,
                                        ValueCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  auto poll = [this, key](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      -> std::optional<absl::StatusOr<std::string>> {
    if (stop_reason_) return StoppingError();
    if (auto it = kv_.find(key); it != kv_.end()) return it->second;
    if (shut_down_) return ShuttingDown();
    if (!expired) return std::nullopt;
    return absl::DeadlineExceededError(
        absl::StrCat("key \"", key, "\" was not set before the deadline; did its writer fail?"));
  };
  AddWaitLocked({deadline, [poll, done](bool expired) { return Complete(done, poll(expired)); }},
                completions);
}

absl::StatusOr<std::string> CoordinatorState::KeyValueGet(const std::string& key,
                                                          absl::Time deadline) {
  return AwaitResult<absl::StatusOr<std::string>>(
      [&](ValueCallback done) { KeyValueGetAsync(key, deadline, std::move(done)); });
}

void CoordinatorState::BarrierAsync(const std::string& barrier_id, int rank, int64_t incarnation,
                                    absl::Time deadline, StatusCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(rank, incarnation); !s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  std::vector<bool>& arrived = barriers_[barrier_id];
  if (arrived.empty()) arrived.assign(workers_.size(), false);
  arrived[rank] = true;
  AddWaitLocked(
      {deadline,
       [this, barrier_id, rank, incarnation, done](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
         return Complete(done, BarrierResult(barrier_id, rank, incarnation, expired));
       }},
      completions);
  PollWaitsLocked(completions);  // this arrival may be the last
}

absl::Status CoordinatorState::Barrier(const std::string& barrier_id, int rank,
                                       int64_t incarnation, absl::Time deadline) {
  return AwaitResult<absl::Status>([&](StatusCallback done) {
    BarrierAsync(barrier_id, rank, incarnation, deadline, std::move(done));
  });
}

std::optional<absl::Status> CoordinatorState::BarrierResult(const std::string& barrier_id,
                                                            int rank, int64_t incarnation,
                                                            bool expired) {
  if (workers_[rank].incarnation > incarnation) return StaleError(rank, incarnation);
  // Barriers are never erased, and a completed one stays complete: a retry passes at once.
  const std::vector<bool>& arrived = barriers_.at(barrier_id);
  if (AllTrue(arrived)) return absl::OkStatus();
  if (stop_reason_) return StoppingError();
  if (shut_down_) return ShuttingDown();
  if (!expired) return std::nullopt;
  const int count = static_cast<int>(std::count(arrived.begin(), arrived.end(), true));
  return absl::DeadlineExceededError(absl::StrCat(
      "barrier \"", barrier_id, "\": ", count, " of ", arrived.size(),
      " ranks arrived before the deadline; missing ranks ", MissingIndices(arrived),
      " (the barrier stays open for them)"));
}

void CoordinatorState::WaitForStopAsync(int rank, int64_t incarnation, absl::Time deadline,
                                        StopCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(rank, incarnation); !s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  auto poll = [this, rank, incarnation](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_)
      -> std::optional<absl::StatusOr<WaitForStopResponse>> {
    // A replaced worker must exit rather than act on the stop of a job it is no longer part of.
    if (workers_[rank].incarnation > incarnation) return StaleError(rank, incarnation);
    if (stop_reason_) {
      WaitForStopResponse response;
      response.set_reason(*stop_reason_);
      response.set_origin(stop_origin_);
      return response;
    }
    if (shut_down_) return ShuttingDown();
    if (!expired) return std::nullopt;
    return absl::DeadlineExceededError(
        "the job did not stop before this call's deadline; call WaitForStop again");
  };
  AddWaitLocked({deadline, [poll, done](bool expired) { return Complete(done, poll(expired)); }},
                completions);
}

absl::StatusOr<HeartbeatResponse> CoordinatorState::Heartbeat(const HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(request.rank(), request.incarnation()); !s.ok()) return s;
  WorkerState& slot = workers_[request.rank()];
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
  const int milestone = request.milestone();
  if (!Milestone_IsValid(milestone) || milestone == MILESTONE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown milestone ", milestone, " from rank ", request.rank(),
                     "; is the worker built from a newer protos/coordinator.proto?"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(request.rank(), request.incarnation()); !s.ok()) return s;
  WorkerState& slot = workers_[request.rank()];
  slot.milestones[milestone] = absl::FromUnixMicros(request.unix_micros());
  slot.last_heartbeat = now_();  // a report is a sign of life too
  return absl::OkStatus();
}

absl::Status CoordinatorState::ReportStep(const ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(request.rank(), request.incarnation()); !s.ok()) return s;
  // A retried report (the first answer was lost) must not count the step twice.
  if (!step_keys_.emplace(request.rank(), request.incarnation(), request.step()).second) {
    return absl::OkStatus();
  }
  steps_.push_back(request);
  WorkerState& slot = workers_[request.rank()];
  if (request.step() + 1 > slot.steps_done) {
    slot.steps_done = request.step() + 1;
    slot.last_progress = now_();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::Finish(const FinishRequest& request) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(request.rank(), request.incarnation()); !s.ok()) return s;
  WorkerState& slot = workers_[request.rank()];
  slot.finished = true;
  slot.ok = request.ok();
  slot.error = request.error();
  slot.failed_action = request.failed_action() - 1;
  slot.failed_before_stop = !request.ok() && !stop_reason_;
  slot.steps_done = std::max(slot.steps_done, request.steps_done());
  // The first failure names the root cause; later ones are usually its consequences.
  if (!request.ok() && !stop_reason_) {
    const std::string origin =
        absl::StrCat("rank ", request.rank(), " (host ", slot.host, ", pid ", slot.pid, ")");
    StopLocked(absl::StrCat(origin, " failed after ", slot.steps_done, " steps: ", request.error()),
               origin);
    PollWaitsLocked(completions);
  }
  return absl::OkStatus();
}

void CoordinatorState::Stop(const std::string& reason, const std::string& origin) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  StopLocked(reason, origin);
  PollWaitsLocked(completions);
}

void CoordinatorState::StopLocked(const std::string& reason, const std::string& origin) {
  if (stop_reason_) return;  // the first reason is the root cause
  LOG(INFO) << "stopping job " << job_id_ << ": " << reason << " (from " << origin << ")";
  stop_reason_ = reason;  // the caller polls the waits, which see it
  stop_origin_ = origin;
}

void CoordinatorState::Shutdown() {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  PollWaitsLocked(completions);
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

std::vector<ReportStepRequest> CoordinatorState::StepsSince(size_t from) const {
  absl::ReaderMutexLock lock(&mu_);
  if (from >= steps_.size()) return {};
  return std::vector<ReportStepRequest>(steps_.begin() + from, steps_.end());
}

std::vector<ReportStepRequest> CoordinatorState::Steps() const {
  absl::ReaderMutexLock lock(&mu_);
  return steps_;
}

bool CoordinatorState::AwaitPendingWaits(int count, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return static_cast<int>(waits_.size()) >= count;
  };
  return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
}

std::optional<Partition> CoordinatorState::partition() const {
  absl::MutexLock lock(&mu_);
  return partition_;
}

}  // namespace stagehand
