// Tests of the in-process test transport: the engine tests lean on its matching, bounds and abort, so a
// fake that quietly passed bytes wrongly would make them meaningless.
#include "transport/fake_transport.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"

namespace stagehand {
namespace {

TEST(FakeTransportTest, Send_MatchingRecv_CopiesBytesAndRecordsBoth) {
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0), t1(&fabric, 1);
  const std::vector<float> sent = {1, 2, 3};
  std::vector<float> got(3, 0);
  absl::Status send_status;
  std::thread sender([&] { send_status = t0.Send(sent.data(), 12, 1); });
  EXPECT_TRUE(t1.Recv(got.data(), 12, 0).ok());
  sender.join();
  EXPECT_TRUE(send_status.ok()) << send_status;
  EXPECT_EQ(got, sent);
  EXPECT_EQ(fabric.OpsOf(0), (std::vector<FakeOp>{{0, FakeOp::kSend, 1, 12}}));
  EXPECT_EQ(fabric.OpsOf(1), (std::vector<FakeOp>{{1, FakeOp::kRecv, 0, 12}}));
}

TEST(FakeTransportTest, Group_BothRanksSendAndReceive_Completes) {
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0), t1(&fabric, 1);
  int64_t a = 10, b = 20, a_got = 0, b_got = 0;
  absl::Status s0;
  // Both send first: with blocking sends alone this would deadlock; a group posts both ends at once.
  std::thread rank0([&] { s0 = t0.Group({{true, &a, 8, 1}, {false, &a_got, 8, 1}}); });
  const absl::Status s1 = t1.Group({{true, &b, 8, 0}, {false, &b_got, 8, 0}});
  rank0.join();
  EXPECT_TRUE(s0.ok()) << s0;
  EXPECT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(a_got, 20);
  EXPECT_EQ(b_got, 10);
}

TEST(FakeTransportTest, Recv_ByteCountDiffers_IsInvalidArgumentOnBothSides) {
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0), t1(&fabric, 1);
  char buf[16] = {};
  absl::Status send_status;
  std::thread sender([&] { send_status = t0.Send(buf, 16, 1); });
  const absl::Status recv_status = t1.Recv(buf, 8, 0);
  sender.join();
  EXPECT_EQ(send_status.code(), absl::StatusCode::kInvalidArgument) << send_status;
  EXPECT_EQ(recv_status.code(), absl::StatusCode::kInvalidArgument) << recv_status;
  EXPECT_TRUE(absl::StrContains(recv_status.message(), "16 bytes")) << recv_status;
}

TEST(FakeTransportTest, Recv_PeerNeverSends_IsDeadlineExceededNamingTheOp) {
  FakeFabric fabric(2, absl::Milliseconds(50));
  FakeTransport t1(&fabric, 1);
  char buf[4];
  const absl::Status s = t1.Recv(buf, 4, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "rank 1: recv of 4 bytes from rank 0")) << s;
}

TEST(FakeTransportTest, Abort_WhileAndAfterWaiting_IsCancelled) {
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0), t1(&fabric, 1);
  char buf[4];
  absl::Status pending;
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { pending = t1.Recv(buf, 4, 0); });
  ASSERT_TRUE(fabric.AwaitBlocked(1).ok());
  t1.Abort();
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(pending.code(), absl::StatusCode::kCancelled) << pending;
  EXPECT_EQ(t1.Recv(buf, 4, 0).code(), absl::StatusCode::kCancelled);
  // The peer of an aborted rank fails at once too, instead of waiting out the bound.
  EXPECT_EQ(t0.Send(buf, 4, 1).code(), absl::StatusCode::kCancelled);
}

TEST(FakeTransportTest, AllReduceSum_ThreeRanks_EverySumTheSame) {
  FakeFabric fabric(3);
  std::vector<std::vector<float>> data = {{1, 2}, {10, 20}, {100, 200}};
  std::vector<absl::Status> status(3);
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport t(&fabric, r);
      status[r] = t.AllReduceSum(data[r].data(), 2, DType::kFloat32);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(data[r], (std::vector<float>{111, 222})) << "rank " << r;
  }
}

TEST(FakeTransportTest, Send_ToItself_IsInvalidArgument) {
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0);
  char buf[4];
  EXPECT_EQ(t0.Send(buf, 4, 0).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagehand
