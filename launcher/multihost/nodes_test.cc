// Unit tests of a job across several hosts, without processes or sockets: CoordinatorState's agents
// (registration, the world, heartbeats, exits, the long poll, a lost connection), node 0's Supervisor
// over remote ranks, and the agent (NodeAgent) over a FakeAgentClient, a FakeProcessSpawner and one
// fake clock; and the checks and notes of nodes.h.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/checkpoint.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/multihost/fake_agent_client.h"
#include "launcher/supervise/fake_clock.h"
#include "launcher/supervise/fake_process.h"
#include "launcher/multihost/node_agent.h"
#include "launcher/multihost/nodes.h"
#include "launcher/supervise/program_gpus.h"
#include "launcher/supervise/supervisor.h"
#include "telemetry/fake_gpu_monitor.h"

namespace stagehand {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::SizeIs;

JobSpec CpuJob(int workers) {
  JobSpec job;
  job.set_device("cpu");
  job.set_workers(workers);
  job.set_model("allreduce");
  job.set_steps(5);
  Timeouts& t = *job.mutable_timeouts();
  t.set_register_ms(60000);
  t.set_heartbeat_interval_ms(100);
  t.set_heartbeat_timeout_ms(10000);
  t.set_progress_timeout_ms(60000);
  t.set_grace_ms(1000);
  return job;
}

NodeState Node0(int workers) {
  NodeState n;
  n.host = "h0";
  n.address = "198.18.0.11";
  n.device = "cpu";
  n.workers = workers;
  return n;
}

RegisterAgentRequest Agent(int node, int workers, int64_t incarnation = 5) {
  RegisterAgentRequest r;
  r.set_node_rank(node);
  r.set_incarnation(incarnation);
  r.set_host("h");
  r.set_pid(100 + node);
  r.set_device("cpu");
  r.set_workers(workers);
  return r;
}

// RegisterAgentAsync's answer, kept for the test to look at.
struct Answer {
  absl::Mutex mu;
  std::optional<absl::StatusOr<RegisterAgentResponse>> value ABSL_GUARDED_BY(mu);
  CoordinatorState::AgentCallback Callback() {
    return [this](absl::StatusOr<RegisterAgentResponse> r) {
      absl::MutexLock lock(&mu);
      value = std::move(r);
    };
  }
  std::optional<absl::StatusOr<RegisterAgentResponse>> Get() {
    absl::MutexLock lock(&mu);
    return value;
  }
};

const absl::Time kFar = absl::InfiniteFuture();

// Three hosts: node 0 with 2 workers, nodes 1 and 2 with 1 each, both registered.
class ThreeNodes : public ::testing::Test {
 protected:
  ThreeNodes() : state_(CpuJob(2), "job-1", "secret-of-the-job-0123456789abcd", clock_.AsFunction()) {
    state_.ExpectNodes(3, Node0(2));
  }
  void JoinBoth() {
    state_.RegisterAgentAsync(Agent(1, 1), "198.18.0.12", kFar, a1_.Callback());
    state_.RegisterAgentAsync(Agent(2, 1), "198.18.0.13", kFar, a2_.Callback());
  }
  FakeClock clock_;
  CoordinatorState state_;
  Answer a1_, a2_;
};

TEST_F(ThreeNodes, RegisterAgent_WaitsForTheWorld_ThenGetsItsRanksAndTheSecret) {
  JoinBoth();
  EXPECT_FALSE(a1_.Get().has_value());
  EXPECT_TRUE(state_.AllNodesRegistered());
  EXPECT_FALSE(state_.world_fixed());
  state_.SetWorld(CpuJob(2));
  ASSERT_TRUE(a1_.Get().has_value());
  ASSERT_TRUE(a1_.Get()->ok()) << a1_.Get()->status();
  const RegisterAgentResponse r1 = **a1_.Get(), r2 = **a2_.Get();
  EXPECT_EQ(r1.first_rank(), 2);
  EXPECT_EQ(r2.first_rank(), 3);
  EXPECT_EQ(r1.job().workers(), 4);  // the world
  EXPECT_EQ(r1.secret(), "secret-of-the-job-0123456789abcd");
  EXPECT_EQ(r2.address(), "198.18.0.13");
  EXPECT_EQ(state_.job().workers(), 4);
  EXPECT_THAT(state_.Workers(), SizeIs(4));
  EXPECT_EQ(state_.NodeOfRank(1), 0);
  EXPECT_EQ(state_.NodeOfRank(2), 1);
  EXPECT_EQ(state_.NodeOfRank(3), 2);
}

TEST_F(ThreeNodes, RegisterAgent_NodeRankOutOfRange_IsInvalidArgument) {
  state_.RegisterAgentAsync(Agent(3, 1), "198.18.0.14", kFar, a1_.Callback());
  ASSERT_TRUE(a1_.Get().has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(a1_.Get()->status())) << a1_.Get()->status();
  EXPECT_THAT(std::string(a1_.Get()->status().message()), HasSubstr("--node_rank=1 to 2"));
}

TEST_F(ThreeNodes, RegisterAgent_OtherDeviceKind_IsInvalidArgument) {
  RegisterAgentRequest r = Agent(1, 1);
  r.set_device("cuda");
  state_.RegisterAgentAsync(r, "198.18.0.12", kFar, a1_.Callback());
  EXPECT_TRUE(absl::IsInvalidArgument(a1_.Get()->status())) << a1_.Get()->status();
}

TEST_F(ThreeNodes, RegisterAgent_AfterTheWorldIsFixed_IsFailedPrecondition) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  Answer late;
  state_.RegisterAgentAsync(Agent(1, 1, /*incarnation=*/6), "198.18.0.12", kFar, late.Callback());
  EXPECT_TRUE(absl::IsFailedPrecondition(late.Get()->status())) << late.Get()->status();
}

TEST_F(ThreeNodes, RegisterAgent_SameNodeFromAnotherHost_IsAlreadyExists) {
  state_.RegisterAgentAsync(Agent(1, 1), "198.18.0.12", kFar, a1_.Callback());
  Answer twin;
  state_.RegisterAgentAsync(Agent(1, 1), "198.18.0.99", kFar, twin.Callback());
  EXPECT_TRUE(absl::IsAlreadyExists(twin.Get()->status())) << twin.Get()->status();
}

TEST_F(ThreeNodes, RegisterAgent_JobStopsBeforeTheWorld_IsFailedPreconditionWithTheReason) {
  state_.RegisterAgentAsync(Agent(1, 1), "198.18.0.12", kFar, a1_.Callback());
  state_.Stop("node 2 did not join", "the coordinator");
  ASSERT_TRUE(a1_.Get().has_value());
  EXPECT_TRUE(absl::IsFailedPrecondition(a1_.Get()->status()));
  EXPECT_THAT(std::string(a1_.Get()->status().message()), HasSubstr("node 2 did not join"));
}

// A program job: each node runs its own command line's program, so an agent's must be node 0's; one
// that is not (other arguments, none) is refused and the job stops, ending the other agents' waits.
TEST(ProgramNodes, RegisterAgent_OtherProgram_IsInvalidArgumentAndStopsTheJob) {
  FakeClock clock;
  CoordinatorState state(CpuJob(2), "job-1", "secret-of-the-job-0123456789abcd", clock.AsFunction());
  NodeState node0 = Node0(2);
  node0.program = {"python3", "train.py"};
  state.ExpectNodes(3, node0);
  RegisterAgentRequest same = Agent(1, 1);
  same.add_program("python3");
  same.add_program("train.py");
  Answer a1, a2;
  state.RegisterAgentAsync(same, "198.18.0.12", kFar, a1.Callback());
  EXPECT_FALSE(a1.Get().has_value());  // the same program: waits for the world
  RegisterAgentRequest other = Agent(2, 1);
  other.add_program("python3");
  other.add_program("train.py");
  other.add_program("--steps=3");
  state.RegisterAgentAsync(other, "198.18.0.13", kFar, a2.Callback());
  ASSERT_TRUE(a2.Get().has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(a2.Get()->status())) << a2.Get()->status();
  EXPECT_THAT(std::string(a2.Get()->status().message()),
              HasSubstr("node 2 runs -- python3 train.py --steps=3 but node 0 runs -- python3 train.py"));
  ASSERT_TRUE(state.stop_reason().has_value());
  ASSERT_TRUE(a1.Get().has_value());
  EXPECT_TRUE(absl::IsFailedPrecondition(a1.Get()->status())) << a1.Get()->status();
  EXPECT_THAT(std::string(a1.Get()->status().message()), HasSubstr("node 2 runs"));
}

