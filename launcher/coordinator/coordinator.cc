// The coordinator's state machine (see coordinator.h). A wait is a poll function kept in waits_ and
// indexed by what can end it (its topic, its rank, its deadline): a change polls only the waits it
// may end, under mu_, and the completions run after mu_ is released. Stop and Shutdown poll them
// all. One timer thread polls those whose deadline passes. So 10,000 workers registering, reading
// keys and passing a barrier cost O(N log N) in the state, not the O(N^2) of polling every wait on
// every change (tools/coordinator_load measures it).
#include "launcher/coordinator/coordinator.h"

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

absl::Status ShuttingDown() { return absl::UnavailableError("the coordinator is shutting down: the job is over"); }

}  // namespace

CoordinatorState::CoordinatorState(JobSpec job, std::string job_id, std::string secret, std::function<absl::Time()> now)
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
    timer_cv_.Signal();
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
  return absl::UnauthenticatedError("wrong job secret; the worker must read the secret the launcher handed it");
}

absl::Status CoordinatorState::CheckRank(int rank) const {
  if (rank >= 0 && rank < static_cast<int>(workers_.size())) return absl::OkStatus();
  const int workers = static_cast<int>(workers_.size());
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " is out of range: job \"", job_id_, "\" has ", workers,
                                                 " workers (ranks 0 to ", workers - 1, ")"));
}

absl::Status CoordinatorState::CheckCaller(int rank, int64_t incarnation) const {
  if (absl::Status s = CheckRank(rank); !s.ok()) return s;
  if (!workers_[rank].registered) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has not registered; Register first"));
  }
  if (incarnation < workers_[rank].incarnation) return StaleError(rank, incarnation);
  // A newer incarnation than the registered one has not registered: it may not speak for the slot
  // (refresh its heartbeat, record steps, or fail the job) before it does.
  if (incarnation > workers_[rank].incarnation) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " incarnation ", incarnation,
                                                      " has not registered (incarnation ", workers_[rank].incarnation,
                                                      " has); Register first"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::StaleError(int rank, int64_t incarnation) const {
  return absl::AbortedError(absl::StrCat("stale incarnation ", incarnation, ", current ", workers_[rank].incarnation,
                                         ": this worker was replaced; exit"));
}

absl::Status CoordinatorState::StoppingError() const {
  return absl::CancelledError(absl::StrCat("the job is stopping: ", *stop_reason_));
}

void CoordinatorState::AddWaitLocked(Wait wait, Completions& done) {
  if (Completion c = wait.poll(absl::Now() >= wait.deadline)) {
    done.Add(std::move(c));
    if (stop_unpolled_) PollWaitsLocked(done);  // its poll stopped the job (a refusal, a partition)
    return;
  }
  const WaitId id = next_wait_id_++;
  if (!wait.topic.empty()) topic_waits_[wait.topic].insert(id);
  if (wait.rank >= 0) rank_waits_[wait.rank].insert(id);
  deadlines_.emplace(wait.deadline, id);
  if (wait.deadline < timer_next_) timer_cv_.Signal();  // the timer sleeps past this deadline
  waits_.emplace(id, std::move(wait));
}

void CoordinatorState::RemoveWaitLocked(std::map<WaitId, Wait>::iterator it) {
  const WaitId id = it->first;
  const Wait& w = it->second;
  if (!w.topic.empty()) {
    auto t = topic_waits_.find(w.topic);
    t->second.erase(id);
    if (t->second.empty()) topic_waits_.erase(t);
  }
  if (w.rank >= 0) {
    auto r = rank_waits_.find(w.rank);
    r->second.erase(id);
    if (r->second.empty()) rank_waits_.erase(r);
  }
  deadlines_.erase({w.deadline, id});
  waits_.erase(it);
}

int CoordinatorState::PollIdsLocked(const std::vector<WaitId>& ids, Completions& done) {
  int ended = 0;
  const absl::Time now = absl::Now();
  for (WaitId id : ids) {
    auto it = waits_.find(id);
    if (it == waits_.end()) continue;  // ended by an earlier one's poll
    if (Completion c = it->second.poll(now >= it->second.deadline)) {
      done.Add(std::move(c));
      RemoveWaitLocked(it);
      ++ended;
    }
  }
  return ended;
}

void CoordinatorState::PollWaitsLocked(Completions& done) {
  for (bool ended = true; ended || stop_unpolled_;) {
    stop_unpolled_ = false;
    std::vector<WaitId> all;
    all.reserve(waits_.size());
    for (const auto& [id, wait] : waits_) all.push_back(id);
    ended = PollIdsLocked(all, done) > 0;
  }
}

void CoordinatorState::PollSomeLocked(const std::vector<WaitId>& ids, Completions& done) {
  PollIdsLocked(ids, done);
  // A poll can stop the job (the admission refused, the partition failed): every wait must see it.
  if (stop_unpolled_) PollWaitsLocked(done);
}

void CoordinatorState::PollTopicLocked(const std::string& topic, Completions& done) {
  auto it = topic_waits_.find(topic);
  if (it == topic_waits_.end()) return;
  PollSomeLocked(std::vector<WaitId>(it->second.begin(), it->second.end()), done);
}

void CoordinatorState::PollRankLocked(int rank, Completions& done) {
  auto it = rank_waits_.find(rank);
  if (it == rank_waits_.end()) return;
  PollSomeLocked(std::vector<WaitId>(it->second.begin(), it->second.end()), done);
}

void CoordinatorState::TimerLoop() {
  for (;;) {
    Completions expired;  // before the lock: runs once it is released
    absl::MutexLock lock(&mu_);
    timer_next_ = deadlines_.empty() ? absl::InfiniteFuture() : deadlines_.begin()->first;
    // Woken early by a wait with an earlier deadline, by the exit, or spuriously: look again.
    if (!timer_exit_ && absl::Now() < timer_next_) timer_cv_.WaitWithDeadline(&mu_, timer_next_);
    if (timer_exit_) return;
    const absl::Time now = absl::Now();
    std::vector<WaitId> due;
    for (auto it = deadlines_.begin(); it != deadlines_.end() && it->first <= now; ++it) {
      due.push_back(it->second);
    }
    PollSomeLocked(due, expired);
  }
}

void CoordinatorState::RegisterAsync(const RegisterRequest& request, absl::Time deadline, AssignmentCallback done) {
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
    s = absl::FailedPreconditionError(absl::StrCat("the job is stopping (", *stop_reason_, "); no new registrations"));
  }
  if (s.ok() && shut_down_) s = ShuttingDown();
  if (s.ok()) s = RecordRegistration(request);
  if (!s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  const int rank = request.worker_index();
  const int64_t incarnation = request.incarnation();
  AddWaitLocked({deadline, kRegisteredTopic, rank,
                 [this, rank, incarnation, done](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                   return Complete(done, RegistrationResult(rank, incarnation, expired));
                 }},
                completions);
  PollRankLocked(rank, completions);  // this registration may replace a waiting one
  if (registered_count_ == static_cast<int>(workers_.size())) {
    PollTopicLocked(kRegisteredTopic, completions);  // or be the last
  }
}

absl::StatusOr<Assignment> CoordinatorState::Register(const RegisterRequest& request, absl::Time deadline) {
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
      return absl::AlreadyExistsError(absl::StrCat("worker index ", request.worker_index(), " incarnation ",
                                                   request.incarnation(), " is already registered by pid ", slot.pid,
                                                   " (this is pid ", request.pid(),
                                                   "); a restarted worker must use a higher incarnation"));
    }
    LOG(INFO) << "worker " << request.worker_index() << " incarnation " << request.incarnation() << " (pid "
              << request.pid() << ") replaces incarnation " << slot.incarnation << " (pid " << slot.pid << ")";
  } else {
    if (request.incarnation() < min_incarnation_) return StaleError(request.worker_index(), request.incarnation());
    ++registered_count_;
  }
  common_assignment_.reset();  // the peers changed
  // A new incarnation is a fresh start: nothing of the old one's progress carries over.
  const absl::Time now = now_();
  slot = WorkerState();
  slot.registered = true;
  slot.incarnation = request.incarnation();
  slot.pid = request.pid();
  slot.host = request.host();
  slot.device = request.device();
  slot.profile = request.profile();
  slot.health = request.health();
  slot.load_clock = request.load_clock();
  slot.registered_at = now;
  slot.last_heartbeat = now;
  slot.last_progress = now;
  return absl::OkStatus();
}

std::optional<absl::StatusOr<Assignment>> CoordinatorState::RegistrationResult(int rank, int64_t incarnation,
                                                                               bool expired) {
  const int workers = static_cast<int>(workers_.size());
  if (workers_[rank].incarnation != incarnation) return StaleError(rank, incarnation);
  if (stop_reason_) return StoppingError();
  if (registered_count_ == workers) {
    if (absl::Status s = Admitted(); !s.ok()) return s;
    if (absl::Status s = Partitioned(); !s.ok()) return s;
    Assignment a = BuildAssignment(rank);
    // Its heartbeats start once it has the assignment; until now it was waiting in this call, alive
    // (for the others' registrations and profiles, which the registration deadline bounds).
    workers_[rank].assigned = true;
    workers_[rank].last_heartbeat = now_();
    return a;
  }
  if (shut_down_) return ShuttingDown();
  if (!expired) return std::nullopt;
  std::vector<bool> registered;
  for (const WorkerState& w : workers_) registered.push_back(w.registered);
  return absl::DeadlineExceededError(absl::StrCat(registered_count_, " of ", workers,
                                                  " workers registered before the deadline; missing worker "
                                                  "indices ",
                                                  MissingIndices(registered),
                                                  " (see their logs: did they start and reach the "
                                                  "coordinator?)"));
}

