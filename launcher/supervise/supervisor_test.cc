// Unit tests of the Supervisor: a FakeProcessSpawner stands for the worker processes, a real
// CoordinatorState for what they report, and one fake clock, advanced by the test, for both.
#include "launcher/supervise/supervisor.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/supervise/fake_clock.h"
#include "launcher/supervise/fake_process.h"
#include "stagehand/step.h"

namespace stagehand {

// Found by argument-dependent lookup, so it lives in stagehand, not in the anonymous namespace.
void PrintTo(const FakeProcessSpawner::SentSignal& s, std::ostream* os) {
  *os << "{pid " << s.pid << ", signal " << s.signal << "}";
}

namespace {

using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

using Sent = FakeProcessSpawner::SentSignal;

constexpr char kJobId[] = "job-7";
constexpr char kSecret[] = "s3cret-token-1234";
constexpr char kWorkerBinary[] = "/opt/stagehand/worker";
constexpr char kCoordinatorAddress[] = "127.0.0.1:40123";

// The job's timeouts, chosen apart from each other so that a test shows which one fired.
constexpr int64_t kHeartbeatIntervalMs = 100;
constexpr int64_t kHeartbeatTimeoutMs = 1000;
constexpr int64_t kProgressTimeoutMs = 10000;
constexpr int64_t kRegisterMs = 5000;
constexpr int64_t kGraceMs = 3000;
constexpr absl::Duration kStopNotice = StopNotice(kHeartbeatIntervalMs);  // launcher/coordinator/liveness.h
constexpr absl::Duration kGrace = absl::Milliseconds(kGraceMs);
constexpr absl::Duration kTick = absl::Milliseconds(1);

// Fails its `fail_at`-th Spawn (1-based), which FakeProcessSpawner alone cannot do inside Start().
class SpawnerFailingAt : public FakeProcessSpawner {
 public:
  absl::StatusOr<int> Spawn(const ProcessSpec& spec) override {
    if (++calls_ == fail_at) FailNextSpawn(absl::ResourceExhaustedError("fork: Cannot allocate memory"));
    return FakeProcessSpawner::Spawn(spec);
  }
  int fail_at = 0;  // 0: never

 private:
  int calls_ = 0;
};

JobSpec MakeJob(int workers, DeviceKind device) {
  JobSpec job;
  job.set_name("test");
  job.set_device(device == DEVICE_KIND_CUDA ? "cuda" : "cpu");
  job.set_workers(workers);
  job.set_steps(10);
  job.set_model("allreduce");
  Timeouts& t = *job.mutable_timeouts();
  t.set_register_ms(kRegisterMs);
  t.set_heartbeat_interval_ms(kHeartbeatIntervalMs);
  t.set_heartbeat_timeout_ms(kHeartbeatTimeoutMs);
  t.set_progress_timeout_ms(kProgressTimeoutMs);
  t.set_nccl_init_ms(60000);
  t.set_grace_ms(kGraceMs);
  return job;
}

std::string Uuid(int i) { return absl::StrCat("GPU-", i, "1234567-89ab-cdef-0123-456789abcdef"); }

int Pid(int rank) { return FakeProcessSpawner::kFirstPid + rank; }

RegisterRequest MakeRegister(int index) {
  RegisterRequest r;
  r.set_job_id(kJobId);
  r.set_worker_index(index);
  r.set_incarnation(1);
  r.set_host("host-a");
  r.set_pid(Pid(index));
  r.mutable_device()->set_kind(DEVICE_KIND_CPU);
  return r;
}

class SupervisorTest : public ::testing::Test {
 protected:
  void Init(int workers, DeviceKind device = DEVICE_KIND_CPU, int max_restarts = 0) {
    JobSpec job = MakeJob(workers, device);
    if (max_restarts > 0) job.set_max_restarts(max_restarts);
    state_ = std::make_unique<CoordinatorState>(job, kJobId, kSecret, clock_.AsFunction());
    SupervisorOptions options;
    options.worker_binary = kWorkerBinary;
    options.coordinator_address = kCoordinatorAddress;
    options.run_dir = run_dir_;
    options.env = {"PATH=/usr/bin:/bin", "NCCL_NVLS_ENABLE=0"};
    if (device == DEVICE_KIND_CUDA) {
      for (int i = 0; i < workers; ++i) {
        GpuInfo g;
        g.ordinal = i;
        g.uuid = Uuid(i);
        options.gpus.push_back(g);
      }
    }
    supervisor_ = std::make_unique<Supervisor>(state_.get(), &spawner_, options, clock_.AsFunction());
  }

  void StartAndRegisterAll() {
    ASSERT_TRUE(supervisor_->Start().ok());
    RegisterAll();
  }

  // Register returns only once every slot has registered, so each worker calls it from its own
  // thread. The deadline is real time, far enough never to be reached once all have registered.
  void RegisterAll() {
    const int workers = state_->job().workers();
    std::vector<absl::Status> results(workers);
    std::vector<std::thread> threads;
    for (int i = 0; i < workers; ++i) {
      threads.emplace_back(
          [&, i] { results[i] = state_->Register(MakeRegister(i), absl::Now() + absl::Seconds(10)).status(); });
    }
    for (std::thread& t : threads) t.join();
    for (const absl::Status& s : results) ASSERT_TRUE(s.ok()) << s;
  }