TEST(ProgramNodes, RegisterAgent_NoProgramAgainstNodeZerosProgram_AndTheReverse_AreRefused) {
  for (bool node0_program : {true, false}) {
    FakeClock clock;
    CoordinatorState state(CpuJob(1), "job-1", "secret-of-the-job-0123456789abcd", clock.AsFunction());
    NodeState node0 = Node0(1);
    if (node0_program) node0.program = {"python3", "train.py"};
    state.ExpectNodes(2, node0);
    RegisterAgentRequest r = Agent(1, 1);
    if (!node0_program) r.add_program("python3");
    Answer a;
    state.RegisterAgentAsync(r, "198.18.0.12", kFar, a.Callback());
    ASSERT_TRUE(a.Get().has_value());
    EXPECT_TRUE(absl::IsInvalidArgument(a.Get()->status())) << a.Get()->status();
    EXPECT_THAT(std::string(a.Get()->status().message()), HasSubstr("no program (a job of ours)"));
  }
}

TEST(ProgramNodes, SetWorld_TheStoresAddressGoesToEveryAgent) {
  FakeClock clock;
  CoordinatorState state(CpuJob(1), "job-1", "secret-of-the-job-0123456789abcd", clock.AsFunction());
  NodeState node0 = Node0(1);
  node0.program = {"python3", "train.py"};
  state.ExpectNodes(2, node0);
  RegisterAgentRequest r = Agent(1, 1);
  r.add_program("python3");
  r.add_program("train.py");
  Answer a;
  state.RegisterAgentAsync(r, "198.18.0.12", kFar, a.Callback());
  state.SetWorld(CpuJob(1), "198.18.0.11", 41234);
  ASSERT_TRUE(a.Get().has_value());
  ASSERT_TRUE(a.Get()->ok()) << a.Get()->status();
  EXPECT_EQ((*a.Get())->store_host(), "198.18.0.11");
  EXPECT_EQ((*a.Get())->store_port(), 41234);
}

// Nodes on one machine (loopback, network namespaces): each agent hears how many workers of the job
// share its machine's cores, its own among them; an agent whose machine is unknown counts its own.
TEST(NodesOnOneMachine, RegisterAgent_AnswersTheWorkersOfEveryNodeOnItsMachine) {
  FakeClock clock;
  CoordinatorState state(CpuJob(2), "job-1", "secret-of-the-job-0123456789abcd", clock.AsFunction());
  NodeState node0 = Node0(2);
  node0.machine = "machine-a";
  state.ExpectNodes(4, node0);
  const struct {
    int workers;
    const char* machine;
  } agents[] = {{1, "machine-a"}, {4, "machine-b"}, {1, ""}};
  Answer answers[3];
  for (int k = 1; k <= 3; ++k) {
    RegisterAgentRequest r = Agent(k, agents[k - 1].workers);
    r.set_machine(agents[k - 1].machine);
    state.RegisterAgentAsync(r, absl::StrCat("198.18.0.", 11 + k), kFar, answers[k - 1].Callback());
  }
  state.SetWorld(CpuJob(2));
  const int want[] = {3, 4, 1};
  for (int k = 1; k <= 3; ++k) {
    ASSERT_TRUE(answers[k - 1].Get().has_value() && answers[k - 1].Get()->ok()) << "node " << k;
    EXPECT_EQ((*answers[k - 1].Get())->workers_on_machine(), want[k - 1]) << "node " << k;
  }
  const std::vector<NodeState> nodes = state.Nodes();
  EXPECT_EQ(WorkersOnMachine(nodes, 0), 3);  // node 0's own workers share machine-a with node 1's
  EXPECT_EQ(nodes[1].machine, "machine-a");
}

TEST_F(ThreeNodes, AgentHeartbeat_StaleIncarnation_IsAborted) {
  JoinBoth();
  AgentHeartbeatRequest h;
  h.set_node_rank(1);
  h.set_incarnation(4);
  EXPECT_TRUE(absl::IsAborted(state_.AgentHeartbeat(h).status()));
  h.set_incarnation(5);
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  EXPECT_FALSE(state_.AgentHeartbeat(h)->stop());
  state_.Stop("rank 0 failed", "rank 0");
  EXPECT_TRUE(state_.AgentHeartbeat(h)->stop());
  EXPECT_EQ(state_.AgentHeartbeat(h)->stop_reason(), "rank 0 failed");
}

// An agent's SIGTERM reaches node 0's launcher once (JobRun acts on it); every heartbeat answer then
// carries the checkpoint-and-stop step.
TEST_F(ThreeNodes, AgentHeartbeat_TermSignal_TakenOnce_AndTheStopStepAnswered) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  EXPECT_FALSE(state_.TakeNodeSignal().has_value());
  AgentHeartbeatRequest h;
  h.set_node_rank(2);
  h.set_incarnation(5);
  h.set_term_signal(SIGTERM);
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  h.set_node_rank(1);
  h.set_term_signal(SIGHUP);  // a second node's: the first one asked already
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  std::optional<CoordinatorState::NodeSignal> got = state_.TakeNodeSignal();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->signal, SIGTERM);
  EXPECT_EQ(got->node, 2);
  EXPECT_FALSE(state_.TakeNodeSignal().has_value());
  h.set_term_signal(0);
  EXPECT_EQ(state_.AgentHeartbeat(h)->checkpoint_and_stop_at(), 0);
  const int64_t at = state_.RequestCheckpointAndStop();
  EXPECT_EQ(state_.AgentHeartbeat(h)->checkpoint_and_stop_at(), at);
}

TEST_F(ThreeNodes, ReportWorkerExit_RecordedOnce_AndOnlyForTheNodesOwnRanks) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  ReportWorkerExitRequest e;
  e.set_node_rank(1);
  e.set_incarnation(5);
  e.set_rank(3);  // node 2's
  e.set_signal(9);
  EXPECT_TRUE(absl::IsInvalidArgument(state_.ReportWorkerExit(e)));
  e.set_rank(2);
  e.set_pid(777);
  EXPECT_TRUE(state_.ReportWorkerExit(e).ok());
  e.set_signal(15);  // a retry may not rewrite what happened
  EXPECT_TRUE(state_.ReportWorkerExit(e).ok());
  ASSERT_EQ(state_.RemoteExits().count(2), 1u);
  EXPECT_EQ(state_.RemoteExits().at(2).signal, 9);
  EXPECT_EQ(state_.RemoteExits().at(2).pid, 777);
}

TEST_F(ThreeNodes, AgentWaitForStop_CompletesAtOnceWhenTheJobStops) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  absl::Mutex mu;
  std::optional<absl::StatusOr<WaitForStopResponse>> got;
  state_.AgentWaitForStopAsync(2, 5, 0, false, kFar, [&](absl::StatusOr<WaitForStopResponse> r) {
    absl::MutexLock lock(&mu);
    got = std::move(r);
  });
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(got.has_value());
  }
  state_.Stop("rank 3 (node 2) was killed by signal 9", "rank 3");
  absl::MutexLock lock(&mu);
  ASSERT_TRUE(got.has_value() && got->ok());
  EXPECT_EQ((*got)->reason(), "rank 3 (node 2) was killed by signal 9");
}

TEST_F(ThreeNodes, AgentDisconnected_WhileItsRanksRun_MarksTheNodeLost_NotOnceTheyEnded) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  state_.AgentDisconnected(1, 5);
  EXPECT_TRUE(state_.Nodes()[1].lost);
  ReportWorkerExitRequest e;
  e.set_node_rank(2);
  e.set_incarnation(5);
  e.set_rank(3);
  e.set_exit_code(0);
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  state_.AgentDisconnected(2, 5);  // its agent leaving after its workers: not a loss
  EXPECT_FALSE(state_.Nodes()[2].lost);
}

// --- restarts across hosts (--max_restarts) and the agents' steps ---

ReportWorkerExitRequest Exit(int node, int rank, int exit_code, int64_t restart_count = 0) {
  ReportWorkerExitRequest e;
  e.set_node_rank(node);
  e.set_incarnation(5);
  e.set_rank(rank);
  e.set_pid(700 + rank);
  e.set_exit_code(exit_code);
  e.set_restart_count(restart_count);
  return e;
}

