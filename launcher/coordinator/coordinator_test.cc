// Unit tests of CoordinatorState: every documented status code, the waits (Register, KeyValueGet,
// Barrier, WaitForStop) both as callbacks and blocking from threads, and the gRPC service over a
// real server on a free port. A fake clock stands for heartbeats and progress.
#include "launcher/coordinator/coordinator.h"

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "launcher/coordinator/coordinator_service.h"
#include "protos/coordinator.grpc.pb.h"

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
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the waiter was not woken: it hit its deadline";
}

JobSpec MakeJob(int workers) {
  JobSpec job;
  job.set_name("test");
  job.set_device("cpu");
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

// Registers every index at incarnation 1 (asynchronously: the last one completes them all).
void RegisterAllOk(CoordinatorState& state, int workers) {
  for (const absl::StatusOr<Assignment>& a : RegisterAll(state, workers)) {
    ASSERT_TRUE(a.ok()) << a.status();
  }
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

// Registers ranks [0, workers) through the callbacks (no thread each); returns their results once
// every callback ran.
std::vector<absl::StatusOr<Assignment>> RegisterAllAsync(CoordinatorState& state, int workers) {
  std::vector<absl::StatusOr<Assignment>> results(workers, absl::UnknownError("not run"));
  std::atomic<int> left{workers};
  absl::Notification all;
  for (int i = 0; i < workers; ++i) {
    state.RegisterAsync(MakeRegister(i), LongDeadline(), [&, i](absl::StatusOr<Assignment> a) {
      results[i] = std::move(a);
      if (left.fetch_sub(1) == 1) all.Notify();
    });
  }
  all.WaitForNotification();
  return results;
}

TEST_F(CoordinatorTest, Register_MoreWorkersThanListedPeers_AssignmentsHaveNoPeers) {
  const int workers = kMaxListedPeers + 1;
  auto state = MakeState(workers);
  std::vector<absl::StatusOr<Assignment>> results = RegisterAllAsync(*state, workers);
  for (int i = 0; i < workers; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->rank(), i);
    EXPECT_EQ(results[i]->world_size(), workers);
    EXPECT_EQ(results[i]->peers_size(), 0);
  }
}

TEST_F(CoordinatorTest, Register_ReplacementAfterAllRegistered_NewAssignmentListsItsPid) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  absl::StatusOr<Assignment> a = state->Register(MakeRegister(1, 2, 777), LongDeadline());
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ(a->peers_size(), 2);
  EXPECT_EQ(a->peers(1).pid(), 777);  // not the first world's cached peers
}

// 10,000 ranks register, each sets a key and waits for its neighbour's, and all pass a barrier,
// in-process: a poll of every wait on each change (O(N^2), about 10^8 polls) would take far longer
// than the bound, which is loose for a loaded machine (about 0.3 s idle).
TEST_F(CoordinatorTest, Rendezvous_TenThousandRanks_FinishesInSeconds) {
  const int workers = 10000;
  auto state = MakeState(workers);
  const absl::Time start = absl::Now();
  for (const absl::StatusOr<Assignment>& a : RegisterAllAsync(*state, workers)) ASSERT_TRUE(a.ok()) << a.status();
  std::atomic<int> left{2 * workers};
  std::atomic<int> failed{0};
  absl::Notification all;
  auto count = [&](bool ok) {
    if (!ok) failed.fetch_add(1);
    if (left.fetch_sub(1) == 1) all.Notify();
  };
  for (int r = 0; r < workers; ++r) {  // every read waits: the neighbour's key is set after it
    state->KeyValueGetAsync(absl::StrCat("addr/", (r + 1) % workers), LongDeadline(),
                            [&](absl::StatusOr<std::string> v) { count(v.ok()); });
  }
  for (int r = 0; r < workers; ++r) ASSERT_TRUE(state->KeyValueSet(r, 1, absl::StrCat("addr/", r), "x").ok());
  for (int r = 0; r < workers; ++r) {
    state->BarrierAsync("b", r, 1, LongDeadline(), [&](absl::Status s) { count(s.ok()); });
  }
  all.WaitForNotification();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
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
  EXPECT_EQ(state->Register(MakeRegister(0), ShortDeadline()).status().code(), absl::StatusCode::kDeadlineExceeded);
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
  std::thread old_worker([&] { old_status = state->Register(MakeRegister(0, 1, 100), LongDeadline()).status(); });
  old_recorded.WaitForNotification();
  // The old registration holds the lock until it waits, so this one finds it waiting.
  absl::StatusOr<Assignment> replacement;
  std::thread new_worker([&] { replacement = state->Register(MakeRegister(0, 2, 200), LongDeadline()); });
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
  RegisterAllOk(*state, 1);
  EXPECT_EQ(state->KeyValueSet(0, 1, "", "v").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, KeyValueSet_WhileStopping_IsFailedPrecondition) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  state->Stop("done");
  EXPECT_EQ(state->KeyValueSet(0, 1, "k", "v").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, KeyValueSet_WriteOnce_SameValueOkDifferentValueAlreadyExists) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  ASSERT_TRUE(state->KeyValueSet(0, 1, "nccl/id", "first-secret-bytes").ok());
  EXPECT_TRUE(state->KeyValueSet(0, 1, "nccl/id", "first-secret-bytes").ok());
  absl::Status s = state->KeyValueSet(0, 1, "nccl/id", "second-secret-bytes");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nccl/id"));
  EXPECT_THAT(std::string(s.message()), Not(HasSubstr("secret-bytes")));
  absl::StatusOr<std::string> v = state->KeyValueGet("nccl/id", ShortDeadline());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "first-secret-bytes");
}