  void Heartbeat(int rank, int64_t steps_done) {
    HeartbeatRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_steps_done(steps_done);
    ASSERT_TRUE(state_->Heartbeat(r).ok());
  }

  void ReportSteps(int rank, int64_t steps) {
    for (int64_t s = 0; s < steps; ++s) {
      ReportStepRequest r;
      r.set_rank(rank);
      r.set_incarnation(1);
      r.set_step(s);
      r.set_step_seconds(0.01);
      ASSERT_TRUE(state_->ReportStep(r).ok());
    }
  }

  void Finish(int rank, bool ok, int64_t steps_done, const std::string& error = "") {
    FinishRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_ok(ok);
    r.set_error(error);
    r.set_steps_done(steps_done);
    ASSERT_TRUE(state_->Finish(r).ok());
  }

  void ReportMilestone(int rank, Milestone m, absl::Duration since_launch) {
    ReportMilestoneRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_milestone(m);
    r.set_unix_micros(absl::ToUnixMicros(supervisor_->launch_time() + since_launch));
    ASSERT_TRUE(state_->ReportMilestone(r).ok());
  }

  // Ticks, advancing the clock by `d` first.
  bool TickAfter(absl::Duration d) {
    clock_.Advance(d);
    return supervisor_->Tick();
  }

  // Where the workers' logs would be: a test that writes one sets a directory of its own first.
  std::string run_dir_ = "/tmp/run-1";
  FakeClock clock_;
  SpawnerFailingAt spawner_;
  std::unique_ptr<CoordinatorState> state_;
  std::unique_ptr<Supervisor> supervisor_;
};

TEST_F(SupervisorTest, Start_CpuJob_SpawnsOneWorkerPerSlotWithArgvAndNoGpu) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  const std::vector<ProcessSpec> specs = spawner_.specs();
  ASSERT_THAT(specs, SizeIs(2));
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("worker ", i));
    ASSERT_THAT(specs[i].argv, Not(IsEmpty()));
    EXPECT_EQ(specs[i].argv[0], kWorkerBinary);
    EXPECT_THAT(specs[i].argv, Contains(absl::StrCat("--worker_index=", i)));
    EXPECT_THAT(specs[i].argv, Contains(absl::StrCat("--job_id=", kJobId)));
    EXPECT_THAT(specs[i].argv, Contains(absl::StrCat("--coordinator=", kCoordinatorAddress)));
    EXPECT_THAT(specs[i].env, Contains("PATH=/usr/bin:/bin"));
    EXPECT_THAT(specs[i].env, Contains("CUDA_VISIBLE_DEVICES="));
  }
  EXPECT_THAT(spawner_.running(), ElementsAre(Pid(0), Pid(1)));
  EXPECT_FALSE(supervisor_->Tick());
}

TEST_F(SupervisorTest, Start_GpuJob_PinsEachWorkerToItsGpuByUuid) {
  Init(2, DEVICE_KIND_CUDA);
  ASSERT_TRUE(supervisor_->Start().ok());
  const std::vector<ProcessSpec> specs = spawner_.specs();
  ASSERT_THAT(specs, SizeIs(2));
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("worker ", i));
    EXPECT_THAT(specs[i].argv, Contains(absl::StrCat("--worker_index=", i)));
    std::vector<std::string> visible;
    for (const std::string& e : specs[i].env) {
      if (absl::StartsWith(e, "CUDA_VISIBLE_DEVICES=")) visible.push_back(e);
    }
    EXPECT_THAT(visible, ElementsAre("CUDA_VISIBLE_DEVICES=" + Uuid(i)));
  }
}

TEST_F(SupervisorTest, Start_Secret_GoesThroughSpecSecretOnly) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  for (const ProcessSpec& spec : spawner_.specs()) {
    EXPECT_EQ(spec.secret, kSecret);
    EXPECT_THAT(spec.argv, Not(Contains(HasSubstr(kSecret))));
    EXPECT_THAT(spec.env, Not(Contains(HasSubstr(kSecret))));
  }
}

TEST_F(SupervisorTest, Tick_AllFinishOkAndExitZero_SucceedsWithEmptyRootCause) {
  Init(2);
  StartAndRegisterAll();
  for (int r = 0; r < 2; ++r) {
    ReportSteps(r, 10);
    Finish(r, true, 10);
  }
  spawner_.Exit(Pid(0), 0);
  EXPECT_FALSE(TickAfter(kTick)) << "rank 1 is still running";
  spawner_.Exit(Pid(1), 0);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitSuccess);
  EXPECT_THAT(supervisor_->root_cause(), IsEmpty());
  EXPECT_FALSE(state_->stopping());
  EXPECT_THAT(spawner_.signals(), IsEmpty());
}

TEST_F(SupervisorTest, Tick_WorkerKilledBySigkill_FailsNamingRankSignalAndSteps) {
  Init(3);
  StartAndRegisterAll();
  ReportSteps(1, 5);
  spawner_.Kill(Pid(1), SIGKILL);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("signal 9"), HasSubstr("after 5 steps")));
  EXPECT_TRUE(state_->stopping());
  EXPECT_THAT(spawner_.signals(), IsEmpty()) << "the workers get the stop notice first";
}