// A rank of an agent's stopped by the job's SIGTERM.
ReportWorkerExitRequest StoppedBySigterm(int node, int rank) {
  ReportWorkerExitRequest e = Exit(node, rank, -1);
  e.set_signal(SIGTERM);
  return e;
}

// An agent's long poll, kept for the test to look at.
struct StopAnswer {
  absl::Mutex mu;
  std::optional<absl::StatusOr<WaitForStopResponse>> value ABSL_GUARDED_BY(mu);
  CoordinatorState::StopCallback Callback() {
    return [this](absl::StatusOr<WaitForStopResponse> r) {
      absl::MutexLock lock(&mu);
      value = std::move(r);
    };
  }
  std::optional<absl::StatusOr<WaitForStopResponse>> Get() {
    absl::MutexLock lock(&mu);
    return value;
  }
};

TEST_F(ThreeNodes, Restart_ForgetsTheAgentsExits_AndALateOneOfTheStoppedAttemptIsIgnored) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  ASSERT_TRUE(state_.ReportWorkerExit(Exit(1, 2, 1)).ok());
  EXPECT_EQ(state_.RemoteExits().count(2), 1u);
  EXPECT_TRUE(absl::IsFailedPrecondition(state_.Restart()));  // running: nothing to restart
  state_.Stop("rank 2 (node 1) exited with code 1", "the launcher");
  ASSERT_TRUE(state_.Restart("rank 2 (node 1) exited with code 1").ok());
  EXPECT_EQ(state_.attempt(), 1);
  EXPECT_TRUE(state_.RemoteExits().empty());
  ASSERT_TRUE(state_.ReportWorkerExit(Exit(2, 3, 15)).ok());  // attempt 0's, late: not this attempt's
  EXPECT_TRUE(state_.RemoteExits().empty());
  ASSERT_TRUE(state_.ReportWorkerExit(Exit(2, 3, 1, /*restart_count=*/1)).ok());
  EXPECT_EQ(state_.RemoteExits().count(3), 1u);
}

// The coordinator decides: an agent whose workers are gone waits past the stop for node 0's next
// attempt, which comes with the restart's cause and the attempt's c10d store; a wait of an older
// attempt hears of the newer one at once.
TEST_F(ThreeNodes, AgentWaitUntilRestart_IgnoresTheStop_EndsWhenNodeZeroStartsTheNextAttempt) {
  JoinBoth();
  state_.SetWorld(CpuJob(2), "198.18.0.11", 41234);
  StopAnswer wait;
  state_.AgentWaitForStopAsync(1, 5, /*restart_count=*/0, /*until_restart=*/true, kFar, wait.Callback());
  state_.Stop("rank 2 (node 1) exited with code 1", "the launcher");
  EXPECT_FALSE(wait.Get().has_value());
  ASSERT_TRUE(state_.Restart("rank 2 (node 1 at 198.18.0.12) exited with code 1: ValueError: bad").ok());
  EXPECT_FALSE(wait.Get().has_value());  // node 0 waits out its backoff first
  state_.SetProgramStore("198.18.0.11", 41300);
  EXPECT_EQ(state_.StartAttempt(), 1);
  ASSERT_TRUE(wait.Get().has_value());
  ASSERT_TRUE(wait.Get()->ok()) << wait.Get()->status();
  const WaitForStopResponse r = **wait.Get();
  EXPECT_EQ(r.restart_count(), 1);
  EXPECT_EQ(r.reason(), "rank 2 (node 1 at 198.18.0.12) exited with code 1: ValueError: bad");
  EXPECT_EQ(r.store_host(), "198.18.0.11");
  EXPECT_EQ(r.store_port(), 41300);
  StopAnswer late;
  state_.AgentWaitForStopAsync(2, 5, /*restart_count=*/0, /*until_restart=*/false, kFar, late.Callback());
  ASSERT_TRUE(late.Get().has_value() && late.Get()->ok());
  EXPECT_EQ((*late.Get())->restart_count(), 1);
  StopAnswer current;  // attempt 1's own wait: the stop of attempt 1, not a restart
  state_.AgentWaitForStopAsync(2, 5, /*restart_count=*/1, /*until_restart=*/false, kFar, current.Callback());
  EXPECT_FALSE(current.Get().has_value());
  state_.Stop("rank 0 failed", "rank 0");
  ASSERT_TRUE(current.Get().has_value() && current.Get()->ok());
  EXPECT_EQ((*current.Get())->restart_count(), 0);
  EXPECT_EQ((*current.Get())->reason(), "rank 0 failed");
}

TEST_F(ThreeNodes, AgentWaitUntilRestart_NodeZeroDoneWithoutOne_IsUnavailable) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  StopAnswer wait;
  state_.AgentWaitForStopAsync(1, 5, 0, /*until_restart=*/true, kFar, wait.Callback());
  state_.Stop("interrupted by SIGINT", "the launcher");
  EXPECT_FALSE(wait.Get().has_value());
  state_.Shutdown();
  ASSERT_TRUE(wait.Get().has_value());
  EXPECT_TRUE(absl::IsUnavailable(wait.Get()->status())) << wait.Get()->status();
}

// The agent replaces its wait for the stop with its wait for the restart: the first one's cancellation,
// reaching node 0 once it restarted (the exits forgotten), is no loss; the second one's is.
TEST_F(ThreeNodes, AgentDisconnected_TheStoppedAttemptsWaitIsNoLoss_TheRestartWaitIs) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  state_.Stop("rank 2 failed", "the launcher");
  ASSERT_TRUE(state_.Restart().ok());
  state_.AgentDisconnected(1, 5, /*restart_count=*/0, /*until_restart=*/false);
  EXPECT_FALSE(state_.Nodes()[1].lost);
  state_.AgentDisconnected(1, 5, /*restart_count=*/0, /*until_restart=*/true);
  EXPECT_TRUE(state_.Nodes()[1].lost);
}

// A program job's steps of an agent's ranks come with its heartbeats: recorded once, for its own
// ranks only, and they are the ranks' progress (node 0's hang check reads it).
TEST_F(ThreeNodes, AgentHeartbeat_StepsOfItsOwnRanks_RecordedOnce_AsTheirProgress) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  clock_.Advance(absl::Seconds(1));
  AgentHeartbeatRequest h;
  h.set_node_rank(1);
  h.set_incarnation(5);
  for (const auto& [rank, step] : std::vector<std::pair<int, int>>{{2, 0}, {3, 0}, {2, 0}, {2, 1}}) {
    ReportStepRequest& r = *h.add_steps();
    r.set_rank(rank);
    r.set_step(step);
    r.set_incarnation(1);
    r.set_has_loss(true);
    r.set_loss(2.5);
  }
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());  // a retry of the same heartbeat
  const std::vector<ReportStepRequest> steps = state_.Steps();
  ASSERT_THAT(steps, SizeIs(2));  // rank 3 is node 2's
  EXPECT_EQ(steps[0].rank(), 2);
  EXPECT_EQ(steps[1].step(), 1);
  const std::vector<WorkerState> workers = state_.Workers();
  EXPECT_EQ(workers[2].steps_done, 2);
  EXPECT_EQ(workers[2].last_progress, clock_.Now());
  EXPECT_EQ(workers[3].steps_done, 0);
}

// An agent's backlog of the attempt that was restarted, arriving after the restart: its steps are kept
// (steps.csv), but are no progress of the new attempt, whose hang check counts from its own first step.
TEST_F(ThreeNodes, AgentHeartbeat_StepsOfARestartedAttempt_KeptButNoProgressOfTheNewOne) {
  JoinBoth();
  state_.SetWorld(CpuJob(2));
  state_.Stop("rank 2 failed", "the launcher");
  ASSERT_TRUE(state_.Restart().ok());
  clock_.Advance(absl::Seconds(1));
  AgentHeartbeatRequest h;
  h.set_node_rank(1);
  h.set_incarnation(5);
  for (int incarnation : {1, 2}) {
    ReportStepRequest& r = *h.add_steps();
    r.set_rank(2);
    r.set_step(incarnation == 1 ? 7 : 0);
    r.set_incarnation(incarnation);
  }
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  EXPECT_THAT(state_.Steps(), SizeIs(2));
  EXPECT_EQ(state_.Workers()[2].steps_done, 1);  // attempt 1's step 0, not attempt 0's step 7
  const absl::Time first_read = clock_.Now();    // the startup ledger's first_step: when it was read
  EXPECT_EQ(state_.Workers()[2].milestones.at(MILESTONE_FIRST_STEP), first_read);
  h.clear_steps();
  ReportStepRequest& old = *h.add_steps();
  old.set_rank(2);
  old.set_step(8);
  old.set_incarnation(1);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  EXPECT_THAT(state_.Steps(), SizeIs(3));
  EXPECT_EQ(state_.Workers()[2].steps_done, 1);
  EXPECT_EQ(state_.Workers()[2].last_progress, clock_.Now() - absl::Seconds(1));
  EXPECT_EQ(state_.Workers()[2].milestones.at(MILESTONE_FIRST_STEP), first_read);
}