TEST_F(CoordinatorTest, KeyValueGet_SetLater_WakesWaiterWithValue) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  absl::StatusOr<std::string> v;
  std::thread reader([&] { v = state->KeyValueGet("k", LongDeadline()); });
  absl::Status set = state->KeyValueSet(1, 1, "k", std::string("a\0b", 3));
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
  RegisterAllOk(*state, 4);
  std::vector<absl::Status> results(4, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&, r] { results[r] = state->Barrier("init", r, 1, LongDeadline()); });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(results[r].ok()) << r << ": " << results[r];
}

TEST_F(CoordinatorTest, Barrier_RankOutOfRange_IsInvalidArgument) {
  auto state = MakeState(2);
  EXPECT_EQ(state->Barrier("b", 2, 1, ShortDeadline()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state->Barrier("b", -1, 1, ShortDeadline()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, Barrier_Deadline_NamesMissingRanksAndStaysOpen) {
  auto state = MakeState(3);
  RegisterAllOk(*state, 3);
  absl::Status s = state->Barrier("b", 0, 1, ShortDeadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing ranks 1, 2"));
  s = state->Barrier("b", 1, 1, ShortDeadline());
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 of 3"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("missing ranks 2"));
  // The late arrival completes it; the ones that timed out pass when they come back.
  EXPECT_TRUE(state->Barrier("b", 2, 1, ShortDeadline()).ok());
  EXPECT_TRUE(state->Barrier("b", 0, 1, ShortDeadline()).ok());
  EXPECT_TRUE(state->Barrier("b", 1, 1, ShortDeadline()).ok());
  // Another id is another barrier.
  EXPECT_EQ(state->Barrier("c", 0, 1, ShortDeadline()).code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, Barrier_Stop_WakesWaiterWithCancelled) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  const absl::Time start = absl::Now();
  absl::Status s;
  std::thread waiter([&] { s = state->Barrier("b", 0, 1, LongDeadline()); });
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
  absl::Status s = state->Heartbeat(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("stale incarnation 2, current 3: this worker was replaced; exit"));
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
  RegisterAllOk(*state, 1);
  HeartbeatRequest h;
  h.set_incarnation(1);
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
  RegisterAllOk(*state, 1);
  ReportMilestoneRequest m;
  m.set_rank(0);
  m.set_incarnation(1);
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
  RegisterAllOk(*state, 1);
  ReportMilestoneRequest m;
  m.set_rank(0);
  m.set_incarnation(1);
  m.set_milestone(MILESTONE_UNSPECIFIED);
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_milestone(static_cast<Milestone>(99));  // proto3 enums are open: a newer worker may send it
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  m.set_milestone(MILESTONE_CUDA_READY);
  m.set_rank(5);
  EXPECT_EQ(state->ReportMilestone(m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(state->Workers()[0].milestones.empty());
}

// The SIGTERM checkpoint's step: past every rank's reported steps, so none has passed it unheard.
TEST_F(CoordinatorTest, RequestCheckpointAndStop_IsPastEveryRanksStepsAndStays) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  EXPECT_EQ(state->checkpoint_and_stop_at(), 0);
  ReportStepRequest r;
  r.set_rank(0);
  r.set_incarnation(1);
  r.set_step(6);  // rank 0 has done 7 steps, rank 1 five
  ASSERT_TRUE(state->ReportStep(r).ok());
  r.set_rank(1);
  r.set_step(4);
  ASSERT_TRUE(state->ReportStep(r).ok());
  EXPECT_EQ(state->RequestCheckpointAndStop(), 8);
  EXPECT_EQ(state->checkpoint_and_stop_at(), 8);
  r.set_rank(0);
  r.set_step(7);
  ASSERT_TRUE(state->ReportStep(r).ok());
  EXPECT_EQ(state->RequestCheckpointAndStop(), 8);  // asked again: the first answer holds
}

TEST_F(CoordinatorTest, ReportStep_Appends_AndAdvancesProgressWhenStepsGrow) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  ReportStepRequest r;
  r.set_rank(1);
  r.set_incarnation(1);
  r.set_step(0);
  r.set_has_loss(true);
  r.set_loss(2.5);
  r.set_step_seconds(0.25);
  now_ += absl::Seconds(1);
  const absl::Time first = now_;
  ASSERT_TRUE(state->ReportStep(r).ok());
  now_ += absl::Seconds(1);
  ASSERT_TRUE(state->ReportStep(r).ok());  // the same step again: not recorded, no progress
  r.set_rank(0);
  r.set_step(4);
  r.set_has_loss(false);
  ASSERT_TRUE(state->ReportStep(r).ok());

  std::vector<ReportStepRequest> steps = state->Steps();
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].rank(), 1);
  EXPECT_EQ(steps[0].step(), 0);
  EXPECT_TRUE(steps[0].has_loss());
  EXPECT_DOUBLE_EQ(steps[0].loss(), 2.5);
  EXPECT_DOUBLE_EQ(steps[0].step_seconds(), 0.25);
  EXPECT_EQ(steps[1].rank(), 0);
  EXPECT_FALSE(steps[1].has_loss());

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
  RegisterAllOk(*state, 2);
  FinishRequest f;
  f.set_incarnation(1);
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
  RegisterAllOk(*state, 1);
  HeartbeatRequest h;
  h.set_incarnation(1);
  h.set_steps_done(7);
  ASSERT_TRUE(state->Heartbeat(h).ok());
  FinishRequest f;
  f.set_incarnation(1);
  f.set_ok(true);
  f.set_steps_done(3);
  ASSERT_TRUE(state->Finish(f).ok());
  EXPECT_EQ(state->Workers()[0].steps_done, 7);
}

TEST_F(CoordinatorTest, Finish_Failure_StopsJobNamingTheFirstFailedRank) {
  auto state = MakeState(3);
  RegisterAllOk(*state, 3);
  FinishRequest f;
  f.set_incarnation(1);
  f.set_rank(2);
  f.set_ok(false);
  f.set_error("CUDA out of memory");
  ASSERT_TRUE(state->Finish(f).ok());
  EXPECT_TRUE(state->stopping());
  f.set_rank(0);
  f.set_error("NCCL communicator aborted");  // a consequence, not the cause
  ASSERT_TRUE(state->Finish(f).ok());

  HeartbeatRequest h;
  h.set_incarnation(1);
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
  RegisterAllOk(*state, 1);
  EXPECT_FALSE(state->stopping());
  state->Stop("first");
  state->Stop("second");
  EXPECT_TRUE(state->stopping());
  HeartbeatRequest h;
  h.set_incarnation(1);
  absl::StatusOr<HeartbeatResponse> r = state->Heartbeat(h);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stop_reason(), "first");
}

// --- Incarnations and registration on every report ---

TEST_F(CoordinatorTest, ReportStep_Repeated_IsRecordedOnce) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  ReportStepRequest r;
  r.set_incarnation(1);
  for (int64_t step : {0, 1, 1, 0, 2, 2}) {  // retries of steps whose first answer was lost
    r.set_step(step);
    ASSERT_TRUE(state->ReportStep(r).ok()) << step;
  }
  std::vector<ReportStepRequest> steps = state->Steps();
  ASSERT_EQ(steps.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(steps[i].step(), i);
  EXPECT_EQ(state->Workers()[0].steps_done, 3);
}

TEST_F(CoordinatorTest, ReportStep_SameStepFromNewerIncarnation_IsRecordedAgain) {
  auto state = MakeState(1);
  ASSERT_TRUE(state->Register(MakeRegister(0, 1, 100), LongDeadline()).ok());
  ReportStepRequest r;
  r.set_incarnation(1);
  ASSERT_TRUE(state->ReportStep(r).ok());
  ASSERT_TRUE(state->Register(MakeRegister(0, 2, 200), LongDeadline()).ok());
  r.set_incarnation(2);  // the restarted worker runs step 0 again
  ASSERT_TRUE(state->ReportStep(r).ok());
  ASSERT_EQ(state->Steps().size(), 2u);
  EXPECT_EQ(state->Steps()[1].incarnation(), 2);
}

// Registers index 0 at incarnation 1 and then at 2: calls from incarnation 1 are stale.
void ReplaceWorkerZero(CoordinatorState& state) {
  ASSERT_TRUE(state.Register(MakeRegister(0, 1, 100), LongDeadline()).ok());
  ASSERT_TRUE(state.Register(MakeRegister(0, 2, 200), LongDeadline()).ok());
}

void ExpectStale(const absl::Status& s) {
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("stale incarnation 1, current 2: this worker was replaced; exit"));
}

