// Tests of the CPU transport with every rank a thread of this process, meeting through one in-memory
// key-value store; also the store itself and DTypeSize.
#include "worker/cpu_transport.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/in_memory_kv_store.h"
#include "worker/transport.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

// Finite timeouts everywhere, so that a bug fails the test in seconds instead of hanging it.
CpuTransportOptions TestOptions(int rank, int world_size) {
  CpuTransportOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.key_prefix = "job-1/comm-0";
  o.connect_timeout = absl::Seconds(5);
  o.io_timeout = absl::Seconds(5);
  return o;
}

using Transports = std::vector<std::unique_ptr<Transport>>;

// Connects `world_size` ranks, one thread each (they must rendezvous concurrently).
Transports ConnectAll(int world_size, InMemoryKeyValueStore& kv,
                      const std::function<void(CpuTransportOptions&)>& tweak = nullptr) {
  Transports transports(world_size);
  std::vector<absl::Status> statuses(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      CpuTransportOptions o = TestOptions(r, world_size);
      if (tweak) tweak(o);
      absl::StatusOr<std::unique_ptr<Transport>> t = ConnectCpuTransport(o, kv);
      statuses[r] = t.status();
      if (t.ok()) transports[r] = std::move(*t);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < world_size; ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
  return transports;
}

// Runs `body` on every rank at once and returns each rank's status.
std::vector<absl::Status> RunOnEach(Transports& transports,
                                    const std::function<absl::Status(Transport&)>& body) {
  std::vector<absl::Status> statuses(transports.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < transports.size(); ++r) {
    threads.emplace_back([&, r] { statuses[r] = body(*transports[r]); });
  }
  for (std::thread& t : threads) t.join();
  return statuses;
}

bool AllConnected(const Transports& transports) {
  for (const auto& t : transports) {
    if (t == nullptr) return false;
  }
  return true;
}

void ExpectAllOk(const std::vector<absl::Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) EXPECT_TRUE(statuses[r].ok()) << "rank " << r << ": " << statuses[r];
}

// ---- DTypeSize and the in-memory store ----

TEST(DTypeSizeTest, DTypeSize_EachDType_IsItsWidthInBytes) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8);
}

TEST(InMemoryKeyValueStoreTest, Set_SameValueTwice_IsOk) {
  InMemoryKeyValueStore kv;
  EXPECT_TRUE(kv.Set("k", "v").ok());
  EXPECT_TRUE(kv.Set("k", "v").ok());
}

TEST(InMemoryKeyValueStoreTest, Set_DifferentValue_IsAlreadyExists) {
  InMemoryKeyValueStore kv;
  ASSERT_TRUE(kv.Set("k", "v").ok());
  EXPECT_EQ(kv.Set("k", "w").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*kv.Get("k", absl::ZeroDuration()), "v");
}