// --- node 0's Supervisor over remote ranks ---

class NodeZeroSupervisor : public ThreeNodes {
 protected:
  void StartWorld(JobSpec job = CpuJob(2)) {
    JoinBoth();
    state_.SetWorld(job);
    SupervisorOptions o;
    o.worker_binary = "/w";
    o.coordinator_address = "198.18.0.11:29500";
    o.run_dir = "/tmp/x";
    o.first_rank = 0;
    o.local_workers = 2;
    o.worker_args = {"--listen_host=198.18.0.11"};
    supervisor_ = std::make_unique<Supervisor>(&state_, &spawner_, o, clock_.AsFunction());
    ASSERT_TRUE(supervisor_->Start().ok());
  }
  void Beat(int node) {
    AgentHeartbeatRequest h;
    h.set_node_rank(node);
    h.set_incarnation(5);
    ASSERT_TRUE(state_.AgentHeartbeat(h).ok());
  }
  // Past the stop notice, node 0's ranks get SIGTERM (and exit by it: SetExitOnSignal) while the
  // `beating` agents stay alive; then node 2's rank 3 reports its exit by SIGTERM: every rank is gone.
  void StopNoticeThenNodeTwoStopped(std::initializer_list<int> beating = {1, 2}) {
    clock_.Advance(absl::Milliseconds(600));
    for (int node : beating) Beat(node);
    EXPECT_FALSE(supervisor_->Tick());
    ASSERT_TRUE(state_.ReportWorkerExit(StoppedBySigterm(2, 3)).ok());
  }
  FakeProcessSpawner spawner_;
  std::unique_ptr<Supervisor> supervisor_;
};

TEST_F(NodeZeroSupervisor, Start_SpawnsOnlyNodeZerosRanks_WithTheNodeArgs) {
  StartWorld();
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  EXPECT_THAT(spawner_.specs()[1].argv, Contains("--worker_index=1"));
  EXPECT_THAT(spawner_.specs()[1].argv, Contains("--listen_host=198.18.0.11"));
}

TEST_F(NodeZeroSupervisor, RemoteWorkerKilled_IsTheRootCause_NamingNodeHostAndRank) {
  StartWorld();
  ReportWorkerExitRequest e;
  e.set_node_rank(2);
  e.set_incarnation(5);
  e.set_rank(3);
  e.set_pid(4242);
  e.set_exit_code(-1);
  e.set_signal(SIGKILL);
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("rank 3 (node 2 at 198.18.0.13"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("pid 4242"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("killed by signal 9"));
  EXPECT_TRUE(state_.stopping());
}

// The worker's own last error line, which its agent read from its log, is in node 0's root cause.
TEST_F(NodeZeroSupervisor, RemoteWorkerExitsWithAnError_RootCauseCarriesItsLastErrorLine) {
  StartWorld();
  ReportWorkerExitRequest e;
  e.set_node_rank(1);
  e.set_incarnation(5);
  e.set_rank(2);
  e.set_pid(4243);
  e.set_exit_code(1);
  e.set_last_error("profiling the model on this worker's device failed: INVALID_ARGUMENT: drop --heads");
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(),
              HasSubstr("exited with code 1 after 0 steps: profiling the model on this worker's device failed: "
                        "INVALID_ARGUMENT: drop --heads"));
}

// srun --kill-on-bad-exit=1 sends node 0 SIGTERM as soon as the agent of a failed rank exits, which
// can be before the tick that judges the exit the agent reported: that failure stays the root cause.
TEST_F(NodeZeroSupervisor, RemoteExitReportedBeforeSigterm_StaysTheRootCause) {
  StartWorld();
  ReportWorkerExitRequest e;
  e.set_node_rank(1);
  e.set_incarnation(5);
  e.set_rank(2);
  e.set_pid(4244);
  e.set_exit_code(1);
  e.set_last_error("ValueError: bad batch at step 2 on rank 2 (train.py:41)");
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  supervisor_->Interrupt(SIGTERM, /*force=*/false);
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("rank 2 (node 1 at 198.18.0.12"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("ValueError: bad batch at step 2 on rank 2 (train.py:41)"));
}

// The same with restarts left: the signal ends the run; the failure is its cause, and no restart follows.
TEST_F(NodeZeroSupervisor, RemoteExitReportedBeforeSigterm_RestartsLeft_NoRestart) {
  JobSpec job = CpuJob(2);
  job.set_max_restarts(2);
  StartWorld(job);
  spawner_.SetExitOnSignal(true);
  ASSERT_TRUE(state_.ReportWorkerExit(Exit(1, 2, 1)).ok());
  supervisor_->Interrupt(SIGTERM, /*force=*/false);
  StopNoticeThenNodeTwoStopped();
  EXPECT_TRUE(supervisor_->Tick());  // every rank gone: over, no restart
  EXPECT_EQ(state_.attempt(), 0);
  EXPECT_EQ(supervisor_->restarts(), 0);
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("rank 2 (node 1 at 198.18.0.12"));
}

// A SIGTERM before any failure: the job stops by it (exit 143), and a remote exit that follows (the
// agent stopped its rank) does not displace it.
TEST_F(NodeZeroSupervisor, SigtermBeforeAnyFailure_IsTheCause) {
  StartWorld();
  supervisor_->Interrupt(SIGTERM, /*force=*/false);
  ReportWorkerExitRequest e;
  e.set_node_rank(1);
  e.set_incarnation(5);
  e.set_rank(2);
  e.set_exit_code(1);
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), 128 + SIGTERM);
  EXPECT_EQ(supervisor_->root_cause(), "interrupted by SIGTERM");
}

TEST_F(NodeZeroSupervisor, RemoteWorkerNeverStarted_StopsTheJobAtOnceWithExit4_NamingRankAndWhy) {
  StartWorld();
  ReportWorkerExitRequest e;
  e.set_node_rank(2);
  e.set_incarnation(5);
  e.set_rank(3);
  e.set_spawn_error("cannot execute /w: No such file or directory");
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), kExitLaunchFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("rank 3 (node 2 at 198.18.0.13"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("could not be started: cannot execute /w"));
  EXPECT_TRUE(state_.stopping());
}

TEST_F(NodeZeroSupervisor, AgentSilentForTheAgentTimeout_IsAHangNamingTheNode_AndItsRanksAreGone) {
  StartWorld();
  clock_.Advance(kAgentTimeout / 2);
  Beat(2);
  clock_.Advance(kAgentTimeout / 2 + absl::Milliseconds(10));
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerHung);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("node 1 at 198.18.0.12"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("stopped heartbeating"));
  // Node 2 still answers: its rank ends when its agent reports it; node 0's own when they exit.
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 3);
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 1, 3);
  ReportWorkerExitRequest e;
  e.set_node_rank(2);
  e.set_incarnation(5);
  e.set_rank(3);
  e.set_exit_code(3);
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("node 1"));  // not displaced by what followed
}

TEST_F(NodeZeroSupervisor, AgentConnectionClosed_IsACrashNamingTheNode) {
  StartWorld();
  state_.AgentDisconnected(1, 5);
  supervisor_->Tick();
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("node 1 at 198.18.0.12"));
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("connection to the coordinator closed"));
}