TEST_F(CoordinatorTest, ReportStep_StaleIncarnation_IsAborted) {
  auto state = MakeState(1);
  ReplaceWorkerZero(*state);
  ReportStepRequest r;
  r.set_incarnation(1);
  ExpectStale(state->ReportStep(r));
  EXPECT_TRUE(state->Steps().empty());
}

TEST_F(CoordinatorTest, Finish_StaleIncarnation_IsAborted) {
  auto state = MakeState(1);
  ReplaceWorkerZero(*state);
  FinishRequest f;
  f.set_incarnation(1);
  f.set_ok(false);
  f.set_error("the old process's last words");
  ExpectStale(state->Finish(f));
  EXPECT_FALSE(state->stopping()) << "a replaced worker must not fail the job";
  EXPECT_FALSE(state->Workers()[0].finished);
}

TEST_F(CoordinatorTest, ReportMilestoneAndKeyValueSet_StaleIncarnation_AreAborted) {
  auto state = MakeState(1);
  ReplaceWorkerZero(*state);
  ReportMilestoneRequest m;
  m.set_incarnation(1);
  m.set_milestone(MILESTONE_CUDA_READY);
  ExpectStale(state->ReportMilestone(m));
  ExpectStale(state->KeyValueSet(0, 1, "k", "v"));
  ExpectStale(state->Barrier("b", 0, 1, LongDeadline()));
  EXPECT_EQ(state->KeyValueGet("k", ShortDeadline()).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, Heartbeat_UnregisteredRank_IsRefused) {
  auto state = MakeState(4);
  HeartbeatRequest h;
  h.set_rank(3);
  h.set_incarnation(1);
  absl::Status s = state->Heartbeat(h).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 3 has not registered; Register first"));
  EXPECT_EQ(state->Workers()[3].last_heartbeat, absl::InfinitePast());
}

TEST_F(CoordinatorTest, Reports_NewerIncarnationNotRegistered_AreRefusedAndChangeNothing) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);  // incarnation 1
  HeartbeatRequest h;
  h.set_incarnation(2);
  h.set_steps_done(99);
  ReportStepRequest r;
  r.set_incarnation(2);
  FinishRequest f;
  f.set_incarnation(2);
  f.set_ok(false);
  f.set_error("an impostor's last words");
  for (const absl::Status& s : {state->Heartbeat(h).status(), state->ReportStep(r), state->Finish(f)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("incarnation 2 has not registered (incarnation 1 has)"));
  }
  EXPECT_FALSE(state->stopping()) << "an unregistered incarnation must not fail the job";
  EXPECT_EQ(state->Workers()[0].steps_done, 0);
  EXPECT_TRUE(state->Steps().empty());
}

