// Unit tests of CoordinatorState: every documented status code, and the blocking calls (Register,
// KeyValueGet, Barrier) driven from threads. A fake clock stands for heartbeats and progress.
#include "launcher/coordinator.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJobId[] = "job-1";
constexpr char kSecret[] = "s3cret-token";

// Long enough never to pass in a passing test; short enough that a bug fails rather than hangs.
absl::Time LongDeadline() { return absl::Now() + absl::Seconds(10); }
absl::Time ShortDeadline() { return absl::Now() + absl::Milliseconds(50); }

// A waiter that times out and then finds the state changed returns the same code as one that was
// woken; the time it took tells them apart.
void ExpectWokenBeforeDeadline(absl::Time start) {
  EXPECT_LT(absl::Now() - start, absl::Seconds(5))
      << "the waiter was not woken: it hit its deadline";
}

JobSpec MakeJob(int workers) {
  JobSpec job;
  job.set_name("test");
  job.set_device(DEVICE_KIND_CPU);
  job.set_workers(workers);
  job.set_steps(10);
  return job;
}

RegisterRequest MakeRegister(int index, int64_t incarnation = 1, int pid = 0) {
  RegisterRequest r;
  r.set_job_id(kJobId);
  r.set_worker_index(index);
  r.set_incarnation(incarnation);
  r.set_pid(pid != 0 ? pid : 1000 + index);
  r.set_host("host-" + std::to_string(index));
  r.mutable_device()->set_kind(DEVICE_KIND_CPU);
  r.mutable_device()->set_ordinal(0);
  r.mutable_device()->set_name("cpu-" + std::to_string(index));
  return r;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  // The coordinator reads the clock while it holds its lock, in Register just before it waits:
  // on_now lets a test learn that a registration was recorded (and the caller is about to wait).
  std::unique_ptr<CoordinatorState> MakeState(int workers) {
    return std::make_unique<CoordinatorState>(MakeJob(workers), kJobId, kSecret, [this] {
      if (on_now_) on_now_();
      return now_;
    });
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  std::function<void()> on_now_;
};

// Registers every index, each from its own thread; returns their results (by index).
std::vector<absl::StatusOr<Assignment>> RegisterAll(CoordinatorState& state, int workers) {
  std::vector<absl::StatusOr<Assignment>> results(workers, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < workers; ++i) {
    threads.emplace_back([&, i] { results[i] = state.Register(MakeRegister(i), LongDeadline()); });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

TEST_F(CoordinatorTest, CheckSecret_Correct_IsOk) {
  auto state = MakeState(1);
  EXPECT_TRUE(state->CheckSecret(kSecret).ok());
}

TEST_F(CoordinatorTest, CheckSecret_Wrong_IsUnauthenticatedWithoutTheSecret) {
  auto state = MakeState(1);
  for (const char* presented : {"s3cret-tokeX", "s3cret", "", "s3cret-token-and-more"}) {
    absl::Status s = state->CheckSecret(presented);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << presented;
    EXPECT_THAT(std::string(s.message()), HasSubstr("wrong job secret"));
    EXPECT_THAT(std::string(s.message()), Not(HasSubstr(kSecret)));
  }
}

TEST_F(CoordinatorTest, Register_OneWorker_ReturnsAssignmentAndRecordsSlot) {
  auto state = MakeState(1);
  absl::StatusOr<Assignment> a = state->Register(MakeRegister(0, 1, 4242), LongDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->job_id(), kJobId);
  EXPECT_EQ(a->rank(), 0);
  EXPECT_EQ(a->world_size(), 1);
  EXPECT_EQ(a->stage(), 0);
  EXPECT_EQ(a->num_stages(), 1);
  EXPECT_EQ(a->job().workers(), 1);
  EXPECT_EQ(a->job().name(), "test");
  ASSERT_EQ(a->peers_size(), 1);
  EXPECT_EQ(a->peers(0).pid(), 4242);
  EXPECT_EQ(a->peers(0).host(), "host-0");

  std::vector<WorkerState> workers = state->Workers();
  ASSERT_EQ(workers.size(), 1u);
  EXPECT_TRUE(workers[0].registered);
  EXPECT_EQ(workers[0].incarnation, 1);
  EXPECT_EQ(workers[0].pid, 4242);
  EXPECT_EQ(workers[0].device.name(), "cpu-0");
  EXPECT_EQ(workers[0].registered_at, now_);
  EXPECT_EQ(workers[0].last_heartbeat, now_);
  EXPECT_EQ(workers[0].last_progress, now_);
}

TEST_F(CoordinatorTest, Register_FourWorkersConcurrently_AllGetAssignmentsWithPeersInRankOrder) {
  auto state = MakeState(4);
  std::vector<absl::StatusOr<Assignment>> results = RegisterAll(*state, 4);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    const Assignment& a = *results[i];
    EXPECT_EQ(a.rank(), i);
    EXPECT_EQ(a.world_size(), 4);
    EXPECT_EQ(a.stage(), i);
    EXPECT_EQ(a.num_stages(), 4);
    ASSERT_EQ(a.peers_size(), 4);
    for (int r = 0; r < 4; ++r) {
      EXPECT_EQ(a.peers(r).rank(), r);
      EXPECT_EQ(a.peers(r).pid(), 1000 + r);
      EXPECT_EQ(a.peers(r).host(), "host-" + std::to_string(r));
      EXPECT_EQ(a.peers(r).device().name(), "cpu-" + std::to_string(r));
    }
  }
}

TEST_F(CoordinatorTest, Register_OtherJobId_IsInvalidArgumentNamingBoth) {
  auto state = MakeState(1);
  RegisterRequest r = MakeRegister(0);
  r.set_job_id("job-2");
  absl::Status s = state->Register(r, LongDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("job-2"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(kJobId));
}

TEST_F(CoordinatorTest, Register_IndexOutOfRange_IsInvalidArgument) {
  auto state = MakeState(2);
  for (int index : {-1, 2, 100}) {
    absl::Status s = state->Register(MakeRegister(index), LongDeadline()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << index;
  }
  EXPECT_FALSE(state->Workers()[0].registered);
}

TEST_F(CoordinatorTest, Register_WhileStopping_IsFailedPrecondition) {
  auto state = MakeState(1);
  state->Stop("operator cancelled");
  absl::Status s = state->Register(MakeRegister(0), LongDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("operator cancelled"));
}

TEST_F(CoordinatorTest, Register_StaleIncarnation_IsAborted) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->Register(MakeRegister(0, 3, 300), LongDeadline()).ok());
  absl::Status s = state->Register(MakeRegister(0, 2, 200), LongDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("stale incarnation 2, current 3"));
  EXPECT_EQ(state->Workers()[0].pid, 300);
}

TEST_F(CoordinatorTest, Register_SameIncarnationOtherPid_IsAlreadyExists) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->Register(MakeRegister(0, 1, 100), LongDeadline()).ok());
  absl::Status s = state->Register(MakeRegister(0, 1, 200), LongDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(state->Workers()[0].pid, 100);
}

TEST_F(CoordinatorTest, Register_SameIncarnationSamePid_IsIdempotentRetry) {
  auto state = MakeState(2);
  // Worker 1 never comes: both attempts of worker 0 time out, and the retry is not counted twice.
  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::Status s = state->Register(MakeRegister(0, 1, 100), ShortDeadline()).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << attempt;
    EXPECT_THAT(std::string(s.message()), HasSubstr("1 of 2")) << attempt;
  }
  absl::StatusOr<Assignment> a;
  std::thread retry([&] { a = state->Register(MakeRegister(0, 1, 100), LongDeadline()); });
  absl::Status other = state->Register(MakeRegister(1), LongDeadline()).status();
  retry.join();  // before any ASSERT: a joinable thread must not be destroyed
  ASSERT_TRUE(other.ok()) << other;
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->peers(0).pid(), 100);
}