// A rank of another node fails with restarts left: node 0 stops every node, and once every rank is
// gone (its own reaped, the others reported) restarts the job; after the backoff it starts its own
// ranks as the next incarnation and announces the attempt, which the agents' waits hear.
TEST_F(NodeZeroSupervisor, RemoteRankFails_RestartsLeft_EveryNodeStartsTheNextAttemptTogether) {
  JobSpec job = CpuJob(2);
  job.set_max_restarts(1);
  StartWorld(job);
  spawner_.SetExitOnSignal(true);
  StopAnswer wait;  // node 1's wait, once its rank is gone
  state_.AgentWaitForStopAsync(1, 5, 0, /*until_restart=*/true, kFar, wait.Callback());
  ReportWorkerExitRequest e = Exit(1, 2, 1);
  e.set_last_error("ValueError: bad batch at step 3 on rank 2 (train.py:41)");
  ASSERT_TRUE(state_.ReportWorkerExit(e).ok());
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_TRUE(state_.stopping());
  StopNoticeThenNodeTwoStopped();
  EXPECT_FALSE(supervisor_->Tick());  // every rank gone: the restart begins
  EXPECT_EQ(state_.attempt(), 1);
  EXPECT_FALSE(state_.stopping());
  EXPECT_FALSE(wait.Get().has_value());                               // the backoff first
  ASSERT_TRUE(state_.ReportWorkerExit(StoppedBySigterm(2, 3)).ok());  // attempt 0's, repeated: not judged again
  clock_.Advance(absl::Milliseconds(1000));
  Beat(1);
  Beat(2);
  EXPECT_FALSE(supervisor_->Tick());
  ASSERT_THAT(spawner_.specs(), SizeIs(4));
  EXPECT_THAT(spawner_.specs()[2].argv, Contains("--incarnation=2"));
  ASSERT_TRUE(wait.Get().has_value() && wait.Get()->ok());
  EXPECT_EQ((*wait.Get())->restart_count(), 1);
  EXPECT_THAT((*wait.Get())->reason(), HasSubstr("rank 2 (node 1 at 198.18.0.12, host h, pid 702) exited with code 1"));
  EXPECT_THAT((*wait.Get())->reason(), HasSubstr("ValueError: bad batch at step 3 on rank 2 (train.py:41)"));
  EXPECT_EQ(supervisor_->incarnation(), 2);
  // The next attempt runs: attempt 0's exits are not judged again.
  EXPECT_FALSE(supervisor_->Tick());
  EXPECT_FALSE(state_.stopping());
  EXPECT_EQ(supervisor_->exit_code(), kExitSuccess);
}

// A node lost (its agent gone) cannot start its ranks again: no restart, the job fails.
TEST_F(NodeZeroSupervisor, NodeLost_RestartsLeft_NoRestart) {
  JobSpec job = CpuJob(2);
  job.set_max_restarts(3);
  StartWorld(job);
  spawner_.SetExitOnSignal(true);
  state_.AgentDisconnected(1, 5);
  EXPECT_FALSE(supervisor_->Tick());
  StopNoticeThenNodeTwoStopped(/*beating=*/{2});  // node 1 is lost
  EXPECT_TRUE(supervisor_->Tick());
  EXPECT_EQ(state_.attempt(), 0);
  EXPECT_EQ(supervisor_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(supervisor_->root_cause(), HasSubstr("node 1 at 198.18.0.12"));
}

// --- the agent ---

RegisterAgentResponse Joined() {
  RegisterAgentResponse r;
  r.set_job_id("job-1");
  *r.mutable_job() = CpuJob(4);
  r.set_first_rank(2);
  r.set_secret("secret-of-the-job-0123456789abcd");
  r.set_address("198.18.0.12");
  return r;
}

class AgentTest : public ::testing::Test {
 protected:
  AgentTest() : client_(Joined()) {
    NodeAgentOptions o;
    o.node = {3, 1, "198.18.0.11:29500"};
    o.device = "cpu";
    o.workers = 2;
    o.worker_binary = "/w";
    o.tls = {"/c/node1.pem", "/c/node1.key", "/c/ca.pem"};
    o.incarnation = 9;
    o.host = "h1";
    agent_ = std::make_unique<NodeAgent>(&client_, &spawner_, o, clock_.AsFunction());
  }
  void JoinAndStart() {
    ASSERT_TRUE(agent_->Join().ok());
    agent_->Start("/tmp/agent-run");
  }
  FakeClock clock_;
  FakeAgentClient client_;
  FakeProcessSpawner spawner_;
  std::unique_ptr<NodeAgent> agent_;
};

TEST_F(AgentTest, Join_SendsThisHostsWorkers_ThenUsesTheSecret) {
  ASSERT_TRUE(agent_->Join().ok());
  EXPECT_EQ(client_.registered().node_rank(), 1);
  EXPECT_EQ(client_.registered().workers(), 2);
  EXPECT_EQ(client_.registered().incarnation(), 9);
  EXPECT_EQ(client_.secret(), "secret-of-the-job-0123456789abcd");
}

TEST_F(AgentTest, Start_SpawnsItsGlobalRanks_ListeningOnItsAddress_OverTls) {
  JoinAndStart();
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  const std::vector<std::string> argv = spawner_.specs()[0].argv;
  EXPECT_THAT(argv, Contains("--worker_index=2"));
  EXPECT_THAT(spawner_.specs()[1].argv, Contains("--worker_index=3"));
  EXPECT_THAT(argv, Contains("--coordinator=198.18.0.11:29500"));
  EXPECT_THAT(argv, Contains("--listen_host=198.18.0.12"));
  EXPECT_THAT(argv, Contains("--tls_cert=/c/node1.pem"));
  EXPECT_EQ(spawner_.specs()[0].secret, "secret-of-the-job-0123456789abcd");
  EXPECT_EQ(client_.wait_request().node_rank(), 1);
  EXPECT_EQ(client_.wait_request().incarnation(), 9);
}

// Two workers here and two of another node on this machine share its 8 cores: 2 threads each, not 4.
TEST_F(AgentTest, Start_OtherNodesOnThisMachine_ShareItsCores) {
  unsetenv("OMP_NUM_THREADS");  // the launcher's own setting would win
  RegisterAgentResponse joined = Joined();
  joined.set_workers_on_machine(4);
  FakeAgentClient client(joined);
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  o.machine = "machine-a";
  o.cores = 8;
  NodeAgent agent(&client, &spawner_, o, clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  EXPECT_EQ(client.registered().machine(), "machine-a");
  agent.Start("/tmp/agent-run");
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  for (const ProcessSpec& spec : spawner_.specs()) {
    EXPECT_THAT(spec.env, Contains("OMP_NUM_THREADS=2"));
    EXPECT_THAT(spec.env, ::testing::Not(Contains("OMP_NUM_THREADS=4")));
  }
}

TEST_F(AgentTest, Start_AloneOnItsMachine_OrAnOlderCoordinator_CountsItsOwnWorkers) {
  unsetenv("OMP_NUM_THREADS");
  FakeAgentClient client(Joined());  // no workers_on_machine: an older coordinator's answer
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  o.cores = 8;
  NodeAgent agent(&client, &spawner_, o, clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  EXPECT_THAT(spawner_.specs()[0].env, Contains("OMP_NUM_THREADS=4"));
}

// A program job: the agent sends its own program as typed, runs it as resolved on its own host (not
// the one node 0's answer names), with torchrun's multi-node variables and node 0's store.
TEST_F(AgentTest, Program_RunsItsOwnCommandLinesProgram_WithNodeZerosStore) {
  RegisterAgentResponse joined = Joined();
  joined.mutable_job()->set_model("");
  joined.mutable_job()->add_program("/node0/bin/python3");
  joined.mutable_job()->add_program("train.py");
  joined.mutable_job()->set_program_cwd("/node0/dir");
  joined.set_store_host("198.18.0.11");
  joined.set_store_port(41234);
  FakeAgentClient client(joined);
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  o.program = {"python3", "train.py"};
  o.program_resolved = {"/usr/bin/python3", "train.py"};
  o.program_cwd = "/here";
  NodeAgent agent(&client, &spawner_, o, clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  const RegisterAgentRequest sent = client.registered();
  EXPECT_THAT(sent.program(), ::testing::ElementsAre("python3", "train.py"));
  agent.Start("/tmp/agent-run");
  ASSERT_THAT(spawner_.specs(), SizeIs(2));
  const ProcessSpec second = spawner_.specs()[1];
  EXPECT_THAT(second.argv, ::testing::ElementsAre("/usr/bin/python3", "train.py"));
  EXPECT_EQ(second.cwd, "/here");
  for (const char* want : {"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                           "GROUP_WORLD_SIZE=3", "ROLE_RANK=3", "MASTER_ADDR=198.18.0.11", "MASTER_PORT=41234",
                           "TORCHELASTIC_RUN_ID=job-1", "TORCHELASTIC_ERROR_FILE=/tmp/agent-run/rank3.error.json"}) {
    EXPECT_THAT(second.env, Contains(want));
  }
}

TEST_F(AgentTest, Program_NodeZeroRunsNone_RefusedAtJoin) {
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  o.program = {"python3", "train.py"};
  NodeAgent agent(&client_, &spawner_, o, clock_.AsFunction());  // Joined(): a job of ours
  EXPECT_TRUE(absl::IsInvalidArgument(agent.Join()));
}

TEST_F(AgentTest, WorkersSucceed_EachExitReported_Exit0) {
  JoinAndStart();
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 0);
  EXPECT_FALSE(agent_->Tick());
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 1, 0);
  EXPECT_TRUE(agent_->Tick());
  ASSERT_THAT(client_.exits(), SizeIs(2));
  EXPECT_EQ(client_.exits()[0].rank(), 2);
  EXPECT_EQ(client_.exits()[1].rank(), 3);
  EXPECT_EQ(agent_->exit_code(), 0);
  EXPECT_THAT(agent_->verdict(), HasSubstr("done"));
}

// A worker that exits non-zero: its agent sends its last error line from its log with the exit report.
TEST_F(AgentTest, WorkerFails_ItsLastErrorLineFromItsLogGoesWithTheExitReport) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/agent_run_", getpid());
  ASSERT_TRUE(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST);
  std::ofstream(dir + "/rank2.log") << "I12:00:00.000 w2 a.cc:1] starting\n"
                                       "E12:00:01.000 w2 worker_main.cc:328] profiling failed: drop --heads\n";
  ASSERT_TRUE(agent_->Join().ok());
  agent_->Start(dir);
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 1);
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 1, 0);
  EXPECT_TRUE(agent_->Tick());
  ASSERT_THAT(client_.exits(), SizeIs(2));
  EXPECT_EQ(client_.exits()[0].last_error(), "profiling failed: drop --heads");
  EXPECT_EQ(client_.exits()[1].last_error(), "");  // exited 0: nothing read
  unlink((dir + "/rank2.log").c_str());
  rmdir(dir.c_str());
}