TEST(InMemoryKeyValueStoreTest, Get_MissingKey_IsDeadlineExceeded) {
  InMemoryKeyValueStore kv;
  EXPECT_EQ(kv.Get("k", absl::Milliseconds(20)).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(InMemoryKeyValueStoreTest, Get_KeySetByAnotherThread_ReturnsValue) {
  InMemoryKeyValueStore kv;
  std::thread setter([&] { EXPECT_TRUE(kv.Set("k", "v").ok()); });
  absl::StatusOr<std::string> got = kv.Get("k", absl::Seconds(5));
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
}

// ---- Rendezvous ----

TEST(CpuTransportTest, Connect_RankOutOfRange_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  EXPECT_EQ(ConnectCpuTransport(TestOptions(2, 2), kv).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectCpuTransport(TestOptions(0, 0), kv).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuTransportTest, Connect_WildcardListenHost_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o = TestOptions(0, 2);
  o.listen_host = "0.0.0.0";
  EXPECT_EQ(ConnectCpuTransport(o, kv).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuTransportTest, Connect_HigherRankNeverStarts_IsDeadlineExceeded) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o = TestOptions(0, 3);
  o.connect_timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::Status st = ConnectCpuTransport(o, kv).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("ranks 1, 2 did not connect"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(CpuTransportTest, Connect_LowerRankNeverPublishes_IsDeadlineExceeded) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o = TestOptions(1, 2);
  o.connect_timeout = absl::Milliseconds(200);
  const absl::Time start = absl::Now();
  absl::Status st = ConnectCpuTransport(o, kv).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank 0 did not publish its address"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST(CpuTransportTest, Connect_AddressKeyAlreadyTaken_IsAlreadyExists) {
  InMemoryKeyValueStore kv;
  ASSERT_TRUE(kv.Set("job-1/comm-0/cpu/addr/0", "10.0.0.1:1234").ok());
  absl::Status st = ConnectCpuTransport(TestOptions(0, 2), kv).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kAlreadyExists) << st;
}

// Rank 1 of another communicator is pointed at rank 0's address: both sides must refuse.
TEST(CpuTransportTest, Connect_PeerWithDifferentKeyPrefix_IsRejectedOnBothSides) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o0 = TestOptions(0, 2);
  o0.connect_timeout = absl::Seconds(2);
  absl::Status st0;
  std::thread rank0([&] { st0 = ConnectCpuTransport(o0, kv).status(); });
  absl::StatusOr<std::string> address = kv.Get("job-1/comm-0/cpu/addr/0", absl::Seconds(5));
  ASSERT_TRUE(address.ok()) << address.status();
  ASSERT_TRUE(kv.Set("job-2/comm-0/cpu/addr/0", *address).ok());
  CpuTransportOptions o1 = TestOptions(1, 2);
  o1.key_prefix = "job-2/comm-0";
  absl::Status st1 = ConnectCpuTransport(o1, kv).status();
  rank0.join();
  EXPECT_EQ(st0.code(), absl::StatusCode::kInvalidArgument) << st0;
  EXPECT_THAT(st0.message(), HasSubstr("different key_prefix"));
  EXPECT_FALSE(st1.ok());
  EXPECT_THAT(st1.message(), HasSubstr("rank 0"));
}

// ---- AllReduceSum ----

TEST(CpuTransportTest, AllReduceSum_OneRank_LeavesDataUnchanged) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(1, kv);
  ASSERT_TRUE(AllConnected(ts));
  EXPECT_EQ(ts[0]->name(), "cpu");
  std::vector<float> data = {1.5f, -2.0f, 3.25f};
  ASSERT_TRUE(ts[0]->AllReduceSum(data.data(), data.size(), DType::kFloat32).ok());
  EXPECT_EQ(data, (std::vector<float>{1.5f, -2.0f, 3.25f}));
}

// Values are small multiples of 0.5, so every partial sum is exact in float32.
void ExpectExactFloat32Sum(int world_size) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(world_size, kv);
  ASSERT_TRUE(AllConnected(ts));
  constexpr int kCount = 1000;
  std::vector<std::vector<float>> data(world_size, std::vector<float>(kCount));
  for (int r = 0; r < world_size; ++r) {
    for (int i = 0; i < kCount; ++i) data[r][i] = 0.5f * (r + 1) + i;
  }
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32);
  }));
  const float ranks_part = 0.25f * world_size * (world_size + 1);
  for (int r = 0; r < world_size; ++r) {
    for (int i = 0; i < kCount; ++i) {
      ASSERT_EQ(data[r][i], ranks_part + static_cast<float>(world_size) * i) << "rank " << r << " i " << i;
    }
  }
}

TEST(CpuTransportTest, AllReduceSum_TwoRanks_EveryRankGetsExactSum) { ExpectExactFloat32Sum(2); }
TEST(CpuTransportTest, AllReduceSum_ThreeRanks_EveryRankGetsExactSum) { ExpectExactFloat32Sum(3); }
TEST(CpuTransportTest, AllReduceSum_FourRanks_EveryRankGetsExactSum) { ExpectExactFloat32Sum(4); }