TEST_F(SupervisorTest, Tick_CrashWithARestartLeft_RespawnsANewerIncarnationThenGivesUpWithTheLastCause) {
  Init(1, DEVICE_KIND_CPU, /*max_restarts=*/1);
  StartAndRegisterAll();
  spawner_.Kill(Pid(0), SIGKILL);
  EXPECT_FALSE(supervisor_->Tick()) << "a restart is left";
  EXPECT_FALSE(state_->stopping()) << "the coordinator waits for the next incarnation";
  EXPECT_FALSE(TickAfter(absl::Milliseconds(999)));
  EXPECT_THAT(spawner_.specs(), SizeIs(1)) << "the backoff is 1 s";
  EXPECT_FALSE(TickAfter(absl::Milliseconds(1)));
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  EXPECT_THAT(spawner_.specs()[1].argv, Contains("--incarnation=2"));
  RegisterRequest again = MakeRegister(0);
  again.set_incarnation(1);  // the dead incarnation is stale
  EXPECT_EQ(state_->Register(again, absl::Now() + absl::Seconds(1)).status().code(), absl::StatusCode::kAborted);
  spawner_.Kill(Pid(1), SIGKILL);
  EXPECT_TRUE(supervisor_->Tick()) << "no restart is left";
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("signal 9"), HasSubstr("after 1 restart")));
}

// Ctrl-C while the others of a failed rank are being stopped: the run ends, restarts left or not, with
// the failure as its cause.
TEST_F(SupervisorTest, Interrupt_WhileAFailureStopsTheRun_NoRestart) {
  Init(2, DEVICE_KIND_CPU, /*max_restarts=*/1);
  StartAndRegisterAll();
  spawner_.Kill(Pid(1), SIGKILL);
  EXPECT_FALSE(supervisor_->Tick());
  supervisor_->Interrupt(SIGINT, /*force=*/false);
  spawner_.Exit(Pid(0), 1);
  EXPECT_TRUE(TickAfter(kTick)) << "no restart after a signal";
  EXPECT_THAT(spawner_.specs(), SizeIs(2));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("signal 9")));
}

TEST_F(SupervisorTest, Tick_AfterFailure_TermsAfterStopNoticeAndKillsAfterGrace) {
  Init(3);
  StartAndRegisterAll();
  spawner_.Kill(Pid(1), SIGKILL);
  EXPECT_FALSE(supervisor_->Tick());

  EXPECT_FALSE(TickAfter(kStopNotice - kTick));
  EXPECT_THAT(spawner_.signals(), IsEmpty());
  EXPECT_FALSE(TickAfter(kTick));
  // SIGCONT follows SIGTERM so that a stopped worker acts on it; the dead rank 1 gets nothing.
  EXPECT_THAT(spawner_.signals(),
              ElementsAre(Sent{Pid(0), SIGTERM}, Sent{Pid(2), SIGTERM}, Sent{Pid(0), SIGCONT}, Sent{Pid(2), SIGCONT}));

  EXPECT_FALSE(TickAfter(kGrace - kTick));
  EXPECT_THAT(spawner_.signals(), SizeIs(4));
  spawner_.Exit(Pid(2), 3);  // rank 2 left on SIGTERM; rank 0 ignores it
  EXPECT_FALSE(TickAfter(kTick));
  EXPECT_THAT(spawner_.signals(), SizeIs(5));
  EXPECT_EQ(spawner_.signals().back(), (Sent{Pid(0), SIGKILL}));

  spawner_.Kill(Pid(0), SIGKILL);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("rank 1")) << "the consequences do not replace the cause";
}

TEST_F(SupervisorTest, Tick_WorkerExitsNonZeroAfterReportingError_RootCauseIncludesError) {
  Init(2);
  StartAndRegisterAll();
  ReportSteps(0, 3);
  Finish(0, false, 3, "CUDA error: out of memory");
  spawner_.Exit(Pid(0), 1);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  // The report, which says why, is the root cause rather than the exit that followed it.
  EXPECT_THAT(supervisor_->root_cause(),
              AllOf(HasSubstr("rank 0"), HasSubstr("failed after 3 steps"), HasSubstr("CUDA error: out of memory")));
}

// Rank 2 is killed; rank 0 reports "closed the connection" before rank 2's exit is reaped. The crash,
// not its consequence, is the root cause.
TEST_F(SupervisorTest, Tick_PeerReportsBeforeCrashIsReaped_RootCauseIsTheCrash) {
  Init(3);
  StartAndRegisterAll();
  Finish(0, false, 5, "UNAVAILABLE: rank 2 closed the connection");
  EXPECT_FALSE(supervisor_->Tick());
  spawner_.Kill(Pid(2), SIGKILL);
  EXPECT_FALSE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 2"), HasSubstr("signal 9")));
}

TEST_F(SupervisorTest, Tick_WorkerExitsZeroWithoutFinishing_Fails) {
  Init(2);
  StartAndRegisterAll();
  spawner_.Exit(Pid(1), 0);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("exited with code 0")));
}