TEST_F(AgentTest, SpawnFails_EachRankNotStartedIsReportedOnTheFirstTick_Exit4) {
  ASSERT_TRUE(agent_->Join().ok());
  spawner_.FailNextSpawn(absl::NotFoundError("cannot execute /w: No such file or directory"));
  agent_->Start("/tmp/agent-run");
  EXPECT_TRUE(agent_->Tick());  // nothing runs here: done once node 0 has the reports
  ASSERT_THAT(client_.exits(), SizeIs(2));
  EXPECT_EQ(client_.exits()[0].rank(), 2);
  EXPECT_EQ(client_.exits()[1].rank(), 3);
  EXPECT_THAT(client_.exits()[0].spawn_error(), HasSubstr("cannot execute /w"));
  EXPECT_EQ(client_.exits()[0].pid(), 0);
  EXPECT_EQ(agent_->exit_code(), kExitLaunchFailed);
  EXPECT_THAT(agent_->verdict(), HasSubstr("could not start worker 2"));
}

// A training job with checkpoints whose run directory (node 0's) is `dir`.
RegisterAgentResponse JoinedWithCheckpoints(const std::string& dir) {
  RegisterAgentResponse r = Joined();
  JobSpec& job = *r.mutable_job();
  job.set_model("tiny");
  job.set_steps(100);
  job.set_checkpoint_every(10);
  job.set_run_dir(dir);
  return r;
}

std::string FreshDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "_", getpid());
  EXPECT_TRUE(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST);
  return dir;
}

// What rank 0 leaves of a checkpoint of `step` in `run_dir`: a shard and the manifest naming it.
void WriteCompleteCheckpoint(const std::string& run_dir, int64_t step) {
  mkdir(CheckpointsDir(run_dir).c_str(), 0755);
  const std::string dir = CheckpointDir(run_dir, step);
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0) << dir;
  CheckpointManifest m;
  m.set_format(1);
  m.set_step(step);
  m.set_model("tiny");
  std::ofstream(dir + "/rank0.safetensors") << "abc";
  CheckpointShard& shard = *m.add_shards();
  shard.set_file("rank0.safetensors");
  shard.set_bytes(3);
  ASSERT_TRUE(WriteManifest(dir, m).ok());
}

// SIGTERM to an agent of a job with checkpoints (Slurm signals every node): passed on to node 0 at
// once, its workers keep running; they end cleanly at node 0's step, and once rank 0's manifest of
// that step is there the agent says so and exits 75.
TEST_F(AgentTest, Sigterm_JobWithCheckpoints_PassedToNodeZero_ThenExit75AfterTheCheckpoint) {
  const std::string dir = FreshDir("agent_term");
  FakeAgentClient client(JoinedWithCheckpoints(dir));
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  NodeAgent agent(&client, &spawner_, o, clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  EXPECT_FALSE(agent.Tick());
  ASSERT_TRUE(agent.ForwardTerm(SIGTERM));
  EXPECT_EQ(client.last_heartbeat().term_signal(), SIGTERM);  // at once, not at the next interval
  EXPECT_FALSE(agent.ForwardTerm(SIGTERM));                   // once
  EXPECT_TRUE(spawner_.signals().empty());                    // the workers write the checkpoint
  client.CheckpointAndStopAt(21);
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 0);
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 1, 0);
  EXPECT_FALSE(agent.Tick());  // gone, but rank 0's manifest is not there yet
  EXPECT_EQ(client.last_heartbeat().term_signal(), 0);
  WriteCompleteCheckpoint(dir, 21);
  EXPECT_TRUE(agent.Tick());
  EXPECT_EQ(agent.exit_code(), kExitCheckpointedOnTerm);
  EXPECT_THAT(agent.verdict(), HasSubstr("stopped by this node's SIGTERM after a checkpoint at step 21"));
  EXPECT_THAT(agent.verdict(), HasSubstr("--resume=" + dir));
}

// Node 0's own SIGTERM asked for the checkpoint: this node's workers end cleanly; no manifest comes
// before node 0 stops serving: not a whole checkpoint, exit 143 (node 0 names the cause).
TEST_F(AgentTest, CheckpointAndStopFromNodeZero_NoManifestBeforeNodeZeroEnds_Exit143) {
  const std::string dir = FreshDir("agent_term_none");
  FakeAgentClient client(JoinedWithCheckpoints(dir));
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 1;
  o.worker_binary = "/w";
  NodeAgent agent(&client, &spawner_, o, clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  client.CheckpointAndStopAt(7);
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 0);
  EXPECT_FALSE(agent.Tick());
  client.PushStop("the job is over", "the coordinator");
  EXPECT_TRUE(agent.Tick());
  EXPECT_EQ(agent.exit_code(), 128 + SIGTERM);
  EXPECT_THAT(agent.verdict(), HasSubstr("for a checkpoint after step 7, but none is complete"));
}

// A job without checkpoints: the agent's SIGTERM is not passed on (the caller stops the workers).
TEST_F(AgentTest, Sigterm_JobWithoutCheckpoints_NotPassedOn) {
  JoinAndStart();
  EXPECT_FALSE(agent_->ForwardTerm(SIGTERM));
  EXPECT_EQ(client_.last_heartbeat().term_signal(), 0);
}