TEST_F(CoordinatorTest, Register_PartitionerGivesSchedules_AssignmentCarriesEachRanksList) {
  auto state = MakeState(2);
  state->SetPartitioner([](const std::vector<WorkerState>&) -> absl::StatusOr<Partition> {
    Partition p{{3, 7}, "test plan", {}};
    for (int r = 0; r < 2; ++r) {
      RankSchedule s;
      s.set_name("1f1b");
      s.set_rank(r);
      s.set_num_ranks(2);
      s.add_actions()->set_stage(r);
      p.schedules.push_back(s);
    }
    return p;
  });
  std::vector<absl::StatusOr<Assignment>> a = RegisterAll(*state, 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(a[r].ok()) << a[r].status();
    EXPECT_EQ(a[r]->schedule().name(), "1f1b");
    EXPECT_EQ(a[r]->schedule().rank(), r);
    ASSERT_EQ(a[r]->schedule().actions_size(), 1);
    EXPECT_EQ(a[r]->schedule().actions(0).stage(), r);
  }
  EXPECT_EQ(a[1]->first_layer(), 3);
  EXPECT_EQ(a[1]->last_layer(), 10);
}

// The refusal stops the job inside the registration's poll; waits on other topics (a key no one
// sets) must see the stop too, not only the registrations.
TEST_F(CoordinatorTest, Register_AdmissionRefuses_WaitsOnOtherTopicsEndCancelled) {
  auto state = MakeState(2);
  state->SetAdmission([](const std::vector<WorkerState>&) { return absl::FailedPreconditionError("GPU 1 is bad"); });
  absl::Notification got;
  absl::Status kv_status;
  state->KeyValueGetAsync("never-set", LongDeadline(), [&](absl::StatusOr<std::string> v) {
    kv_status = v.status();
    got.Notify();
  });
  const absl::Time start = absl::Now();
  for (const absl::StatusOr<Assignment>& a : RegisterAll(*state, 2)) {
    // The registration that ran the gate gets its refusal; the waiting one the stop it caused.
    EXPECT_THAT(a.status().code(),
                ::testing::AnyOf(absl::StatusCode::kFailedPrecondition, absl::StatusCode::kCancelled))
        << a.status();
    EXPECT_THAT(std::string(a.status().message()), HasSubstr("GPU 1 is bad"));
  }
  ASSERT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(5)));
  ExpectWokenBeforeDeadline(start);
  EXPECT_EQ(kv_status.code(), absl::StatusCode::kCancelled) << kv_status;
  EXPECT_TRUE(state->stopping());
}