// 8 MiB per rank is far beyond socket buffers: a schedule that blocks in send on both sides hangs here.
TEST(CpuTransportTest, AllReduceSum_EightMiBPerRank_DoesNotDeadlock) {
  constexpr int kWorld = 4;
  constexpr int64_t kCount = 2 << 20;  // 2 Mi floats.
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(kWorld, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kCount));
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kCount; ++i) data[r][i] = static_cast<float>(i % 1024 + r);
  }
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32);
  }));
  for (int r = 0; r < kWorld; ++r) {
    for (int64_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(data[r][i], static_cast<float>(kWorld * (i % 1024) + 6)) << "rank " << r << " i " << i;
    }
  }
}

TEST(CpuTransportTest, AllReduceSum_Float64ThreeRanks_EveryRankGetsExactSum) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  // 2^40 plus quarters: exact in float64, lost in float32.
  std::vector<std::vector<double>> data(3);
  for (int r = 0; r < 3; ++r) data[r] = {1099511627776.0 + 0.25 * r, -1.5 * r};
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    return t.AllReduceSum(data[t.rank()].data(), 2, DType::kFloat64);
  }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r], (std::vector<double>{3298534883328.75, -4.5}));
}

TEST(CpuTransportTest, AllReduceSum_Int64ThreeRanks_EveryRankGetsExactSum) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  // Beyond 2^53, where a detour through double would round.
  std::vector<std::vector<int64_t>> data = {
      {(int64_t{1} << 60) + 1, -7}, {(int64_t{1} << 60) + 2, 11}, {-(int64_t{1} << 61) + 3, 0}};
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    return t.AllReduceSum(data[t.rank()].data(), 2, DType::kInt64);
  }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r], (std::vector<int64_t>{6, 4})) << "rank " << r;
}

// Random floats of mixed magnitude, whose sum depends on the order of additions: every rank must get
// the same bits, and they must be those of the sum in rank order.
TEST(CpuTransportTest, AllReduceSum_InexactFloats_BitIdenticalOnEveryRankInRankOrder) {
  constexpr int kWorld = 4;
  constexpr int kCount = 4096;
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-20, 20);
  std::vector<std::vector<float>> data(kWorld, std::vector<float>(kCount));
  for (auto& rank_data : data) {
    for (float& x : rank_data) x = std::ldexp(mantissa(rng), exponent(rng));
  }
  std::vector<float> expected = data[0];
  for (int r = 1; r < kWorld; ++r) {
    for (int i = 0; i < kCount; ++i) expected[i] = expected[i] + data[r][i];
  }
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(kWorld, kv);
  ASSERT_TRUE(AllConnected(ts));
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32);
  }));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(std::memcmp(data[r].data(), expected.data(), kCount * sizeof(float)), 0) << "rank " << r;
  }
}

TEST(CpuTransportTest, AllReduceSum_BFloat16_IsUnimplemented) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<uint16_t> data(8);
  for (const absl::Status& st : RunOnEach(ts, [&](Transport& t) {
         std::vector<uint16_t> mine = data;
         return t.AllReduceSum(mine.data(), mine.size(), DType::kBFloat16);
       })) {
    EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented) << st;
  }
}

TEST(CpuTransportTest, AllReduceSum_NegativeCount_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  float x = 0;
  for (const absl::Status& st :
       RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(&x, -1, DType::kFloat32); })) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  }
}

// ---- Send and Recv ----