TEST_F(AgentTest, StopPushed_WorkersGetSigtermAfterTheNotice_ThenSigkill) {
  JoinAndStart();
  client_.PushStop("rank 0 (node 0) failed", "rank 0");
  agent_->Tick();
  EXPECT_TRUE(spawner_.signals().empty());  // the workers hear it from the coordinator first
  clock_.Advance(absl::Milliseconds(3 * 100 + 200));
  agent_->Tick();
  EXPECT_THAT(spawner_.signals(), Contains(FakeProcessSpawner::SentSignal{FakeProcessSpawner::kFirstPid, SIGTERM}));
  clock_.Advance(absl::Milliseconds(1000));
  agent_->Tick();
  EXPECT_THAT(spawner_.signals(), Contains(FakeProcessSpawner::SentSignal{FakeProcessSpawner::kFirstPid + 1, SIGKILL}));
  spawner_.Kill(FakeProcessSpawner::kFirstPid, SIGKILL);
  spawner_.Kill(FakeProcessSpawner::kFirstPid + 1, SIGKILL);
  EXPECT_TRUE(agent_->Tick());
  EXPECT_EQ(agent_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(agent_->verdict(), HasSubstr("the job stopped: rank 0 (node 0) failed"));
}

TEST_F(AgentTest, CoordinatorUnreachableForTheAgentTimeout_StopsTheWorkers_Lost) {
  JoinAndStart();
  client_.SetUnreachable(true);
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(kAgentHeartbeatInterval);
    agent_->Tick();
  }
  EXPECT_TRUE(spawner_.signals().empty());  // 2 s: not yet
  clock_.Advance(kAgentHeartbeatInterval + absl::Milliseconds(1));
  agent_->Tick();
  clock_.Advance(absl::Milliseconds(3 * 100 + 200));
  agent_->Tick();
  EXPECT_THAT(spawner_.signals(), Contains(FakeProcessSpawner::SentSignal{FakeProcessSpawner::kFirstPid, SIGTERM}));
  spawner_.Kill(FakeProcessSpawner::kFirstPid, SIGTERM);
  spawner_.Kill(FakeProcessSpawner::kFirstPid + 1, SIGTERM);
  EXPECT_TRUE(agent_->Tick());  // done, though the exits could not be reported
  EXPECT_EQ(agent_->exit_code(), kExitWorkerFailed);
  EXPECT_THAT(agent_->verdict(), HasSubstr("lost the coordinator"));
}

TEST_F(AgentTest, StopInAHeartbeat_StopsTheWorkersToo) {
  JoinAndStart();
  client_.StopInHeartbeat("node 2 at 198.18.0.13 was lost");
  clock_.Advance(kAgentHeartbeatInterval);
  agent_->Tick();
  clock_.Advance(absl::Milliseconds(3 * 100 + 200));
  agent_->Tick();
  EXPECT_THAT(spawner_.signals(), Contains(FakeProcessSpawner::SentSignal{FakeProcessSpawner::kFirstPid, SIGTERM}));
}

// --- nodes.h ---

// A program job on this agent: `max_restarts` as node 0's, node 0's store at 198.18.0.11:41234.
RegisterAgentResponse ProgramJoined(int max_restarts) {
  RegisterAgentResponse joined = Joined();
  joined.mutable_job()->set_model("");
  joined.mutable_job()->add_program("python3");
  joined.mutable_job()->add_program("train.py");
  joined.mutable_job()->set_max_restarts(max_restarts);
  joined.set_store_host("198.18.0.11");
  joined.set_store_port(41234);
  return joined;
}

NodeAgentOptions ProgramAgent(std::vector<std::string>* lines) {
  NodeAgentOptions o;
  o.node = {3, 1, "198.18.0.11:29500"};
  o.device = "cpu";
  o.workers = 2;
  o.worker_binary = "/w";
  o.program = {"python3", "train.py"};
  o.program_resolved = {"/usr/bin/python3", "train.py"};
  o.program_cwd = "/here";
  o.out = [lines](const std::string& line) { lines->push_back(line); };
  return o;
}

// A rank here fails with restarts left: the agent stops its other rank at node 0's stop, waits for
// node 0's next attempt (saying so), then starts both ranks again with it: the next restart count,
// that attempt's store, a line naming the cause; they succeed and the agent exits 0.
TEST_F(AgentTest, Restart_WaitsForNodeZerosNextAttempt_ThenStartsItsRanksAgainWithIt) {
  FakeAgentClient client(ProgramJoined(1));
  std::vector<std::string> lines;
  NodeAgent agent(&client, &spawner_, ProgramAgent(&lines), clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  spawner_.SetExitOnSignal(true);
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 1);
  EXPECT_FALSE(agent.Tick());
  client.PushStop("rank 2 (node 1 at 198.18.0.12, host h1, pid 1000) exited with code 1: ValueError: bad",
                  "the launcher");
  EXPECT_FALSE(agent.Tick());  // rank 3 gets SIGTERM (a program hears of no stop but signals)
  EXPECT_FALSE(agent.Tick());  // gone: the wait for node 0's decision
  ASSERT_THAT(client.exits(), SizeIs(2));
  EXPECT_EQ(client.exits()[0].restart_count(), 0);
  EXPECT_TRUE(client.wait_request().until_restart());
  EXPECT_EQ(client.wait_request().restart_count(), 0);
  ASSERT_FALSE(lines.empty());
  EXPECT_THAT(lines.back(), HasSubstr("node 1 at 198.18.0.12: the job stopped: rank 2 (node 1"));
  EXPECT_THAT(lines.back(), HasSubstr("waiting for node 0 to start the job again (restart 1 of 1)"));
  clock_.Advance(absl::Seconds(1));
  EXPECT_FALSE(agent.Tick());  // node 0's backoff: still waiting, heartbeating
  client.PushRestart(1, "rank 2 (node 1 at 198.18.0.12, host h1, pid 1000) exited with code 1: ValueError: bad",
                     "198.18.0.11", 41300);
  EXPECT_FALSE(agent.Tick());
  ASSERT_THAT(spawner_.specs(), SizeIs(4));
  for (const char* want : {"RANK=2", "TORCHELASTIC_RESTART_COUNT=1", "TORCHELASTIC_MAX_RESTARTS=1",
                           "MASTER_ADDR=198.18.0.11", "MASTER_PORT=41300"}) {
    EXPECT_THAT(spawner_.specs()[2].env, Contains(want));
  }
  EXPECT_THAT(spawner_.specs()[3].env, Contains("RANK=3"));
  EXPECT_EQ(agent.restart_count(), 1);
  EXPECT_FALSE(client.wait_request().until_restart());  // attempt 1's stop, if it comes
  EXPECT_EQ(client.wait_request().restart_count(), 1);
  EXPECT_EQ(lines.back(),
            "stagehand: node 1 at 198.18.0.12: restart 1 of 1: rank 2 (node 1 at 198.18.0.12, host h1, pid 1000) "
            "exited with code 1: ValueError: bad; starting this node's ranks 2-3 again "
            "(TORCHELASTIC_RESTART_COUNT=1; c10d store 198.18.0.11:41300)");
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 2, 0);
  spawner_.Exit(FakeProcessSpawner::kFirstPid + 3, 0);
  EXPECT_TRUE(agent.Tick());  // no restart left to wait for
  ASSERT_THAT(client.exits(), SizeIs(4));
  EXPECT_EQ(client.exits()[3].restart_count(), 1);
  EXPECT_EQ(agent.exit_code(), kExitSuccess);
  EXPECT_THAT(agent.verdict(), HasSubstr("done"));
}