TEST_F(CoordinatorTest, Reports_UnregisteredRank_AreFailedPrecondition) {
  auto state = MakeState(2);
  ReportMilestoneRequest m;
  m.set_rank(1);
  m.set_incarnation(1);
  m.set_milestone(MILESTONE_CUDA_READY);
  ReportStepRequest r;
  r.set_rank(1);
  r.set_incarnation(1);
  FinishRequest f;
  f.set_rank(1);
  f.set_incarnation(1);
  f.set_ok(false);
  absl::StatusOr<WaitForStopResponse> stop = absl::UnknownError("not run");
  state->WaitForStopAsync(1, 1, LongDeadline(), [&](absl::StatusOr<WaitForStopResponse> r) { stop = std::move(r); });
  for (const absl::Status& s :
       {state->ReportMilestone(m), state->ReportStep(r), state->Finish(f), state->Barrier("b", 1, 1, LongDeadline()),
        state->KeyValueSet(1, 1, "k", "v"), stop.status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 has not registered")) << s;
  }
  EXPECT_FALSE(state->stopping());
  EXPECT_TRUE(state->Steps().empty());
}

// --- Waits as callbacks ---

TEST_F(CoordinatorTest, RegisterAsync_LastArrival_CompletesEveryWaiterOnItsThread) {
  auto state = MakeState(3);
  std::vector<absl::StatusOr<Assignment>> results(3, absl::UnknownError("not completed"));
  int completed = 0;  // every completion runs on this test's thread: no lock needed
  for (int i = 0; i < 3; ++i) {
    state->RegisterAsync(MakeRegister(i), LongDeadline(), [&, i](absl::StatusOr<Assignment> a) {
      results[i] = std::move(a);
      ++completed;
    });
    EXPECT_EQ(completed, i == 2 ? 3 : 0) << "after registering " << i;
  }
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
    EXPECT_EQ(results[i]->rank(), i);
  }
}

TEST_F(CoordinatorTest, KeyValueGetAsync_Pending_CompletesWhenSetOnTheSettersThread) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  absl::StatusOr<std::string> v = absl::UnknownError("not completed");
  state->KeyValueGetAsync("k", LongDeadline(), [&](absl::StatusOr<std::string> r) { v = std::move(r); });
  EXPECT_EQ(v.status().code(), absl::StatusCode::kUnknown) << "completed before the key was set";
  ASSERT_TRUE(state->KeyValueSet(0, 1, "k", "value").ok());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "value");
}

TEST_F(CoordinatorTest, KeyValueGetAsync_Deadline_TimerCompletesWithDeadlineExceeded) {
  auto state = MakeState(1);
  // A long wait first: the timer must wake for the earlier deadline added after it.
  absl::Notification long_done;
  state->KeyValueGetAsync("k", LongDeadline(), [&](absl::StatusOr<std::string>) { long_done.Notify(); });
  absl::Notification done;
  absl::Status s;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(30);
  state->KeyValueGetAsync("k", deadline, [&](absl::StatusOr<std::string> r) {
    s = r.status();
    done.Notify();
  });
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5))) << "the timer did not fire";
  EXPECT_GE(absl::Now(), deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(long_done.HasBeenNotified());
}