// Each rank sends 1 MiB to its right neighbour and receives from its left; even ranks send first and
// odd ranks receive first, so the ring cannot block on full socket buffers.
TEST(CpuTransportTest, SendRecv_RingOfFourRanks_EachGetsLeftNeighboursBytes) {
  constexpr int kWorld = 4;
  constexpr int kBytes = 1 << 20;
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(kWorld, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<std::vector<char>> received(kWorld, std::vector<char>(kBytes));
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    const int right = (t.rank() + 1) % kWorld;
    const int left = (t.rank() + kWorld - 1) % kWorld;
    std::vector<char> mine(kBytes, static_cast<char>('a' + t.rank()));
    auto send = [&] { return t.Send(mine.data(), kBytes, right); };
    auto recv = [&] { return t.Recv(received[t.rank()].data(), kBytes, left); };
    absl::Status st = t.rank() % 2 == 0 ? send() : recv();
    if (st.ok()) st = t.rank() % 2 == 0 ? recv() : send();
    return st;
  }));
  for (int r = 0; r < kWorld; ++r) {
    const char left_char = static_cast<char>('a' + (r + kWorld - 1) % kWorld);
    EXPECT_EQ(received[r], std::vector<char>(kBytes, left_char)) << "rank " << r;
  }
}

TEST(CpuTransportTest, SendRecv_PeerOutOfRangeOrSelf_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  char c = 0;
  EXPECT_EQ(ts[0]->Send(&c, 1, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->Send(&c, 1, 2).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[0]->Recv(&c, 1, -1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ts[1]->Recv(&c, 1, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CpuTransportTest, Recv_LengthMismatch_IsInternalNamingBothSizes) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<char> buf(32);
  ASSERT_TRUE(ts[0]->Send(buf.data(), 16, 1).ok());  // Fits the socket buffer: returns at once.
  absl::Status st = ts[1]->Recv(buf.data(), 32, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank 0 sent 16 bytes but this rank expected 32 bytes"));
  // The stream is out of step now: later calls on it fail rather than read garbage.
  EXPECT_EQ(ts[1]->Recv(buf.data(), 16, 0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CpuTransportTest, Recv_PeerClosed_IsUnavailableNamingPeer) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  ts[2].reset();
  char c = 0;
  absl::Status st = ts[0]->Recv(&c, 1, 2);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank 2 closed the connection"));
}

TEST(CpuTransportTest, Recv_PeerSilentPastIoTimeout_IsDeadlineExceededNamingPeer) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv, [](CpuTransportOptions& o) { o.io_timeout = absl::Milliseconds(100); });
  ASSERT_TRUE(AllConnected(ts));
  char c = 0;
  const absl::Time start = absl::Now();
  absl::Status st = ts[0]->Recv(&c, 1, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_THAT(st.message(), HasSubstr("rank 1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// Rank 0 waits for a message rank 1 never sends; Abort from another thread must end that wait with
// CANCELLED, fail later calls at once, and show rank 1 that rank 0 went away.
TEST(CpuTransportTest, Abort_FromAnotherThread_UnblocksRecvWithCancelled) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  char c0 = 0, c1 = 0;
  absl::Status st0, st1;
  absl::Notification recv_started;
  std::thread rank0([&] {
    recv_started.Notify();
    st0 = ts[0]->Recv(&c0, 1, 1);
  });
  std::thread rank1([&] { st1 = ts[1]->Recv(&c1, 1, 0); });
  recv_started.WaitForNotification();
  // Abort must work whether or not Recv has reached poll() yet; this pause makes "in flight" the
  // usual case. The 5 s io_timeout bounds the test if Abort fails to wake it.
  absl::SleepFor(absl::Milliseconds(20));
  const absl::Time start = absl::Now();
  ts[0]->Abort();
  rank0.join();
  rank1.join();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(st0, absl::CancelledError("transport aborted"));
  EXPECT_EQ(st1.code(), absl::StatusCode::kUnavailable) << st1;
  EXPECT_THAT(st1.message(), HasSubstr("rank 0 closed the connection"));
  EXPECT_EQ(ts[0]->Send(&c0, 1, 1).code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(ts[0]->AllReduceSum(&c0, 0, DType::kFloat32).code(), absl::StatusCode::kCancelled);
}

}  // namespace
}  // namespace stagehand