TEST_F(CoordinatorTest, Register_Deadline_NamesMissingIndices) {
  auto state = MakeState(4);
  EXPECT_EQ(state->Register(MakeRegister(0), ShortDeadline()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::Status s = state->Register(MakeRegister(2), ShortDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 4"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing worker indices 1, 3"));
}

TEST_F(CoordinatorTest, Register_NewerIncarnation_ReplacesSlotAndAbortsTheWaitingOlder) {
  auto state = MakeState(2);
  absl::Notification old_recorded;
  std::atomic<int> clock_reads{0};
  on_now_ = [&] {
    if (clock_reads++ == 0) old_recorded.Notify();
  };
  const absl::Time start = absl::Now();
  absl::Status old_status;
  std::thread old_worker(
      [&] { old_status = state->Register(MakeRegister(0, 1, 100), LongDeadline()).status(); });
  old_recorded.WaitForNotification();
  // The old registration holds the lock until it waits, so this one finds it waiting.
  absl::StatusOr<Assignment> replacement;
  std::thread new_worker(
      [&] { replacement = state->Register(MakeRegister(0, 2, 200), LongDeadline()); });
  old_worker.join();
  ExpectWokenBeforeDeadline(start);
  EXPECT_EQ(old_status.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(old_status.message()), HasSubstr("stale incarnation 1, current 2"));

  absl::Status other = state->Register(MakeRegister(1), LongDeadline()).status();
  new_worker.join();
  ASSERT_TRUE(other.ok()) << other;
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ(replacement->peers(0).pid(), 200);
  EXPECT_EQ(state->Workers()[0].incarnation, 2);
}

TEST_F(CoordinatorTest, Register_StopWhileWaiting_IsCancelledWithReason) {
  auto state = MakeState(2);
  absl::Notification recorded;
  on_now_ = [&] {
    if (!recorded.HasBeenNotified()) recorded.Notify();
  };
  const absl::Time start = absl::Now();
  absl::Status s;
  std::thread worker([&] { s = state->Register(MakeRegister(0), LongDeadline()).status(); });
  recorded.WaitForNotification();
  state->Stop("launcher interrupted");
  worker.join();
  ExpectWokenBeforeDeadline(start);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(s.message()), HasSubstr("launcher interrupted"));
}