TEST_F(CoordinatorTest, Barrier_ReplacedWhileWaiting_IsAborted) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  absl::Status s = absl::UnknownError("not completed");
  state->BarrierAsync("b", 0, 1, LongDeadline(), [&](absl::Status r) { s = r; });
  absl::StatusOr<Assignment> replacement = state->Register(MakeRegister(0, 2, 200), LongDeadline());
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  ExpectStale(s);
}

// --- WaitForStop ---

TEST_F(CoordinatorTest, WaitForStop_Stop_CompletesEveryPendingWaitWithin100ms) {
  constexpr int kWorkers = 4;
  constexpr int kWaitsPerWorker = 25;
  auto state = MakeState(kWorkers);
  RegisterAllOk(*state, kWorkers);
  absl::Mutex mu;
  std::vector<absl::StatusOr<WaitForStopResponse>> results;
  absl::Notification all_done;
  for (int i = 0; i < kWorkers * kWaitsPerWorker; ++i) {
    state->WaitForStopAsync(i % kWorkers, 1, absl::InfiniteFuture(), [&](absl::StatusOr<WaitForStopResponse> r) {
      absl::MutexLock lock(&mu);
      results.push_back(std::move(r));
      if (results.size() == kWorkers * kWaitsPerWorker) all_done.Notify();
    });
  }
  EXPECT_FALSE(all_done.HasBeenNotified());
  const absl::Time start = absl::Now();
  state->Stop("rank 2 ran out of memory", "rank 2 (host host-2, pid 1002)");
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  absl::MutexLock lock(&mu);
  for (const absl::StatusOr<WaitForStopResponse>& r : results) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->reason(), "rank 2 ran out of memory");
    EXPECT_EQ(r->origin(), "rank 2 (host host-2, pid 1002)");
  }
}

TEST_F(CoordinatorTest, WaitForStop_FinishFailure_NamesTheFailedRankAsOrigin) {
  auto state = MakeState(2);
  RegisterAllOk(*state, 2);
  absl::StatusOr<WaitForStopResponse> r = absl::UnknownError("not completed");
  state->WaitForStopAsync(0, 1, LongDeadline(), [&](absl::StatusOr<WaitForStopResponse> v) { r = std::move(v); });
  FinishRequest f;
  f.set_rank(1);
  f.set_incarnation(1);
  f.set_ok(false);
  f.set_error("CUDA out of memory");
  ASSERT_TRUE(state->Finish(f).ok());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->origin(), "rank 1 (host host-1, pid 1001)");
  EXPECT_THAT(r->reason(), HasSubstr("CUDA out of memory"));
}

TEST_F(CoordinatorTest, WaitForStop_AlreadyStopped_CompletesAtOnceFromTheLauncher) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  state->Stop("interrupted");
  absl::StatusOr<WaitForStopResponse> r = absl::UnknownError("not completed");
  state->WaitForStopAsync(0, 1, LongDeadline(), [&](absl::StatusOr<WaitForStopResponse> v) { r = std::move(v); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->reason(), "interrupted");
  EXPECT_EQ(r->origin(), "the launcher");
}

TEST_F(CoordinatorTest, WaitForStop_ReplacedWhileWaiting_IsAborted) {
  auto state = MakeState(1);
  RegisterAllOk(*state, 1);
  absl::StatusOr<WaitForStopResponse> r = absl::UnknownError("not completed");
  state->WaitForStopAsync(0, 1, LongDeadline(), [&](absl::StatusOr<WaitForStopResponse> v) { r = std::move(v); });
  ASSERT_TRUE(state->Register(MakeRegister(0, 2, 200), LongDeadline()).ok());
  ExpectStale(r.status());
}