// The first worker to see the whole world asks whether they may run, for all; a refusal stops the job.
absl::Status CoordinatorState::Admitted() {
  if (!admission_fn_ || admitted_) return absl::OkStatus();
  if (stop_reason_) return StoppingError();
  if (absl::Status s = admission_fn_(workers_); !s.ok()) {
    StopLocked(std::string(s.message()), "the coordinator");
    return absl::Status(s.code(), *stop_reason_);
  }
  admitted_ = true;
  return absl::OkStatus();
}

// The first worker to see the whole world plans the partition for all; a failure stops the job.
absl::Status CoordinatorState::Partitioned() {
  if (!partition_fn_ || partition_) return absl::OkStatus();
  if (stop_reason_) return StoppingError();
  absl::StatusOr<Partition> p = partition_fn_(workers_);
  if (!p.ok()) {
    StopLocked(absl::StrCat("cannot partition the model: ", p.status().message()), "the coordinator");
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

Assignment CoordinatorState::BuildAssignment(int rank) {
  const int workers = static_cast<int>(workers_.size());
  if (!common_assignment_) {
    Assignment& common = common_assignment_.emplace();
    common.set_job_id(job_id_);
    common.set_world_size(workers);
    if (workers <= kMaxListedPeers) {
      for (int r = 0; r < workers; ++r) {
        Peer* peer = common.add_peers();
        peer->set_rank(r);
        peer->set_host(workers_[r].host);
        peer->set_pid(workers_[r].pid);
        *peer->mutable_device() = workers_[r].device;
      }
    }
    *common.mutable_job() = job_;
  }
  Assignment a = *common_assignment_;
  a.set_rank(rank);
  a.set_stage(rank);  // a job without a partition ("allreduce"): one rank, one stage
  a.set_num_stages(workers);
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
    PollTopicLocked(absl::StrCat("k", key), completions);
    return absl::OkStatus();
  }
  if (it->second == value) return absl::OkStatus();
  // Values may be secrets (NCCL unique ids): never print them.
  return absl::AlreadyExistsError(
      absl::StrCat("key \"", key, "\" is already set to a different value; keys are write-once"));
}

void CoordinatorState::KeyValueGetAsync(const std::string& key, absl::Time deadline, ValueCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  auto poll = [this, key](bool expired)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<absl::StatusOr<std::string>> {
    if (stop_reason_) return StoppingError();
    if (auto it = kv_.find(key); it != kv_.end()) return it->second;
    if (shut_down_) return ShuttingDown();
    if (!expired) return std::nullopt;
    return absl::DeadlineExceededError(
        absl::StrCat("key \"", key, "\" was not set before the deadline; did its writer fail?"));
  };
  AddWaitLocked(
      {deadline, absl::StrCat("k", key), -1, [poll, done](bool expired) { return Complete(done, poll(expired)); }},
      completions);
}

absl::StatusOr<std::string> CoordinatorState::KeyValueGet(const std::string& key, absl::Time deadline) {
  return AwaitResult<absl::StatusOr<std::string>>(
      [&](ValueCallback done) { KeyValueGetAsync(key, deadline, std::move(done)); });
}

void CoordinatorState::BarrierAsync(const std::string& barrier_id, int rank, int64_t incarnation, absl::Time deadline,
                                    StatusCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(rank, incarnation); !s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  BarrierArrivals& b = barriers_[barrier_id];
  if (b.arrived.empty()) b.arrived.assign(workers_.size(), false);
  if (!b.arrived[rank]) {
    b.arrived[rank] = true;
    ++b.count;
  }
  const std::string topic = absl::StrCat("b", barrier_id);
  AddWaitLocked({deadline, topic, rank,
                 [this, barrier_id, rank, incarnation, done](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
                   return Complete(done, BarrierResult(barrier_id, rank, incarnation, expired));
                 }},
                completions);
  if (b.count == static_cast<int>(b.arrived.size())) PollTopicLocked(topic, completions);  // the last
}

absl::Status CoordinatorState::Barrier(const std::string& barrier_id, int rank, int64_t incarnation,
                                       absl::Time deadline) {
  return AwaitResult<absl::Status>(
      [&](StatusCallback done) { BarrierAsync(barrier_id, rank, incarnation, deadline, std::move(done)); });
}

std::optional<absl::Status> CoordinatorState::BarrierResult(const std::string& barrier_id, int rank,
                                                            int64_t incarnation, bool expired) {
  if (workers_[rank].incarnation > incarnation) return StaleError(rank, incarnation);
  // Barriers are never erased, and a completed one stays complete: a retry passes at once.
  const BarrierArrivals& b = barriers_.at(barrier_id);
  const std::vector<bool>& arrived = b.arrived;
  if (b.count == static_cast<int>(arrived.size())) return absl::OkStatus();
  if (stop_reason_) return StoppingError();
  if (shut_down_) return ShuttingDown();
  if (!expired) return std::nullopt;
  return absl::DeadlineExceededError(absl::StrCat("barrier \"", barrier_id, "\": ", b.count, " of ", arrived.size(),
                                                  " ranks arrived before the deadline; missing ranks ",
                                                  MissingIndices(arrived), " (the barrier stays open for them)"));
}

void CoordinatorState::WaitForStopAsync(int rank, int64_t incarnation, absl::Time deadline, StopCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckCaller(rank, incarnation); !s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  auto poll = [this, rank, incarnation](bool expired)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<absl::StatusOr<WaitForStopResponse>> {
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
    return absl::DeadlineExceededError("the job did not stop before this call's deadline; call WaitForStop again");
  };
  AddWaitLocked({deadline, "", rank, [poll, done](bool expired) { return Complete(done, poll(expired)); }},
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
    return absl::InvalidArgumentError(absl::StrCat("unknown milestone ", milestone, " from rank ", request.rank(),
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

void CoordinatorState::RecordProgramStep(const ReportStepRequest& request) {
  absl::MutexLock lock(&mu_);
  RecordProgramStepLocked(request);
}

void CoordinatorState::RecordProgramStepLocked(const ReportStepRequest& request) {
  if (request.rank() < 0 || request.rank() >= static_cast<int>(workers_.size())) return;
  if (!step_keys_.emplace(request.rank(), request.incarnation(), request.step()).second) return;
  steps_.push_back(request);
  // An attempt that was restarted since (an agent's backlog): kept in steps.csv, but no progress of
  // the running attempt, whose ranks' counts Restart() reset.
  if (request.incarnation() <= attempt_) return;
  WorkerState& slot = workers_[request.rank()];
  if (request.step() + 1 > slot.steps_done) slot.steps_done = request.step() + 1;
  slot.last_progress = now_();
  slot.milestones.emplace(MILESTONE_FIRST_STEP, slot.last_progress);  // when the launcher read it
}

int64_t CoordinatorState::RequestCheckpointAndStop() {
  absl::MutexLock lock(&mu_);
  if (checkpoint_and_stop_at_ > 0) return checkpoint_and_stop_at_;
  int64_t done = 0;
  for (const WorkerState& w : workers_) done = std::max(done, w.steps_done);
  checkpoint_and_stop_at_ = done + 1;
  return checkpoint_and_stop_at_;
}

int64_t CoordinatorState::checkpoint_and_stop_at() const {
  absl::MutexLock lock(&mu_);
  return checkpoint_and_stop_at_;
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
    const std::string origin = absl::StrCat("rank ", request.rank(), " (host ", slot.host, ", pid ", slot.pid, ")");
    StopLocked(absl::StrCat(origin, " failed after ", slot.steps_done, " steps: ", request.error()), origin);
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
  stop_unpolled_ = true;  // and so does a poll that stopped the job (PollSomeLocked, AddWaitLocked)
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
  auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return static_cast<int>(waits_.size()) >= count; };
  return mu_.AwaitWithDeadline(absl::Condition(&enough), deadline);
}

std::optional<Partition> CoordinatorState::partition() const {
  absl::MutexLock lock(&mu_);
  return partition_;
}

}  // namespace stagehand

namespace stagehand {

absl::Status CoordinatorState::Restart(const std::string& cause) {
  absl::MutexLock lock(&mu_);
  if (!stop_reason_) return absl::FailedPreconditionError("the job is running; stop it before restarting it");
  ++attempt_;
  restart_cause_ = cause.empty() ? *stop_reason_ : cause;
  remote_exits_.clear();
  for (WorkerState& w : workers_) {
    min_incarnation_ = std::max(min_incarnation_, w.incarnation + 1);
    WorkerState fresh;
    fresh.incarnation = w.incarnation;
    w = fresh;
  }
  registered_count_ = 0;
  kv_.clear();
  barriers_.clear();
  partition_.reset();
  stop_reason_.reset();
  stop_origin_.clear();
  return absl::OkStatus();
}

}  // namespace stagehand