// The coordinator refuses the job when the last worker registers (the health gate): the workers leave
// with "stopped" (code 3), reaped before any tick saw the stop; the refusal is the cause, exit 4.
TEST_F(SupervisorTest, Tick_CoordinatorStopsJobItself_ExitsReapedFirst_RootCauseIsTheStop) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  state_->Stop("GPU health: rank 1 (GPU-b): 7 uncorrected ECC errors", "the coordinator");
  spawner_.Exit(Pid(0), 3);
  spawner_.Exit(Pid(1), 3);
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitLaunchFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("7 uncorrected ECC errors"));
}

// The failed rank reports its error, and the other rank, told to stop through its heartbeat, leaves
// (code 3) before the failed one is reaped: the root cause is still the failed rank's error.
TEST_F(SupervisorTest, Tick_ConsequenceExitsBeforeFailedRank_RootCauseNamesFailedRank) {
  Init(2);
  StartAndRegisterAll();
  Finish(0, false, 2, "CUDA error: out of memory");
  spawner_.Exit(Pid(1), 3);
  supervisor_->Tick();
  spawner_.Exit(Pid(0), 1);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 0"), HasSubstr("CUDA error: out of memory")));
}

// A worker that reported an error but does not exit (stuck tearing down) is stopped like any failed
// one: kExitWorkerFailed covers a worker that "reported an error", and nothing else would end the run.
TEST_F(SupervisorTest, Tick_WorkerReportsErrorAndHangs_IsStoppedWithItsError) {
  Init(1);
  StartAndRegisterAll();
  Finish(0, false, 2, "NCCL error: unhandled system error");
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 0"), HasSubstr("NCCL error")));
  EXPECT_FALSE(TickAfter(kStopNotice));
  EXPECT_THAT(spawner_.signals(), Contains(Sent{Pid(0), SIGTERM}));
}

TEST_F(SupervisorTest, Tick_NoHeartbeatPastTimeout_IsHungWithStoppedHeartbeating) {
  Init(2);
  StartAndRegisterAll();
  const absl::Duration half = absl::Milliseconds(kHeartbeatTimeoutMs / 2);
  clock_.Advance(half);
  Heartbeat(0, 0);  // rank 0 lives on; rank 1 is silent since it registered
  EXPECT_FALSE(TickAfter(half - kTick));
  EXPECT_FALSE(state_->stopping());
  EXPECT_FALSE(TickAfter(2 * kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("stopped heartbeating")));
  EXPECT_TRUE(state_->stopping());
}

// A worker that registered first waits in Register while the others register and profile their
// devices, which may take longer than the heartbeat timeout: it is alive (its call is ours), and its
// heartbeats start with its assignment (launcher/coordinator/liveness.h).
TEST_F(SupervisorTest, Tick_RegisteredAndWaitingForPeers_IsNotHungUntilItsAssignment) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  absl::Status first;
  std::thread waiting([&] { first = state_->Register(MakeRegister(0), absl::Now() + absl::Seconds(10)).status(); });
  for (int i = 0; i < 2000 && !state_->Workers()[0].registered; ++i) absl::SleepFor(absl::Milliseconds(1));
  ASSERT_TRUE(state_->Workers()[0].registered);
  EXPECT_FALSE(TickAfter(2 * absl::Milliseconds(kHeartbeatTimeoutMs)));  // still below the registration deadline
  EXPECT_FALSE(state_->stopping()) << supervisor_->root_cause();
  ASSERT_TRUE(state_->Register(MakeRegister(1), absl::Now() + absl::Seconds(10)).ok());
  waiting.join();
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_FALSE(TickAfter(absl::Milliseconds(kHeartbeatTimeoutMs) - kTick));
  EXPECT_FALSE(state_->stopping()) << supervisor_->root_cause();
  EXPECT_FALSE(TickAfter(2 * kTick));  // from the assignment on, silence counts
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("stopped heartbeating"));
}