TEST_F(CoordinatorTest, Shutdown_PendingWaits_AreUnavailableAndLaterOnesAtOnce) {
  auto state = MakeState(2);
  std::vector<absl::Status> results;  // completions run on this thread
  state->RegisterAsync(MakeRegister(0), LongDeadline(),
                       [&](absl::StatusOr<Assignment> a) { results.push_back(a.status()); });
  state->KeyValueGetAsync("k", LongDeadline(), [&](absl::StatusOr<std::string> v) { results.push_back(v.status()); });
  state->BarrierAsync("b", 0, 1, LongDeadline(), [&](absl::Status s) { results.push_back(s); });
  state->WaitForStopAsync(0, 1, absl::InfiniteFuture(),
                          [&](absl::StatusOr<WaitForStopResponse> r) { results.push_back(r.status()); });
  EXPECT_TRUE(results.empty());
  state->Shutdown();
  state->KeyValueGetAsync("k", LongDeadline(), [&](absl::StatusOr<std::string> v) { results.push_back(v.status()); });
  ASSERT_EQ(results.size(), 5u);
  for (const absl::Status& s : results) EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

// --- The gRPC service over a real server ---

class CoordinatorServerTest : public ::testing::Test {
 protected:
  // A server capped at `max_threads` gRPC threads, for a job of `workers`.
  void StartServer(int workers, int max_threads = 0) {
    state_ = std::make_unique<CoordinatorState>(MakeJob(workers), kJobId, kSecret);
    absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
        CoordinatorServer::Start("127.0.0.1:0", state_.get(), max_threads);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Coordinator::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  }

  std::unique_ptr<grpc::ClientContext> Context() const {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata("authorization", std::string("Bearer ") + kSecret);
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return context;
  }

  void RegisterAllOverGrpc(int workers) {
    std::vector<absl::Status> results(workers);
    std::vector<std::thread> threads;
    for (int i = 0; i < workers; ++i) {
      threads.emplace_back([&, i] {
        RegisterResponse response;
        grpc::Status s = stub_->Register(Context().get(), MakeRegister(i), &response);
        results[i] = absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
      });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }

  // `count` WaitForStop calls in flight at once (the async stub), each recording its status.
  struct PendingCalls {
    absl::Mutex mu;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
    std::vector<std::unique_ptr<WaitForStopResponse>> responses;
    std::vector<grpc::Status> statuses ABSL_GUARDED_BY(mu);
    absl::Notification all_done;
  };
  void StartWaitForStops(PendingCalls& calls, int count, int workers) {
    for (int i = 0; i < count; ++i) {
      calls.contexts.push_back(Context());
      calls.contexts.back()->set_deadline(std::chrono::system_clock::time_point::max());
      calls.responses.push_back(std::make_unique<WaitForStopResponse>());
      WaitForStopRequest request;
      request.set_rank(i % workers);
      request.set_incarnation(1);
      stub_->async()->WaitForStop(calls.contexts.back().get(), &request, calls.responses.back().get(),
                                  [&calls, count](grpc::Status s) {
                                    absl::MutexLock lock(&calls.mu);
                                    calls.statuses.push_back(s);
                                    if (static_cast<int>(calls.statuses.size()) == count) calls.all_done.Notify();
                                  });
    }
  }

  std::unique_ptr<CoordinatorState> state_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<Coordinator::Stub> stub_;
};

TEST_F(CoordinatorServerTest, KeyValueGet_200WaitersOnFourThreads_AllCompleteWhenSet) {
  constexpr int kWaiters = 200;
  StartServer(1, /*max_threads=*/4);
  RegisterAllOverGrpc(1);
  absl::Mutex mu;
  int ok = 0;
  int done = 0;
  absl::Notification all_done;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<KeyValueGetResponse>> responses(kWaiters);
  KeyValueGetRequest get;
  get.set_key("nccl/id");
  get.set_timeout_ms(20000);
  for (int i = 0; i < kWaiters; ++i) {
    contexts.push_back(Context());
    responses[i] = std::make_unique<KeyValueGetResponse>();
    stub_->async()->KeyValueGet(contexts[i].get(), &get, responses[i].get(), [&, i](grpc::Status s) {
      absl::MutexLock lock(&mu);
      if (s.ok() && responses[i]->value() == "unique-id") ++ok;
      if (++done == kWaiters) all_done.Notify();
    });
  }
  // A synchronous service would hold a thread per waiter: 4 could never hold 200.
  ASSERT_TRUE(state_->AwaitPendingWaits(kWaiters, absl::Now() + absl::Seconds(20)))
      << "not every KeyValueGet reached the server and waited";
  EXPECT_FALSE(all_done.HasBeenNotified());
  KeyValueSetRequest set;
  set.set_key("nccl/id");
  set.set_value("unique-id");
  set.set_rank(0);
  set.set_incarnation(1);
  KeyValueSetResponse set_response;
  grpc::Status s = stub_->KeyValueSet(Context().get(), set, &set_response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_TRUE(all_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(ok, kWaiters);
}

TEST_F(CoordinatorServerTest, WaitForStop_Stop_CompletesEveryPendingCallWithin100ms) {
  constexpr int kWorkers = 2;
  constexpr int kCalls = 16;
  StartServer(kWorkers);
  RegisterAllOverGrpc(kWorkers);
  PendingCalls calls;
  StartWaitForStops(calls, kCalls, kWorkers);
  ASSERT_TRUE(state_->AwaitPendingWaits(kCalls, absl::Now() + absl::Seconds(20)));
  const absl::Time start = absl::Now();
  state_->Stop("rank 1 failed", "rank 1 (host host-1, pid 1001)");
  ASSERT_TRUE(calls.all_done.WaitForNotificationWithTimeout(absl::Milliseconds(100)))
      << "not every WaitForStop returned within 100 ms of Stop()";
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  absl::MutexLock lock(&calls.mu);
  for (const grpc::Status& s : calls.statuses) EXPECT_TRUE(s.ok()) << s.error_message();
  for (const auto& r : calls.responses) {
    EXPECT_EQ(r->reason(), "rank 1 failed");
    EXPECT_EQ(r->origin(), "rank 1 (host host-1, pid 1001)");
  }
}

TEST_F(CoordinatorServerTest, WaitForStop_ServerShutsDown_IsUnavailable) {
  StartServer(1);
  RegisterAllOverGrpc(1);
  PendingCalls calls;
  StartWaitForStops(calls, 3, 1);
  ASSERT_TRUE(state_->AwaitPendingWaits(3, absl::Now() + absl::Seconds(20)));
  server_->Stop();
  ASSERT_TRUE(calls.all_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  absl::MutexLock lock(&calls.mu);
  for (const grpc::Status& s : calls.statuses) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  }
}

TEST_F(CoordinatorServerTest, Heartbeat_StaleIncarnationOverGrpc_IsAbortedWithTheMessage) {
  StartServer(1);
  RegisterAllOverGrpc(1);
  HeartbeatRequest h;
  h.set_incarnation(0);
  HeartbeatResponse response;
  grpc::Status s = stub_->Heartbeat(Context().get(), h, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_THAT(s.error_message(), HasSubstr("stale incarnation 0, current 1"));
  grpc::ClientContext no_secret;
  s = stub_->Heartbeat(&no_secret, h, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

// Loopback is an address, not a name: the host is resolved and each of its addresses checked.
TEST(LoopbackListenAddressTest, LoopbackAddresses_AreServedNumerically) {
  EXPECT_EQ(LoopbackListenAddress("127.0.0.1:0").value_or(""), "127.0.0.1:0");
  EXPECT_EQ(LoopbackListenAddress("127.1.2.3:80").value_or(""), "127.1.2.3:80");
  EXPECT_EQ(LoopbackListenAddress("[::1]:0").value_or(""), "[::1]:0");
  EXPECT_EQ(LoopbackListenAddress("localhost:5").value_or(""), "127.0.0.1:5");
}

TEST(LoopbackListenAddressTest, NamesAndOtherAddresses_AreRefusedNamingTheFlag) {
  for (const std::string address : {"127.evil.test:0", "0.0.0.0:0", "[::]:0", "10.1.2.3:0", "128.0.0.1:0", "::1:0",
                                    "127.0.0.1", "127.0.0.1:70000", "[::1]0", ":0"}) {
    SCOPED_TRACE(address);
    absl::StatusOr<std::string> a = LoopbackListenAddress(address);
    ASSERT_FALSE(a.ok()) << *a;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(a.status().message()), ::testing::HasSubstr("--coordinator_address=" + address));
  }
}

TEST(LoopbackListenAddressTest, Start_Ipv6Loopback_ServesOnIt) {
  CoordinatorState state(MakeJob(1), kJobId, kSecret);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start("[::1]:0", &state);
  if (!server.ok() && server.status().code() == absl::StatusCode::kUnavailable) {
    GTEST_SKIP() << "no IPv6 loopback here: " << server.status();
  }
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(absl::StartsWith((*server)->address(), "[::1]:")) << (*server)->address();
  EXPECT_NE((*server)->address(), "[::1]:0");
}

TEST(LoopbackListenAddressTest, Start_NameResolvingElsewhere_IsRefused) {
  CoordinatorState state(MakeJob(1), kJobId, kSecret);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start("127.evil.test:0", &state);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagehand
