// Unit tests of the worker's Agent over FakeCoordinatorClient and a fake transport: each way a run
// is stopped (WaitForStop, a heartbeat's stop, ABORTED, a lost coordinator) aborts the transport
// with the right exit code. Tests wait on notifications and conditions, never on sleeps.
#include "worker/agent.h"

#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/fake_coordinator_client.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

// Long enough never to pass in a passing test; short enough that a bug fails rather than hangs.
constexpr absl::Duration kLong = absl::Seconds(10);

class FakeTransport : public Transport {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string name() const override { return "fake"; }
  absl::Status AllReduceSum(void*, int64_t, DType) override { return absl::UnimplementedError("fake"); }
  absl::Status Send(const void*, int64_t, int) override { return absl::UnimplementedError("fake"); }
  absl::Status Recv(void*, int64_t, int) override { return absl::UnimplementedError("fake"); }
  absl::Status Group(const std::vector<P2POp>&) override { return absl::UnimplementedError("fake"); }
  void Abort() override {
    if (!aborted.HasBeenNotified()) aborted.Notify();
  }

  absl::Notification aborted;
};

Timeouts MakeTimeouts(absl::Duration interval, absl::Duration timeout) {
  Timeouts t;
  t.set_heartbeat_interval_ms(absl::ToInt64Milliseconds(interval));
  t.set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return t;
}

TEST(AgentTest, WaitForStop_JobStops_AbortsTransportWithin100ms) {
  FakeCoordinatorClient client;
  FakeTransport transport;
  // Heartbeats far apart: only the long poll can bring the stop this fast.
  Agent agent(client, 1, 7, MakeTimeouts(absl::Seconds(30), absl::Seconds(60)));
  agent.SetTransport(&transport);
  ASSERT_TRUE(client.AwaitWaitForStopCalls(1, kLong));
  const absl::Time start = absl::Now();
  client.TriggerStop("rank 2 failed: CUDA out of memory", "rank 2 (host h, pid 123)");
  ASSERT_TRUE(transport.aborted.WaitForNotificationWithTimeout(absl::Milliseconds(100)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
  EXPECT_EQ(agent.exit_code(), kWorkerExitStopped);
  EXPECT_THAT(agent.reason(), HasSubstr("rank 2 failed: CUDA out of memory"));
  EXPECT_THAT(agent.reason(), HasSubstr("from rank 2 (host h, pid 123)"));
  EXPECT_TRUE(client.heartbeats().empty());
}

TEST(AgentTest, Heartbeat_CoordinatorLost_ExitsWithCode4AfterTheTimeout) {
  FakeCoordinatorClient client;
  FakeTransport transport;
  client.SetHeartbeatResult(absl::UnavailableError("Heartbeat: connection refused"));
  const absl::Duration timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  Agent agent(client, 0, 1, MakeTimeouts(absl::Milliseconds(10), timeout));
  agent.SetTransport(&transport);
  ASSERT_TRUE(transport.aborted.WaitForNotificationWithTimeout(kLong));
  EXPECT_GE(absl::Now() - start, timeout) << "tripped before the heartbeat timeout";
  EXPECT_EQ(agent.exit_code(), kWorkerExitLostCoordinator);
  EXPECT_THAT(agent.reason(), HasSubstr("no answer from the coordinator"));
  EXPECT_THAT(agent.reason(), HasSubstr("connection refused"));
}

TEST(AgentTest, Heartbeat_Aborted_ExitsWithCode3) {
  FakeCoordinatorClient client;
  FakeTransport transport;
  client.SetHeartbeatResult(
      absl::AbortedError("Heartbeat: stale incarnation 1, current 2: this worker was replaced; exit"));
  Agent agent(client, 0, 1, MakeTimeouts(absl::Milliseconds(10), absl::Seconds(60)));
  agent.SetTransport(&transport);
  ASSERT_TRUE(transport.aborted.WaitForNotificationWithTimeout(kLong));
  EXPECT_EQ(agent.exit_code(), kWorkerExitStopped);
  EXPECT_THAT(agent.reason(), HasSubstr("stale incarnation 1, current 2"));
}

TEST(AgentTest, WaitForStop_Aborted_ExitsWithCode3) {
  FakeCoordinatorClient client;
  FakeTransport transport;
  Agent agent(client, 0, 1, MakeTimeouts(absl::Seconds(30), absl::Seconds(60)));
  agent.SetTransport(&transport);
  client.TriggerStop(absl::AbortedError("WaitForStop: stale incarnation 1, current 2"));
  ASSERT_TRUE(transport.aborted.WaitForNotificationWithTimeout(kLong));
  EXPECT_EQ(agent.exit_code(), kWorkerExitStopped);
}

TEST(AgentTest, Heartbeat_AnswersStop_ExitsWithCode3WithTheReason) {
  FakeCoordinatorClient client;
  FakeTransport transport;
  HeartbeatResponse stop;
  stop.set_stop(true);
  stop.set_stop_reason("user pressed ctrl-c");
  client.SetHeartbeatResult(stop);
  Agent agent(client, 0, 1, MakeTimeouts(absl::Milliseconds(10), absl::Seconds(60)));
  agent.SetTransport(&transport);
  ASSERT_TRUE(transport.aborted.WaitForNotificationWithTimeout(kLong));
  EXPECT_EQ(agent.exit_code(), kWorkerExitStopped);
  EXPECT_EQ(agent.reason(), "user pressed ctrl-c");
}

TEST(AgentTest, WaitForStop_Unavailable_PollsAgainWithoutTripping) {
  FakeCoordinatorClient client;
  Agent agent(client, 0, 1, MakeTimeouts(absl::Milliseconds(10), absl::Seconds(60)));
  client.TriggerStop(absl::UnavailableError("WaitForStop: the coordinator restarted"));
  ASSERT_TRUE(client.AwaitWaitForStopCalls(2, kLong));
  EXPECT_EQ(agent.exit_code(), 0);
}

TEST(AgentTest, Heartbeat_CarriesRankIncarnationAndSteps) {
  FakeCoordinatorClient client;
  Agent agent(client, 3, 9, MakeTimeouts(absl::Milliseconds(10), absl::Seconds(60)));
  agent.SetSteps(5);
  ASSERT_TRUE(client.AwaitHeartbeats(2, kLong));  // the second surely carries the steps
  HeartbeatRequest last = client.heartbeats().back();
  EXPECT_EQ(last.rank(), 3);
  EXPECT_EQ(last.incarnation(), 9);
  EXPECT_EQ(last.steps_done(), 5);
  EXPECT_EQ(agent.exit_code(), 0);
}

TEST(AgentTest, SetTransport_AfterTrip_AbortsAtOnce) {
  FakeCoordinatorClient client;
  Agent agent(client, 0, 1, MakeTimeouts(absl::Seconds(30), absl::Seconds(60)));
  client.TriggerStop("stopped before the transport existed", "the launcher");
  ASSERT_TRUE(agent.AwaitTrip(kLong));
  FakeTransport transport;
  agent.SetTransport(&transport);
  EXPECT_TRUE(transport.aborted.HasBeenNotified());
  agent.SetTransport(nullptr);  // the transport dies before the agent
}

TEST(AgentTest, Destructor_PendingWaitForStop_ReturnsPromptly) {
  FakeCoordinatorClient client;
  const absl::Time start = absl::Now();
  {
    Agent agent(client, 0, 1, MakeTimeouts(absl::Seconds(30), absl::Seconds(60)));
    ASSERT_TRUE(client.AwaitWaitForStopCalls(1, kLong));
  }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the destructor waited for the long poll";
}

}  // namespace
}  // namespace stagehand