TEST_F(SupervisorTest, Tick_NoProgressPastTimeout_IsHungWithMadeNoProgress) {
  Init(2);
  StartAndRegisterAll();
  // Both heartbeat every 500 ms; rank 1 advances a step each time, rank 0 stays at 3 steps.
  Heartbeat(0, 3);
  const absl::Duration beat = absl::Milliseconds(500);
  int64_t steps1 = 0;
  absl::Duration elapsed;
  while (elapsed + beat < absl::Milliseconds(kProgressTimeoutMs)) {
    EXPECT_FALSE(TickAfter(beat));
    elapsed += beat;
    Heartbeat(0, 3);
    Heartbeat(1, ++steps1);
    ASSERT_FALSE(state_->stopping()) << "stopped after " << elapsed << ": " << supervisor_->root_cause();
  }
  EXPECT_FALSE(TickAfter(absl::Milliseconds(kProgressTimeoutMs) - elapsed + kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_THAT(supervisor_->root_cause(),
              AllOf(HasSubstr("rank 0"), HasSubstr("made no progress"), HasSubstr("stuck after 3 steps")));
}

TEST_F(SupervisorTest, Tick_WorkerNeverRegisters_IsHungWithDidNotRegister) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  // Rank 0 registers (a deadline already past records it without waiting) and keeps heartbeating.
  EXPECT_EQ(state_->Register(MakeRegister(0), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  const absl::Duration beat = absl::Milliseconds(500);
  for (absl::Duration t = beat; t <= absl::Milliseconds(kRegisterMs); t += beat) {
    EXPECT_FALSE(TickAfter(beat));
    Heartbeat(0, 0);
  }
  EXPECT_FALSE(state_->stopping()) << supervisor_->root_cause();
  EXPECT_FALSE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("did not register")));
}

// The coordinator refuses registrations once the job stops, so a worker that arrives late exits 1:
// that exit is a consequence and must not displace the hang (it once did: exit 1 blaming rank 1).
TEST_F(SupervisorTest, Tick_RankZeroNeverRegisters_HangNamesItAndLateExitsAreNotBlamed) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  EXPECT_EQ(state_->Register(MakeRegister(1), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);  // rank 1 is in; rank 0 never comes
  EXPECT_FALSE(TickAfter(absl::Milliseconds(kRegisterMs) + kTick));
  EXPECT_TRUE(state_->stopping());
  spawner_.Exit(Pid(0), 1);  // "Register: the job is stopping; no new registrations"
  spawner_.Exit(Pid(1), 3);  // its Register wait was cancelled by the stop
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_EQ(supervisor_->root_cause(), "rank 0 (pid 1000) did not register within 5s");
}

TEST_F(SupervisorTest, Tick_SeveralNeverRegister_HangNamesEachOfThem) {
  Init(3);
  ASSERT_TRUE(supervisor_->Start().ok());
  EXPECT_EQ(state_->Register(MakeRegister(1), absl::InfinitePast()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(TickAfter(absl::Milliseconds(kRegisterMs) + kTick));
  spawner_.Exit(Pid(0), 1);  // refused: the job is stopping
  spawner_.Exit(Pid(1), 3);  // cancelled
  spawner_.Exit(Pid(2), 1);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_EQ(supervisor_->root_cause(), "ranks 0 (pid 1000), 2 (pid 1002) did not register within 5s");
}

// A worker killed before it registers is still a crash, even once the job is stopping.
TEST_F(SupervisorTest, Tick_UnregisteredWorkerKilledBeforeDeadline_IsACrash) {
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  spawner_.Kill(Pid(0), SIGKILL);
  EXPECT_FALSE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 0"), HasSubstr("signal 9")));
}

TEST_F(SupervisorTest, Interrupt_Sigint_StopsCoordinatorAndExits130) {
  Init(2);
  StartAndRegisterAll();
  supervisor_->Interrupt(SIGINT, /*force=*/false);
  EXPECT_TRUE(state_->stopping());
  EXPECT_EQ(supervisor_->exit_code(), kExitInterrupted);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("SIGINT"));
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_THAT(spawner_.signals(), IsEmpty()) << "the workers get the stop notice first";
  spawner_.Exit(Pid(0), 3);
  spawner_.Exit(Pid(1), 3);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), 130);
}

TEST_F(SupervisorTest, Interrupt_SecondForced_KillsLiveWorkersAtOnce) {
  Init(3);
  StartAndRegisterAll();
  supervisor_->Interrupt(SIGINT, /*force=*/false);
  spawner_.Exit(Pid(2), 3);
  EXPECT_FALSE(supervisor_->Tick());
  supervisor_->Interrupt(SIGINT, /*force=*/true);
  EXPECT_THAT(spawner_.signals(), ElementsAre(Sent{Pid(0), SIGKILL}, Sent{Pid(1), SIGKILL}));
  // Escalation has nothing left to send.
  EXPECT_FALSE(TickAfter(kStopNotice + kGrace));
  EXPECT_THAT(spawner_.signals(), SizeIs(2));
  spawner_.Kill(Pid(0), SIGKILL);
  spawner_.Kill(Pid(1), SIGKILL);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitInterrupted);
}

TEST_F(SupervisorTest, Interrupt_Sigterm_Exits143) {
  Init(2);
  StartAndRegisterAll();
  supervisor_->Interrupt(SIGTERM, /*force=*/false);
  EXPECT_EQ(supervisor_->exit_code(), 143);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("SIGTERM"));
  EXPECT_TRUE(state_->stopping());
}

TEST_F(SupervisorTest, Interrupt_AfterWorkerFailure_KeepsTheFailure) {
  Init(2);
  StartAndRegisterAll();
  spawner_.Kill(Pid(1), SIGSEGV);
  EXPECT_FALSE(supervisor_->Tick());
  supervisor_->Interrupt(SIGINT, /*force=*/false);
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("rank 1"), HasSubstr("signal 11")));
}

TEST_F(SupervisorTest, Start_SecondSpawnFails_ExitsLaunchFailedAndStopsTheFirst) {
  Init(3);
  spawner_.fail_at = 2;
  absl::Status s = supervisor_->Start();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(supervisor_->exit_code(), kExitLaunchFailed);
  EXPECT_THAT(supervisor_->root_cause(), AllOf(HasSubstr("worker 1"), HasSubstr("Cannot allocate memory")));
  EXPECT_TRUE(state_->stopping());
  EXPECT_THAT(spawner_.specs(), SizeIs(1)) << "nothing is started after the failure";

  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_FALSE(TickAfter(kStopNotice));
  EXPECT_THAT(spawner_.signals(), ElementsAre(Sent{Pid(0), SIGTERM}, Sent{Pid(0), SIGCONT}));
  EXPECT_FALSE(TickAfter(kGrace));
  EXPECT_THAT(spawner_.signals(), Contains(Sent{Pid(0), SIGKILL}));
  spawner_.Kill(Pid(0), SIGKILL);
  EXPECT_TRUE(TickAfter(kTick));
  EXPECT_EQ(supervisor_->exit_code(), kExitLaunchFailed);
}