// Node 0 ends without another attempt (restarts exhausted, a launch failure, an interrupt): the wait
// ends with its shutdown, and the agent exits 1 with the job's stop.
TEST_F(AgentTest, Restart_NodeZeroEndsWithoutOne_Exit1WithTheStop) {
  FakeAgentClient client(ProgramJoined(2));
  std::vector<std::string> lines;
  NodeAgent agent(&client, &spawner_, ProgramAgent(&lines), clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  spawner_.SetExitOnSignal(true);
  client.PushStop("interrupted by SIGINT", "the launcher");
  EXPECT_FALSE(agent.Tick());
  EXPECT_FALSE(agent.Tick());
  EXPECT_TRUE(client.wait_request().until_restart());
  client.EndWait(absl::UnavailableError("WaitForStop: the coordinator is shutting down: the job is over"));
  EXPECT_TRUE(agent.Tick());
  EXPECT_EQ(agent.exit_code(), kExitWorkerFailed);
  EXPECT_THAT(agent.verdict(), HasSubstr("the job stopped: interrupted by SIGINT"));
}

TEST_F(AgentTest, Restart_NodeZeroSilentWhileWaiting_EndsTheWait) {
  FakeAgentClient client(ProgramJoined(1));
  std::vector<std::string> lines;
  NodeAgent agent(&client, &spawner_, ProgramAgent(&lines), clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start("/tmp/agent-run");
  spawner_.SetExitOnSignal(true);
  client.PushStop("rank 0 failed", "the launcher");
  EXPECT_FALSE(agent.Tick());
  EXPECT_FALSE(agent.Tick());
  client.SetUnreachable(true);
  clock_.Advance(kAgentTimeout / 2);
  EXPECT_FALSE(agent.Tick());
  clock_.Advance(kAgentTimeout / 2 + absl::Milliseconds(10));
  EXPECT_TRUE(agent.Tick());
  EXPECT_EQ(agent.exit_code(), kExitWorkerFailed);
}

// A program job's ranks here report their steps into their steps files on this host: the agent sends
// the new ones with its heartbeats (each once), and a rank's last ones before its exit report.
TEST_F(AgentTest, ProgramSteps_GoToNodeZeroWithTheHeartbeats_TheLastOnesBeforeTheExit) {
  const std::string dir = FreshDir("agent_steps");
  FakeAgentClient client(ProgramJoined(0));
  std::vector<std::string> lines;
  NodeAgent agent(&client, &spawner_, ProgramAgent(&lines), clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  agent.Start(dir);
  std::ofstream(dir + "/rank2.steps") << "step=0 seconds=0.5 loss=2.5 samples=8\nstep=1 seconds=0.4 loss=2\n";
  std::ofstream(dir + "/rank3.steps") << "step=0 seconds=0.5 loss=2.5\nstep=1 seco";  // the second cut short
  EXPECT_FALSE(agent.Tick());  // read; sent with the next heartbeat
  clock_.Advance(kAgentHeartbeatInterval);
  EXPECT_FALSE(agent.Tick());
  AgentHeartbeatRequest h = client.last_heartbeat();
  ASSERT_EQ(h.steps_size(), 3);
  EXPECT_EQ(h.steps(0).rank(), 2);
  EXPECT_EQ(h.steps(1).step(), 1);
  EXPECT_EQ(h.steps(1).incarnation(), 1);
  EXPECT_EQ(h.steps(2).rank(), 3);
  EXPECT_EQ(h.steps(0).samples(), 8);
  clock_.Advance(kAgentHeartbeatInterval);
  EXPECT_FALSE(agent.Tick());
  EXPECT_EQ(client.last_heartbeat().steps_size(), 0);  // each step once
  std::ofstream(dir + "/rank2.steps", std::ios::app) << "step=2 seconds=0.4 loss=1.5\n";
  spawner_.Exit(FakeProcessSpawner::kFirstPid, 0);
  const int beats = client.heartbeats();
  EXPECT_FALSE(agent.Tick());  // no heartbeat due, but the exit goes: its steps first
  EXPECT_EQ(client.heartbeats(), beats + 1);
  ASSERT_EQ(client.last_heartbeat().steps_size(), 1);
  EXPECT_EQ(client.last_heartbeat().steps(0).step(), 2);
  ASSERT_THAT(client.exits(), SizeIs(1));
  for (const char* f : {"/rank2.steps", "/rank3.steps"}) unlink((dir + f).c_str());
  rmdir(dir.c_str());
}

// A program job on GPUs: the agent's readings of its own ranks' GPUs join the steps it sends,
// by local rank (rank 2 is this host's first GPU, rank 3 its second).
TEST_F(AgentTest, ProgramSteps_CarryThisHostsGpuTelemetry_ByLocalRank) {
  const std::string dir = FreshDir("agent_gpu_steps");
  FakeAgentClient client(ProgramJoined(0));
  std::vector<std::string> lines;
  NodeAgent agent(&client, &spawner_, ProgramAgent(&lines), clock_.AsFunction());
  ASSERT_TRUE(agent.Join().ok());
  JobSpec job;
  job.set_device("cuda");
  job.set_health("off");
  job.set_telemetry(true);
  std::vector<GpuInfo> gpus(2);
  gpus[0].uuid = "GPU-a";
  gpus[1].uuid = "GPU-b";
  auto open = [](const std::string& uuid) -> absl::StatusOr<std::unique_ptr<GpuMonitor>> {
    GpuSample s;
    s.set_sm_mhz(uuid == "GPU-a" ? 1980 : 1500);
    s.set_power_w(300);
    return std::unique_ptr<GpuMonitor>(new FakeGpuMonitor({s}, GpuHealth()));
  };
  absl::StatusOr<std::unique_ptr<ProgramGpus>> sampled = ProgramGpus::Start(
      job, gpus, open, [](const std::string&) {}, absl::Milliseconds(1));
  ASSERT_TRUE(sampled.ok()) << sampled.status();
  ASSERT_TRUE((*sampled)->AwaitSamples(1, absl::Seconds(10)));
  agent.SetProgramGpus(*std::move(sampled));
  agent.Start(dir);
  std::ofstream(dir + "/rank2.steps") << "step=0 seconds=0.5 loss=2.5\n";
  std::ofstream(dir + "/rank3.steps") << "step=0 seconds=0.5 loss=2.5\n";
  EXPECT_FALSE(agent.Tick());
  clock_.Advance(kAgentHeartbeatInterval);
  EXPECT_FALSE(agent.Tick());
  AgentHeartbeatRequest h = client.last_heartbeat();
  ASSERT_EQ(h.steps_size(), 2);
  for (const ReportStepRequest& step : h.steps()) {
    ASSERT_TRUE(step.has_telemetry()) << step.rank();
    EXPECT_GT(step.telemetry().samples(), 0);
    EXPECT_EQ(step.telemetry().sm_mhz_mean(), step.rank() == 2 ? 1980 : 1500);
  }
  for (const char* f : {"/rank2.steps", "/rank3.steps"}) unlink((dir + f).c_str());
  rmdir(dir.c_str());
}

TEST(NodeOptions, NonLoopbackWithoutTls_IsRefusedNamingTheFlags) {
  absl::Status s = CheckNodeOptions({2, 0, "198.18.0.11:29500"}, {}, "");
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), HasSubstr("pass --tls_cert, --tls_key and --tls_ca"));
}

TEST(NodeOptions, SeveralNodesOnLoopbackWithoutTokenOrTls_IsRefused) {
  absl::Status s = CheckNodeOptions({2, 0, "127.0.0.1:0"}, {}, "");
  EXPECT_THAT(std::string(s.message()), HasSubstr("--job_token_file"));
  EXPECT_TRUE(CheckNodeOptions({1, 0, "127.0.0.1:0"}, {}, "").ok());
}

TEST(NodeOptions, AgentWithoutAnAddressOrOutOfRange_IsRefused) {
  EXPECT_THAT(std::string(CheckNodeOptions({2, 1, "127.0.0.1:0"}, {}, "t").message()),
              HasSubstr("--coordinator_address=HOST:PORT"));
  EXPECT_THAT(std::string(CheckNodeOptions({2, 2, "127.0.0.1:5"}, {}, "t").message()), HasSubstr("pass 0 to 1"));
}

TEST(NodeOptions, TlsFilesGoTogether) {
  EXPECT_THAT(std::string(CheckNodeOptions({2, 0, "198.18.0.11:1"}, {"c.pem", "", ""}, "").message()),
              HasSubstr("needs all three"));
}

TEST(JobToken, ReadableByOthers_OrShort_IsRefused) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/tok";
  std::ofstream(path) << "0123456789abcdef0123456789abcdef\n";
  chmod(path.c_str(), 0644);
  EXPECT_THAT(std::string(ReadJobToken(path).status().message()), HasSubstr("chmod 600"));
  chmod(path.c_str(), 0600);
  ASSERT_TRUE(ReadJobToken(path).ok());
  EXPECT_EQ(*ReadJobToken(path), "0123456789abcdef0123456789abcdef");
  std::ofstream(path) << "short\n";
  EXPECT_THAT(std::string(ReadJobToken(path).status().message()), HasSubstr("32 or more"));
}

TEST(JobToken, Fifo_RefusedNamingTheFlag) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/tok.fifo";
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  EXPECT_THAT(std::string(ReadJobToken(path).status().message()),
              HasSubstr("--job_token_file=" + path + ": not a regular file but a FIFO"));
}

TEST(CrossHostLinks, NodeMajorRanks_OneCrossingPerNodeBoundary) {
  std::vector<NodeState> nodes(3);
  nodes[0].workers = 2;
  nodes[1].workers = 1;
  nodes[1].first_rank = 2;
  nodes[2].workers = 1;
  nodes[2].first_rank = 3;
  EXPECT_EQ(CrossHostLinks({0, 1, 2, 3}, nodes),
            "links across hosts: stage 1 -> 2 (node 0 -> 1), stage 2 -> 3 (node 1 -> 2)");
  EXPECT_EQ(CrossHostLinks({0, 1}, nodes), "no link crosses hosts");
}

}  // namespace
}  // namespace stagehand