TEST_F(CoordinatorTest, KeyValueSet_EmptyKey_IsInvalidArgument) {
  auto state = MakeState(1);
  EXPECT_EQ(state->KeyValueSet("", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, KeyValueSet_WhileStopping_IsFailedPrecondition) {
  auto state = MakeState(1);
  state->Stop("done");
  EXPECT_EQ(state->KeyValueSet("k", "v").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, KeyValueSet_WriteOnce_SameValueOkDifferentValueAlreadyExists) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->KeyValueSet("nccl/id", "first-secret-bytes").ok());
  EXPECT_TRUE(state->KeyValueSet("nccl/id", "first-secret-bytes").ok());
  absl::Status s = state->KeyValueSet("nccl/id", "second-secret-bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/id"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("secret-bytes")));
  absl::StatusOr<std::string> v = state->KeyValueGet("nccl/id", ShortDeadline());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "first-secret-bytes");
}

TEST_F(CoordinatorTest, KeyValueGet_SetLater_WakesWaiterWithValue) {
  auto state = MakeState(2);
  absl::StatusOr<std::string> v;
  std::thread reader([&] { v = state->KeyValueGet("k", LongDeadline()); });
  absl::Status set = state->KeyValueSet("k", std::string("a\0b", 3));
  reader.join();
  ASSERT_TRUE(set.ok()) << set;
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string("a\0b", 3));
}