TEST_F(SupervisorTest, Start_FirstSpawnFails_IsOverAtOnce) {
  Init(2);
  spawner_.fail_at = 1;
  EXPECT_FALSE(supervisor_->Start().ok());
  EXPECT_THAT(spawner_.specs(), IsEmpty());
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitLaunchFailed);
  EXPECT_THAT(spawner_.signals(), IsEmpty());
}

TEST_F(SupervisorTest, Ledger_RecordsSpawnRegistrationAndMilestones) {
  Init(2);
  clock_.Advance(absl::Milliseconds(5));
  ASSERT_TRUE(supervisor_->Start().ok());
  std::vector<RankLedger> ledger = supervisor_->Ledger();
  ASSERT_THAT(ledger, SizeIs(2));
  EXPECT_EQ(ledger[1].rank, 1);
  EXPECT_EQ(ledger[1].spawned, absl::Milliseconds(5));
  EXPECT_FALSE(ledger[1].registered.has_value());

  clock_.Advance(absl::Milliseconds(100));
  RegisterAll();
  // Worker clock times, reported after registration as the worker does (CUDA ready came before).
  ReportMilestone(0, MILESTONE_CUDA_READY, absl::Milliseconds(50));
  ReportMilestone(0, MILESTONE_NCCL_READY, absl::Milliseconds(200));
  ReportMilestone(0, MILESTONE_FIRST_STEP, absl::Milliseconds(300));

  ledger = supervisor_->Ledger();
  ASSERT_THAT(ledger, SizeIs(2));
  EXPECT_EQ(ledger[0].rank, 0);
  EXPECT_EQ(ledger[0].spawned, absl::Milliseconds(5));
  EXPECT_EQ(ledger[0].registered, absl::Milliseconds(105));
  EXPECT_EQ(ledger[0].cuda_ready, absl::Milliseconds(50));
  EXPECT_EQ(ledger[0].nccl_ready, absl::Milliseconds(200));
  EXPECT_EQ(ledger[0].first_step, absl::Milliseconds(300));
  EXPECT_EQ(ledger[1].registered, absl::Milliseconds(105));
  EXPECT_FALSE(ledger[1].cuda_ready.has_value());
  EXPECT_FALSE(ledger[1].nccl_ready.has_value());
  EXPECT_FALSE(ledger[1].first_step.has_value());
}

TEST(LastErrorLine, TheLoggersLastErrorLessItsPrefix) {
  EXPECT_EQ(LastErrorLine("I12:00:01.000 w0 worker_main.cc:10] starting\n"
                          "E12:00:01.500 w0 worker_main.cc:328] profiling the model on this worker's device failed: "
                          "INVALID_ARGUMENT: --heads are for attention models\n"
                          "W12:00:01.600 w0 worker_main.cc:360] stopping: an error of its peers\n"),
            "profiling the model on this worker's device failed: INVALID_ARGUMENT: --heads are for attention models");
  EXPECT_EQ(LastErrorLine("E12:00:01.500 w0 a.cc:1] first\nF12:00:02.000 w0 b.cc:2] second\n"), "second");
}

TEST(LastErrorLine, OtherwiseTheLastLineNamingAnErrorOrNothing) {
  EXPECT_EQ(LastErrorLine("step 1\nterminate called after throwing an instance of 'c10::Error'\n  what():  boom\n"),
            "terminate called after throwing an instance of 'c10::Error'");
  EXPECT_EQ(LastErrorLine("W12:00:01.600 w0 worker_main.cc:360] error budget\nall good\n"), "");
  EXPECT_EQ(LastErrorLine(""), "");
}

// A Python worker's traceback: the exception with the innermost frame's file:line, also with
// torch.distributed's "[rank1]: " prefix; what the interpreter printed after it (an abort) is not it.
TEST(LastErrorLine, PythonTraceback_TheExceptionAndItsFileLine) {
  EXPECT_EQ(LastErrorLine("step 1\n"
                          "Traceback (most recent call last):\n"
                          "  File \"/home/u/train.py\", line 59, in <module>\n"
                          "    main()\n"
                          "  File \"/home/u/train.py\", line 41, in main\n"
                          "    raise ValueError(\"bad batch\")\n"
                          "ValueError: bad batch\n"
                          "terminate called without an active exception\n"),
            "ValueError: bad batch (train.py:41)");
  EXPECT_EQ(PythonException("[rank1]: Traceback (most recent call last):\n"
                            "[rank1]:   File \"/x/ddp.py\", line 7, in <module>\n"
                            "[rank1]:     x = 1 / 0\n"
                            "[rank1]:         ~~^~~\n"
                            "[rank1]: ZeroDivisionError: division by zero\n"),
            "ZeroDivisionError: division by zero (ddp.py:7)");
  EXPECT_EQ(PythonException("no traceback here\nRuntimeError: x\n"), "");
}

// torchrun's variables for a rank; the launcher's environment's OMP_NUM_THREADS is kept, else 1.
TEST(ProgramEnvironment, TorchrunsVariables) {
  ProgramRank r;
  r.rank = 3;
  r.local_rank = 1;
  r.world_size = 4;
  r.local_world_size = 2;
  r.node = 1;
  r.nodes = 2;
  r.restart_count = 2;
  r.max_restarts = 5;
  r.run_id = "job-1";
  r.error_file = "/r/rank3.error.json";
  const std::vector<std::string> env =
      ProgramEnvironment({"PATH=/bin", "RANK=99"}, {"MASTER_ADDR=127.0.0.1", "MASTER_PORT=4242"}, r);
  for (const char* want : {"PATH=/bin",
                           "MASTER_ADDR=127.0.0.1",
                           "MASTER_PORT=4242",
                           "RANK=3",
                           "LOCAL_RANK=1",
                           "WORLD_SIZE=4",
                           "LOCAL_WORLD_SIZE=2",
                           "GROUP_RANK=1",
                           "GROUP_WORLD_SIZE=2",
                           "ROLE_RANK=3",
                           "ROLE_WORLD_SIZE=4",
                           "ROLE_NAME=default",
                           "TORCHELASTIC_RESTART_COUNT=2",
                           "TORCHELASTIC_MAX_RESTARTS=5",
                           "TORCHELASTIC_RUN_ID=job-1",
                           "TORCHELASTIC_USE_AGENT_STORE=True",
                           "TORCHELASTIC_ERROR_FILE=/r/rank3.error.json",
                           "OMP_NUM_THREADS=1",
                           "TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
                           "PYTHONUNBUFFERED=1"}) {
    EXPECT_THAT(env, Contains(want));
  }
  EXPECT_THAT(env, ::testing::Not(Contains("RANK=99")));  // ours wins
  EXPECT_THAT(ProgramEnvironment({"OMP_NUM_THREADS=4"}, {}, r), Contains("OMP_NUM_THREADS=4"));
}

// The `stagehand` module's line: every key it writes; a key it never writes, or a value that is
// not one, makes the line no step (never a step with a field dropped).
TEST(ParseProgramStep, EveryKey_AndBadValues_AreNoStep) {
  std::optional<ReportStepRequest> r =
      ParseProgramStep("step=3 seconds=0.25 loss=2.5 tokens=4096 samples=16 flops=1.5e+12", 1, 7);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->rank(), 1);
  EXPECT_EQ(r->incarnation(), 7);
  EXPECT_EQ(r->step(), 3);
  EXPECT_EQ(r->step_seconds(), 0.25);
  EXPECT_TRUE(r->has_loss());
  EXPECT_EQ(r->loss(), 2.5);
  EXPECT_EQ(r->tokens(), 4096);
  EXPECT_EQ(r->samples(), 16);
  EXPECT_EQ(r->flops(), 1.5e12);
  r = ParseProgramStep("step=0 seconds=0.1", 0, 0);
  ASSERT_TRUE(r.has_value());
  EXPECT_FALSE(r->has_loss());
  EXPECT_EQ(r->samples(), 0);
  EXPECT_EQ(r->flops(), 0);
  for (const char* bad : {"seconds=0.1", "step=1 samples=-1", "step=1 flops=inf", "step=1 flops=nan", "step=1 flops=-2",
                          "step=1 watts=3", "step=1 samples"}) {
    EXPECT_FALSE(ParseProgramStep(bad, 0, 0).has_value()) << bad;
  }
}

// The lines include/stagehand/step.h writes for a C++ program parse as the Python module's do: every
// field, a NaN loss, FLOPs and counts it must leave out (not finite, negative), in one file in order.
TEST(ParseProgramStep, TheCppHeadersLines) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/cpp_steps_", getpid());
  ASSERT_EQ(setenv("STAGEHAND_STEPS_FILE", path.c_str(), 1), 0);
  stagehand::StepInfo all;
  all.loss = 0.1;  // not a short binary fraction: the text must carry every digit
  all.tokens = 4096;
  all.samples = 16;
  all.flops = 1.5e12;
  stagehand::Step(all);
  stagehand::Step(std::nan(""));
  stagehand::StepInfo dropped;
  dropped.tokens = -1;
  dropped.flops = std::numeric_limits<double>::infinity();
  stagehand::Step(dropped);
  unsetenv("STAGEHAND_STEPS_FILE");
  std::ifstream in(path);
  std::vector<ReportStepRequest> steps;
  for (std::string line; std::getline(in, line);) {
    std::optional<ReportStepRequest> r = ParseProgramStep(line, 2, 0);
    ASSERT_TRUE(r.has_value()) << line;
    steps.push_back(*r);
  }
  std::remove(path.c_str());
  ASSERT_EQ(steps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(steps[i].step(), i);
    EXPECT_GE(steps[i].step_seconds(), 0);
  }
  EXPECT_EQ(steps[0].loss(), 0.1);
  EXPECT_EQ(steps[0].tokens(), 4096);
  EXPECT_EQ(steps[0].samples(), 16);
  EXPECT_EQ(steps[0].flops(), 1.5e12);
  EXPECT_TRUE(steps[1].has_loss());
  EXPECT_TRUE(std::isnan(steps[1].loss()));
  EXPECT_FALSE(steps[2].has_loss());
  EXPECT_EQ(steps[2].tokens(), 0);
  EXPECT_EQ(steps[2].flops(), 0);
}

TEST(LastErrorLine, OneLineOfBoundedLength) {
  const std::string long_error = "E12:00:01.500 w0 a.cc:1] " + std::string(1000, 'x') + "\tend\r\n";
  const std::string line = LastErrorLine(long_error);
  EXPECT_EQ(line.size(), kLastErrorChars);
  EXPECT_TRUE(absl::EndsWith(line, "...")) << line;
  EXPECT_EQ(line.find_first_of("\t\r\n"), std::string::npos);
}

// A custom model refuses --heads=4 in its worker, which exits 1 before registering: the root cause
// carries the reason from rank0.log, not only "rank 0 (pid ...) exited with code 1 after 0 steps".
TEST_F(SupervisorTest, Tick_WorkerExitsWithAnErrorInItsLog_RootCauseCarriesIt) {
  run_dir_ = absl::StrCat(::testing::TempDir(), "/supervisor_log_", getpid());
  ASSERT_EQ(mkdir(run_dir_.c_str(), 0755) == 0 || errno == EEXIST, true);
  std::ofstream(run_dir_ + "/rank0.log")
      << "I12:00:01.000 w0 worker_main.cc:10] starting\n"
         "E12:00:01.500 w0 worker_main.cc:328] profiling the model on this worker's device failed: INVALID_ARGUMENT: "
         "--heads, --kv_heads are for attention models; mlp-lm has no attention: drop them\n";
  Init(2);
  ASSERT_TRUE(supervisor_->Start().ok());
  spawner_.Exit(Pid(0), 1);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_EQ(supervisor_->root_cause(),
            absl::StrCat("rank 0 (pid ", Pid(0),
                         ") exited with code 1 after 0 steps: profiling the model on this "
                         "worker's device failed: INVALID_ARGUMENT: --heads, --kv_heads are for attention models; "
                         "mlp-lm has no attention: drop them"));
  unlink((run_dir_ + "/rank0.log").c_str());
  rmdir(run_dir_.c_str());
}

class LossTest : public SupervisorTest {
 protected:
  void Loss(int rank, int64_t step, double loss) {
    ReportStepRequest r;
    r.set_rank(rank);
    r.set_incarnation(1);
    r.set_step(step);
    r.set_step_seconds(0.01);
    r.set_has_loss(true);
    r.set_loss(loss);
    ASSERT_TRUE(state_->ReportStep(r).ok());
  }
};

// A loss that is not finite five steps in a row stops the run (exit 1), advising a lower learning rate.
TEST_F(LossTest, NonFiniteFiveStepsInARow_StopsExitOneAdvisingALowerLr) {
  Init(2);
  StartAndRegisterAll();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Loss(1, 0, 5.5);
  for (int step = 1; step <= 4; ++step) Loss(1, step, nan);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_FALSE(state_->stopping()) << "four in a row are not yet five";
  Loss(1, 5, nan);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_TRUE(state_->stopping());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_EQ(supervisor_->root_cause(),
            "the loss was NaN at 5 steps in a row (2-6) on rank 1: the training diverged; pass a lower --lr (this "
            "run's: 0)");
}

// A loaded machine: the supervisor's tick sees seven non-finite steps at once. The line names the
// five that stopped the run, as on an idle one (it said "6 steps in a row" under load).
TEST_F(LossTest, MoreThanFiveNonFiniteInOneTick_TheLineNamesFive) {
  Init(1);
  StartAndRegisterAll();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int step = 3; step < 10; ++step) Loss(0, step, nan);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_TRUE(state_->stopping());
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("the loss was NaN at 5 steps in a row (4-8) on rank 0"));
}

TEST_F(LossTest, AFiniteLossBetween_ResetsTheCount) {
  Init(1);
  StartAndRegisterAll();
  const double inf = std::numeric_limits<double>::infinity();
  for (int step = 0; step < 4; ++step) Loss(0, step, inf);
  Loss(0, 4, 3.0);
  for (int step = 5; step < 9; ++step) Loss(0, step, inf);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_FALSE(state_->stopping());
  Loss(0, 9, inf);
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("the loss was infinite at 5 steps in a row (6-10) on rank 0"));
}

// Shorter than five steps, every loss non-finite: the run still fails at its end.
TEST_F(LossTest, RunEndsWithEveryLossNonFinite_ExitOne) {
  Init(1);
  StartAndRegisterAll();
  for (int step = 0; step < 2; ++step) Loss(0, step, std::nan(""));
  Finish(0, true, 2);
  spawner_.Exit(Pid(0), 0);
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("the loss was NaN at 2 steps in a row (1-2) on rank 0"));
}

TEST_F(LossTest, FiniteLosses_Succeed) {
  Init(1);
  StartAndRegisterAll();
  for (int step = 0; step < 7; ++step) Loss(0, step, 5.0 - step * 0.1);
  Finish(0, true, 7);
  spawner_.Exit(Pid(0), 0);
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitSuccess);
}

}  // namespace
}  // namespace stagehand