TEST_F(CoordinatorTest, KeyValueGet_NeverSet_IsDeadlineExceededNamingKey) {
  auto state = MakeState(1);
  absl::Status s = state->KeyValueGet("nccl/comm0", ShortDeadline()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/comm0"));
}

TEST_F(CoordinatorTest, KeyValueGet_Stop_WakesWaiterWithCancelled) {
  auto state = MakeState(1);
  const absl::Time start = absl::Now();
  absl::Status s;
  std::thread reader([&] { s = state->KeyValueGet("k", LongDeadline()).status(); });
  state->Stop("rank 1 failed: boom");
  reader.join();
  ExpectWokenBeforeDeadline(start);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 failed: boom"));
}

TEST_F(CoordinatorTest, Barrier_AllRanksArrive_AllOk) {
  auto state = MakeState(4);
  std::vector<absl::Status> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { results[r] = state->Barrier("init", r, LongDeadline()); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

TEST_F(CoordinatorTest, Barrier_RankOutOfRange_IsInvalidArgument) {
  auto state = MakeState(2);
  EXPECT_EQ(state->Barrier("b", 2, ShortDeadline()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state->Barrier("b", -1, ShortDeadline()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, Barrier_Deadline_NamesMissingRanksAndStaysOpen) {
  auto state = MakeState(3);
  absl::Status s = state->Barrier("b", 0, ShortDeadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing ranks 1, 2"));
  s = state->Barrier("b", 1, ShortDeadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing ranks 2"));
  // The late arrival completes it; the ones that timed out pass when they come back.
  EXPECT_TRUE(state->Barrier("b", 2, ShortDeadline()).ok());
  EXPECT_TRUE(state->Barrier("b", 0, ShortDeadline()).ok());
  EXPECT_TRUE(state->Barrier("b", 1, ShortDeadline()).ok());
  // Another id is another barrier.
  EXPECT_EQ(state->Barrier("c", 0, ShortDeadline()).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, Barrier_Stop_WakesWaiterWithCancelled) {
  auto state = MakeState(2);
  const absl::Time start = absl::Now();
  absl::Status s;
  std::thread waiter([&] { s = state->Barrier("b", 0, LongDeadline()); });
  state->Stop("stalled");
  waiter.join();
  ExpectWokenBeforeDeadline(start);
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(s.message()), HasSubstr("stalled"));
}

TEST_F(CoordinatorTest, Heartbeat_RankOutOfRange_IsInvalidArgument) {
  auto state = MakeState(1);
  HeartbeatRequest h;
  h.set_rank(1);
  EXPECT_EQ(state->Heartbeat(h).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, Heartbeat_StaleIncarnation_IsAborted) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->Register(MakeRegister(0, 3), LongDeadline()).ok());
  HeartbeatRequest h;
  h.set_rank(0);
  h.set_incarnation(2);
  EXPECT_EQ(state->Heartbeat(h).status().code(), absl::StatusCode::kAborted);
  h.set_incarnation(3);
  EXPECT_TRUE(state->Heartbeat(h).ok());
}

TEST_F(CoordinatorTest, Heartbeat_StepsGrow_UpdatesLastProgressOnlyThen) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->Register(MakeRegister(0), LongDeadline()).ok());
  const absl::Time registered = now_;
  HeartbeatRequest h;
  h.set_rank(0);
  h.set_incarnation(1);

  now_ += absl::Seconds(1);
  ASSERT_TRUE(state->Heartbeat(h).ok());  // steps_done 0: no progress
  WorkerState w = state->Workers()[0];
  EXPECT_EQ(w.last_heartbeat, now_);
  EXPECT_EQ(w.last_progress, registered);

  now_ += absl::Seconds(1);
  const absl::Time progressed = now_;
  h.set_steps_done(5);
  ASSERT_TRUE(state->Heartbeat(h).ok());
  w = state->Workers()[0];
  EXPECT_EQ(w.steps_done, 5);
  EXPECT_EQ(w.last_progress, progressed);

  now_ += absl::Seconds(1);
  h.set_steps_done(3);  // a counter never goes back
  ASSERT_TRUE(state->Heartbeat(h).ok());
  w = state->Workers()[0];
  EXPECT_EQ(w.steps_done, 5);
  EXPECT_EQ(w.last_heartbeat, now_);
  EXPECT_EQ(w.last_progress, progressed);
}

TEST_F(CoordinatorTest, Heartbeat_Stopping_AnswersStopWithReason) {
  auto state = MakeState(1);
  HeartbeatRequest h;
  absl::StatusOr<HeartbeatResponse> r = state->Heartbeat(h);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->stop());
  state->Stop("user pressed ctrl-c");
  r = state->Heartbeat(h);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stop());
  EXPECT_EQ(r->stop_reason(), "user pressed ctrl-c");
}

TEST_F(CoordinatorTest, ReportMilestone_Valid_StoresWorkerTimeAndCountsAsHeartbeat) {
  auto state = MakeState(1);
  ReportMilestoneRequest m;
  m.set_rank(0);
  m.set_milestone(MILESTONE_NCCL_READY);
  m.set_unix_micros(1234567);
  now_ += absl::Minutes(1);
  ASSERT_TRUE(state->ReportMilestone(m).ok());
  WorkerState w = state->Workers()[0];
  ASSERT_EQ(w.milestones.count(MILESTONE_NCCL_READY), 1u);
  EXPECT_EQ(w.milestones[MILESTONE_NCCL_READY], absl::FromUnixMicros(1234567));
  EXPECT_EQ(w.last_heartbeat, now_);
}

TEST_F(CoordinatorTest, ReportMilestone_UnspecifiedUnknownOrBadRank_IsInvalidArgument) {
  auto state = MakeState(1);
  ReportMilestoneRequest m;
  m.set_rank(0);
  m.set_milestone(MILESTONE_UNSPECIFIED);
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_milestone(static_cast<Milestone>(99));  // proto3 enums are open: a newer worker may send it
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_milestone(MILESTONE_CUDA_READY);
  m.set_rank(5);
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(state->Workers()[0].milestones.empty());
}

TEST_F(CoordinatorTest, ReportStep_Appends_AndAdvancesProgressWhenStepsGrow) {
  auto state = MakeState(2);
  ReportStepRequest r;
  r.set_rank(1);
  r.set_step(0);
  r.set_has_loss(true);
  r.set_loss(2.5);
  r.set_step_seconds(0.25);
  now_ += absl::Seconds(1);
  const absl::Time first = now_;
  ASSERT_TRUE(state->ReportStep(r).ok());
  now_ += absl::Seconds(1);
  ASSERT_TRUE(state->ReportStep(r).ok());  // the same step again: no progress
  r.set_rank(0);
  r.set_step(4);
  r.set_has_loss(false);
  ASSERT_TRUE(state->ReportStep(r).ok());

  std::vector<ReportStepRequest> steps = state->Steps();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].rank(), 1);
  EXPECT_EQ(steps[0].step(), 0);
  EXPECT_TRUE(steps[0].has_loss());
  EXPECT_DOUBLE_EQ(steps[0].loss(), 2.5);
  EXPECT_DOUBLE_EQ(steps[0].step_seconds(), 0.25);
  EXPECT_EQ(steps[2].rank(), 0);
  EXPECT_FALSE(steps[2].has_loss());

  std::vector<WorkerState> workers = state->Workers();
  EXPECT_EQ(workers[1].steps_done, 1);
  EXPECT_EQ(workers[1].last_progress, first);
  EXPECT_EQ(workers[0].steps_done, 5);
  EXPECT_EQ(workers[0].last_progress, now_);
}

TEST_F(CoordinatorTest, ReportStep_RankOutOfRange_IsInvalidArgument) {
  auto state = MakeState(1);
  ReportStepRequest r;
  r.set_rank(-1);
  EXPECT_EQ(state->ReportStep(r).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(state->Steps().empty());
}

TEST_F(CoordinatorTest, Finish_Ok_RecordsWithoutStopping) {
  auto state = MakeState(2);
  FinishRequest f;
  f.set_rank(1);
  f.set_ok(true);
  f.set_steps_done(10);
  ASSERT_TRUE(state->Finish(f).ok());
  EXPECT_FALSE(state->stopping());
  WorkerState w = state->Workers()[1];
  EXPECT_TRUE(w.finished);
  EXPECT_TRUE(w.ok);
  EXPECT_EQ(w.steps_done, 10);
}

TEST_F(CoordinatorTest, Finish_StepsDoneLowerThanReported_KeepsTheMax) {
  auto state = MakeState(1);
  HeartbeatRequest h;
  h.set_steps_done(7);
  ASSERT_TRUE(state->Heartbeat(h).ok());
  FinishRequest f;
  f.set_ok(true);
  f.set_steps_done(3);
  ASSERT_TRUE(state->Finish(f).ok());
  EXPECT_EQ(state->Workers()[0].steps_done, 7);
}

TEST_F(CoordinatorTest, Finish_Failure_StopsJobNamingTheFirstFailedRank) {
  auto state = MakeState(3);
  FinishRequest f;
  f.set_rank(2);
  f.set_ok(false);
  f.set_error("CUDA out of memory");
  ASSERT_TRUE(state->Finish(f).ok());
  EXPECT_TRUE(state->stopping());
  f.set_rank(0);
  f.set_error("NCCL communicator aborted");  // a consequence, not the cause
  ASSERT_TRUE(state->Finish(f).ok());

  HeartbeatRequest h;
  absl::StatusOr<HeartbeatResponse> r = state->Heartbeat(h);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->stop());
  EXPECT_THAT(r->stop_reason(), HasSubstr("rank 2 ("));
  EXPECT_THAT(r->stop_reason(), HasSubstr("failed after"));
  EXPECT_THAT(r->stop_reason(), HasSubstr(": CUDA out of memory"));
  std::vector<WorkerState> workers = state->Workers();
  EXPECT_TRUE(workers[2].finished);
  EXPECT_FALSE(workers[2].ok);
  EXPECT_EQ(workers[2].error, "CUDA out of memory");
}

TEST_F(CoordinatorTest, Finish_RankOutOfRange_IsInvalidArgument) {
  auto state = MakeState(1);
  FinishRequest f;
  f.set_rank(1);
  f.set_ok(false);
  EXPECT_EQ(state->Finish(f).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(state->stopping());
}

TEST_F(CoordinatorTest, Stop_Twice_KeepsTheFirstReason) {
  auto state = MakeState(1);
  EXPECT_FALSE(state->stopping());
  state->Stop("first");
  state->Stop("second");
  EXPECT_TRUE(state->stopping());
  absl::StatusOr<HeartbeatResponse> r = state->Heartbeat(HeartbeatRequest());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stop_reason(), "first");
}

}  // namespace
}  // namespace stagehand
