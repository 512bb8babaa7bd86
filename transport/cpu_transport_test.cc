// Tests of the CPU transport with every rank a thread of this process, meeting through one in-memory
// key-value store, some of them under attack by a stranger on their ports; also the store and DTypeSize.
#include "transport/cpu_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/fd.h"
#include "transport/in_memory_kv_store.h"
#include "transport/transport.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Finite timeouts everywhere, so that a bug fails the test in seconds instead of hanging it.
CpuTransportOptions TestOptions(int rank, int world_size) {
  CpuTransportOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.key_prefix = "job-1/comm-0";
  o.connect_timeout = absl::Seconds(5);
  o.io_timeout = absl::Seconds(5);
  o.secret = "the job secret of job-1";
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
std::vector<absl::Status> RunOnEach(Transports& transports, const std::function<absl::Status(Transport&)>& body) {
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
  EXPECT_EQ(ConnectCpuTransport(TestOptions(2, 2), kv).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ConnectCpuTransport(TestOptions(0, 0), kv).status().code(), absl::StatusCode::kInvalidArgument);
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

// Rank 1 of another communicator is pointed at rank 0's address: both sides must refuse, and rank 0's
// timeout must say why it dropped the connection.
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
  EXPECT_EQ(st0.code(), absl::StatusCode::kDeadlineExceeded) << st0;
  EXPECT_THAT(st0.message(), HasSubstr("different key_prefix"));
  EXPECT_FALSE(st1.ok());
  EXPECT_THAT(st1.message(), HasSubstr("rank 0"));
}

TEST(CpuTransportTest, Connect_NoSecret_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o = TestOptions(0, 2);
  o.secret.clear();
  absl::Status st = ConnectCpuTransport(o, kv).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(st.message(), HasSubstr("no job secret"));
}

// The higher rank checks the lower rank's answer first, so it is the one told; the lower one drops the
// connection and goes on waiting.
TEST(CpuTransportTest, Connect_PeerWithWrongSecret_IsPermissionDeniedSayingSo) {
  InMemoryKeyValueStore kv;
  CpuTransportOptions o0 = TestOptions(0, 2);
  o0.connect_timeout = absl::Seconds(1);
  absl::Status st0;
  std::thread rank0([&] { st0 = ConnectCpuTransport(o0, kv).status(); });
  CpuTransportOptions o1 = TestOptions(1, 2);
  o1.secret = "the secret of another launch";
  absl::Status st1 = ConnectCpuTransport(o1, kv).status();
  rank0.join();
  EXPECT_EQ(st1.code(), absl::StatusCode::kPermissionDenied) << st1;
  EXPECT_THAT(st1.message(), HasSubstr("rank 0 answered without proving this job's secret"));
  EXPECT_THAT(st1.message(), Not(HasSubstr(o0.secret)));
  EXPECT_THAT(st1.message(), Not(HasSubstr(o1.secret)));
  EXPECT_EQ(st0.code(), absl::StatusCode::kDeadlineExceeded) << st0;
  EXPECT_THAT(st0.message(), HasSubstr("1 connection(s) were dropped"));
}

// The process's connected TCP sockets whose peer is one of them too (the mesh of ranks that are threads
// here), with whether each has TCP_NODELAY. Listeners and half-open strangers are not connected pairs.
std::vector<bool> MeshSocketsNoDelay() {
  struct Socket {
    int fd;
    sockaddr_storage local, peer;
    socklen_t local_len, peer_len;
  };
  std::vector<Socket> sockets;
  for (int fd = 0; fd < 4096; ++fd) {
    Socket s{fd, {}, {}, sizeof(sockaddr_storage), sizeof(sockaddr_storage)};
    int type = 0;
    socklen_t len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) continue;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&s.local), &s.local_len) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&s.peer), &s.peer_len) != 0) continue;
    sockets.push_back(s);
  }
  std::vector<bool> out;
  for (const Socket& a : sockets) {
    for (const Socket& b : sockets) {
      if (a.local_len != b.peer_len || std::memcmp(&a.local, &b.peer, a.local_len) != 0) continue;
      int nodelay = 0;
      socklen_t len = sizeof(nodelay);
      out.push_back(getsockopt(a.fd, IPPROTO_TCP, TCP_NODELAY, &nodelay, &len) == 0 && nodelay != 0);
    }
  }
  return out;
}

// Every message of a step is a small write followed by a wait for the answer: with Nagle's algorithm
// on, each would wait for the peer's delayed ACK (40 ms on Linux).
TEST(CpuTransportTest, Connect_EveryConnectionOfTheMesh_HasTcpNoDelayOnBothEnds) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  const std::vector<bool> nodelay = MeshSocketsNoDelay();
  EXPECT_GE(nodelay.size(), 6u);  // 3 connections, both ends
  for (size_t i = 0; i < nodelay.size(); ++i) EXPECT_TRUE(nodelay[i]) << "socket " << i;
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
  ExpectAllOk(
      RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32); }));
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
  ExpectAllOk(
      RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32); }));
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
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), 2, DType::kFloat64); }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(data[r], (std::vector<double>{3298534883328.75, -4.5}));
}

TEST(CpuTransportTest, AllReduceSum_Int64ThreeRanks_EveryRankGetsExactSum) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  // Beyond 2^53, where a detour through double would round.
  std::vector<std::vector<int64_t>> data = {
      {(int64_t{1} << 60) + 1, -7}, {(int64_t{1} << 60) + 2, 11}, {-(int64_t{1} << 61) + 3, 0}};
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), 2, DType::kInt64); }));
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
  ExpectAllOk(
      RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), kCount, DType::kFloat32); }));
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
  for (const absl::Status& st : RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(&x, -1, DType::kFloat32); })) {
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

// ---- Strangers ----
// A stranger knows everything public (the address, the job id, the key prefix, the protocol) but not the
// secret. Every attack must be dropped at the listener while the real ranks connect and move exact data.

// Collects what the transports report through on_dropped_connection, and waits for it.
class DropRecorder {
 public:
  std::function<void(const absl::Status&)> Hook() {
    return [this](const absl::Status& st) {
      absl::MutexLock lock(&mu_);
      drops_.push_back(st);
    };
  }
  // The drops so far, once there are at least `n` of them or `timeout` has passed.
  std::vector<absl::Status> WaitFor(size_t n, absl::Duration timeout = absl::Seconds(5)) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return drops_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
    return drops_;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Status> drops_ ABSL_GUARDED_BY(mu_);
};

// A raw TCP client to a published "127.0.0.1:port"; reads give up after 5 s, so no test can hang on one.
UniqueFd StrangerConnect(const std::string& address) {
  const size_t colon = address.rfind(':');
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr);
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  timeval tv{5, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) return UniqueFd();
  return fd;
}

bool SendAll(int fd, const std::string& bytes) {
  return ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

// Reads exactly n bytes ("" when the connection ends or the 5 s read timeout passes first).
std::string ReadExactly(int fd, size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, &out[got], n - got, 0);
    if (r <= 0) return "";
    got += r;
  }
  return out;
}

// Whether the other side closed the connection (within the 5 s read timeout), discarding what it sent.
bool ClosedByPeer(int fd) {
  char buf[256];
  for (;;) {
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    if (r < 0) return false;
  }
}

void PutLe(uint64_t v, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A hello exactly as a real rank writes one (protocol 2, cpu_transport.cc), built only from public facts.
std::string ForgedHello(int sender, int receiver, int world_size, const std::string& key_prefix) {
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (unsigned char c : key_prefix) fnv = (fnv ^ c) * 0x100000001b3ull;
  std::string h;
  PutLe(0x54434853, 4, h);  // "SHCT"
  PutLe(2, 4, h);
  PutLe(sender, 4, h);
  PutLe(receiver, 4, h);
  PutLe(world_size, 4, h);
  PutLe(fnv, 8, h);
  h.append(32, '\x42');  // the nonce
  return h;
}
constexpr size_t kChallengeBytes = 92;  // the lower rank's hello (60 bytes), then its MAC (32)

std::string AddressOf(InMemoryKeyValueStore& kv, int rank) {
  absl::StatusOr<std::string> a = kv.Get(absl::StrCat("job-1/comm-0/cpu/addr/", rank), absl::Seconds(5));
  return a.ok() ? *a : "";
}

// A job of `world_size` ranks whose highest rank is held back: the others start, `attack` runs against
// their published addresses, and then the last rank starts and the mesh must come up.
class HeldBackJob {
 public:
  HeldBackJob(int world_size, InMemoryKeyValueStore& kv, DropRecorder& drops,
              absl::Duration handshake_timeout = absl::Seconds(5))
      : world_size_(world_size), kv_(kv), transports_(world_size), statuses_(world_size) {
    for (int r = 0; r + 1 < world_size; ++r) Start(r, drops, handshake_timeout);
  }
  // Starts the last rank and waits for every rank's rendezvous.
  Transports Finish(DropRecorder& drops) {
    Start(world_size_ - 1, drops, absl::Seconds(5));
    for (std::thread& t : threads_) t.join();
    for (int r = 0; r < world_size_; ++r) EXPECT_TRUE(statuses_[r].ok()) << "rank " << r << ": " << statuses_[r];
    return std::move(transports_);
  }

 private:
  void Start(int r, DropRecorder& drops, absl::Duration handshake_timeout) {
    threads_.emplace_back([this, r, &drops, handshake_timeout] {
      CpuTransportOptions o = TestOptions(r, world_size_);
      o.handshake_timeout = handshake_timeout;
      o.on_dropped_connection = drops.Hook();
      absl::StatusOr<std::unique_ptr<Transport>> t = ConnectCpuTransport(o, kv_);
      statuses_[r] = t.status();
      if (t.ok()) transports_[r] = std::move(*t);
    });
  }

  const int world_size_;
  InMemoryKeyValueStore& kv_;
  Transports transports_;
  std::vector<absl::Status> statuses_;
  std::vector<std::thread> threads_;
};

// After an attack: the all-reduce is exact on every rank, and a ring of sends arrives intact.
void ExpectExactTraffic(Transports& ts) {
  ASSERT_TRUE(AllConnected(ts));
  const int world = ts.size();
  std::vector<std::vector<double>> data(world);
  for (int r = 0; r < world; ++r) data[r] = {1.0 + r, 0.25 * r};
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) { return t.AllReduceSum(data[t.rank()].data(), 2, DType::kFloat64); }));
  const double sum_r = world * (world - 1) / 2.0;
  for (int r = 0; r < world; ++r)
    EXPECT_EQ(data[r], (std::vector<double>{world + sum_r, 0.25 * sum_r})) << "rank " << r;
  std::vector<int64_t> got(world, -1);
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    const int64_t mine = 1000 + t.rank();
    const int right = (t.rank() + 1) % world, left = (t.rank() + world - 1) % world;
    return t.Group({{true, const_cast<int64_t*>(&mine), 8, right}, {false, &got[t.rank()], 8, left}});
  }));
  for (int r = 0; r < world; ++r) EXPECT_EQ(got[r], 1000 + (r + world - 1) % world) << "rank " << r;
}

TEST(CpuTransportStrangerTest, Connect_StrangerWrites24JunkBytes_IsDroppedAndJobConnects) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(3, kv, drops);
  UniqueFd stranger = StrangerConnect(AddressOf(kv, 0));
  ASSERT_TRUE(stranger.valid());
  ASSERT_TRUE(SendAll(stranger.get(), std::string("GET / HTTP/1.1\r\nHost: x\r\n", 24)));
  std::vector<absl::Status> seen = drops.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kInvalidArgument) << seen[0];
  EXPECT_THAT(seen[0].message(), HasSubstr("does not speak the cpu transport protocol"));
  EXPECT_TRUE(ClosedByPeer(stranger.get()));
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
}

TEST(CpuTransportStrangerTest, Connect_StrangerClosesMidHello_IsDroppedAndJobConnects) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(2, kv, drops);
  {
    UniqueFd stranger = StrangerConnect(AddressOf(kv, 0));
    ASSERT_TRUE(SendAll(stranger.get(), ForgedHello(1, 0, 2, "job-1/comm-0").substr(0, 30)));
  }
  std::vector<absl::Status> seen = drops.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kUnavailable) << seen[0];
  EXPECT_THAT(seen[0].message(), HasSubstr("closed the connection after 30 of the 60 bytes of its hello"));
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
}

// A forged hello claiming the rank not yet connected (rank 2, at rank 1) without proof of the job secret
// is dropped, and the real rank 2 connects (a hello without the proof would take its place).
TEST(CpuTransportStrangerTest, Connect_ForgedHelloWithWrongMac_IsDroppedAndRealRankConnects) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(3, kv, drops);
  UniqueFd stranger = StrangerConnect(AddressOf(kv, 1));
  ASSERT_TRUE(SendAll(stranger.get(), ForgedHello(2, 1, 3, "job-1/comm-0")));
  ASSERT_EQ(ReadExactly(stranger.get(), kChallengeBytes).size(), kChallengeBytes) << "no challenge came";
  ASSERT_TRUE(SendAll(stranger.get(), std::string(32, '\x17')));  // a guess at the MAC
  std::vector<absl::Status> seen = drops.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kPermissionDenied) << seen[0];
  EXPECT_THAT(seen[0].message(), HasSubstr("claimed rank 2 but did not prove the job secret"));
  EXPECT_TRUE(ClosedByPeer(stranger.get()));
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
}

// Forwards one connection between a client and `target`, recording what the client sent, until either
// side closes (or 10 s pass).
class RecordingProxy {
 public:
  explicit RecordingProxy(std::string target) : target_(std::move(target)) {
    listener_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(sa);
    ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    ::listen(listener_.get(), 1);
    ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&sa), &len);
    address_ = absl::StrCat("127.0.0.1:", ntohs(sa.sin_port));
    thread_ = std::thread([this] { Run(); });
  }
  ~RecordingProxy() { thread_.join(); }
  const std::string& address() const { return address_; }
  std::string Recorded() {
    thread_.join();
    thread_ = std::thread([] {});
    return recorded_;
  }

 private:
  void Run() {
    pollfd lp{listener_.get(), POLLIN, 0};
    if (::poll(&lp, 1, 10000) != 1) return;
    UniqueFd client(::accept(listener_.get(), nullptr, nullptr));
    UniqueFd server = StrangerConnect(target_);
    const absl::Time end = absl::Now() + absl::Seconds(10);
    while (absl::Now() < end) {
      pollfd p[2] = {{client.get(), POLLIN, 0}, {server.get(), POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      char buf[4096];
      for (int i = 0; i < 2; ++i) {
        if (p[i].revents == 0) continue;
        const ssize_t r = ::recv(p[i].fd, buf, sizeof(buf), 0);
        if (r <= 0) return;
        if (i == 0) recorded_.append(buf, r);
        if (!SendAll(p[1 - i].fd, std::string(buf, r))) return;
      }
    }
  }

  const std::string target_;
  UniqueFd listener_;
  std::string address_;
  std::string recorded_;
  std::thread thread_;
};

// Rank 1's real hello and proof, captured on the wire through a proxy in one rendezvous, are replayed
// to rank 0 of a later rendezvous of the same communicator and secret: rank 0's fresh nonce makes the
// old proof wrong.
TEST(CpuTransportStrangerTest, Connect_ReplayedRealHandshake_IsDroppedAndRealRankConnects) {
  std::string captured;
  {
    InMemoryKeyValueStore kv0, kv1;  // rank 1 finds "rank 0" at the proxy
    absl::StatusOr<std::unique_ptr<Transport>> t0;
    std::thread rank0([&] { t0 = ConnectCpuTransport(TestOptions(0, 2), kv0); });
    RecordingProxy proxy(AddressOf(kv0, 0));
    ASSERT_TRUE(kv1.Set("job-1/comm-0/cpu/addr/0", proxy.address()).ok());
    absl::StatusOr<std::unique_ptr<Transport>> t1 = ConnectCpuTransport(TestOptions(1, 2), kv1);
    rank0.join();
    ASSERT_TRUE(t0.ok()) << t0.status();
    ASSERT_TRUE(t1.ok()) << t1.status();
    t1->reset();  // ends the proxy's connection
    captured = proxy.Recorded();
  }
  ASSERT_EQ(captured.size(), 60u + 32u) << "expected rank 1's hello and proof";
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(2, kv, drops);
  UniqueFd replayer = StrangerConnect(AddressOf(kv, 0));
  ASSERT_TRUE(SendAll(replayer.get(), captured));
  std::vector<absl::Status> seen = drops.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kPermissionDenied) << seen[0];
  EXPECT_THAT(seen[0].message(), HasSubstr("claimed rank 1 but did not prove the job secret"));
  EXPECT_TRUE(ClosedByPeer(replayer.get()));
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
}

// Strangers that connect and stall, at the head of rank 0's and rank 1's queues, must not delay the real
// ranks: their handshake timeout (10 min) is far beyond the ranks' connect_timeout (5 s), so the mesh
// comes up only if the real ranks are served beside the stalled ones; nothing is dropped meanwhile.
TEST(CpuTransportStrangerTest, Connect_StrangersStall_RealRanksConnectWithoutWaitingForThem) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(3, kv, drops, /*handshake_timeout=*/absl::Minutes(10));
  UniqueFd silent = StrangerConnect(AddressOf(kv, 0));
  UniqueFd half_hello = StrangerConnect(AddressOf(kv, 1));
  ASSERT_TRUE(SendAll(half_hello.get(), ForgedHello(2, 1, 3, "job-1/comm-0").substr(0, 20)));
  UniqueFd unanswered = StrangerConnect(AddressOf(kv, 0));  // holds a challenge and never answers
  ASSERT_TRUE(SendAll(unanswered.get(), ForgedHello(2, 0, 3, "job-1/comm-0")));
  ASSERT_EQ(ReadExactly(unanswered.get(), kChallengeBytes).size(), kChallengeBytes);
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
  EXPECT_TRUE(drops.WaitFor(0).empty());
}

TEST(CpuTransportStrangerTest, Connect_StrangerStallsPastHandshakeTimeout_IsDropped) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  HeldBackJob job(2, kv, drops, /*handshake_timeout=*/absl::Milliseconds(200));
  UniqueFd stranger = StrangerConnect(AddressOf(kv, 0));
  std::vector<absl::Status> seen = drops.WaitFor(1);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].code(), absl::StatusCode::kDeadlineExceeded) << seen[0];
  EXPECT_THAT(seen[0].message(), HasSubstr("sent 0 bytes of its hello and then nothing"));
  EXPECT_TRUE(ClosedByPeer(stranger.get()));
  Transports ts = job.Finish(drops);
  ExpectExactTraffic(ts);
}

// Once the mesh is up the listener stays open: junk and a hello for a connected rank are dropped there
// while the job's traffic goes on.
TEST(CpuTransportStrangerTest, AfterConnect_StrangersAtListener_AreDroppedAndTrafficIsExact) {
  InMemoryKeyValueStore kv;
  DropRecorder drops;
  Transports ts = ConnectAll(3, kv, [&](CpuTransportOptions& o) { o.on_dropped_connection = drops.Hook(); });
  ASSERT_TRUE(AllConnected(ts));
  UniqueFd junk = StrangerConnect(AddressOf(kv, 0));
  ASSERT_TRUE(SendAll(junk.get(), std::string(24, '\xff')));
  UniqueFd forged = StrangerConnect(AddressOf(kv, 0));
  ASSERT_TRUE(SendAll(forged.get(), ForgedHello(1, 0, 3, "job-1/comm-0")));
  EXPECT_TRUE(ClosedByPeer(junk.get()));
  EXPECT_TRUE(ClosedByPeer(forged.get()));
  std::vector<absl::Status> seen = drops.WaitFor(2);
  ASSERT_EQ(seen.size(), 2u);
  std::vector<absl::StatusCode> codes = {seen[0].code(), seen[1].code()};
  EXPECT_THAT(codes,
              ::testing::UnorderedElementsAre(absl::StatusCode::kInvalidArgument, absl::StatusCode::kAlreadyExists));
  ExpectExactTraffic(ts);
}

// ---- Data parallelism's collectives and sub-groups (the defaults of transport.cc over TCP) ----

// Rank r's block b holds (r + 1) * 1000 + b * 10 + i: the sums are exact in float32.
TEST(CpuTransportCollectivesTest, ReduceScatterSum_ThreeRanks_EachGetsTheSumOfItsBlock) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  constexpr int kCount = 5;
  std::vector<std::vector<float>> out(3, std::vector<float>(kCount));
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    std::vector<float> send(3 * kCount);
    for (int b = 0; b < 3; ++b) {
      for (int i = 0; i < kCount; ++i) send[b * kCount + i] = (t.rank() + 1) * 1000.0f + b * 10 + i;
    }
    return t.ReduceScatterSum(send.data(), out[t.rank()].data(), kCount, DType::kFloat32);
  }));
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < kCount; ++i) EXPECT_EQ(out[r][i], 6000.0f + 3 * (r * 10 + i)) << "rank " << r << " i " << i;
  }
}

TEST(CpuTransportCollectivesTest, ReduceScatterSum_InPlaceOnOwnBlock_IsTheSame) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(2, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<std::vector<double>> buf(2);
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    buf[t.rank()] = {1.0 + t.rank(), 10.0 + t.rank(), 100.0 + t.rank(), 1000.0 + t.rank()};
    double* own = buf[t.rank()].data() + 2 * t.rank();
    return t.ReduceScatterSum(buf[t.rank()].data(), own, 2, DType::kFloat64);
  }));
  EXPECT_EQ(buf[0][0], 3.0);
  EXPECT_EQ(buf[0][1], 21.0);
  EXPECT_EQ(buf[1][2], 201.0);
  EXPECT_EQ(buf[1][3], 2001.0);
}

TEST(CpuTransportCollectivesTest, AllGather_ThreeRanks_EveryRankGetsAllBlocksInRankOrder) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(3, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<std::vector<int64_t>> out(3, std::vector<int64_t>(6));
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) {
    const std::vector<int64_t> mine = {t.rank() * 10, t.rank() * 10 + 1};
    return t.AllGather(mine.data(), out[t.rank()].data(), 2, DType::kInt64);
  }));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[r], (std::vector<int64_t>{0, 1, 10, 11, 20, 21})) << "rank " << r;
}

TEST(CpuTransportCollectivesTest, ReduceScatterSum_BFloat16_IsUnimplemented) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(1, kv);
  ASSERT_TRUE(AllConnected(ts));
  uint16_t x[1] = {0};
  EXPECT_EQ(ts[0]->ReduceScatterSum(x, x, 1, DType::kBFloat16).code(), absl::StatusCode::kUnimplemented);
}

TEST(CpuTransportCollectivesTest, Split_NotAMember_IsInvalidArgument) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(1, kv);
  ASSERT_TRUE(AllConnected(ts));
  EXPECT_EQ(ts[0]->Split(0, {1}).status().code(), absl::StatusCode::kInvalidArgument);
}

// Four ranks as 2 stages x 2 replicas (rank = replica * 2 + stage): each stage's replicas {0, 2} and
// {1, 3} reduce among themselves while the pipeline neighbours exchange on another thread, over the
// same mesh.
TEST(CpuTransportCollectivesTest, Split_TwoGroupsOfFour_ReduceWithinGroupBesideNeighbourTraffic) {
  InMemoryKeyValueStore kv;
  Transports ts = ConnectAll(4, kv);
  ASSERT_TRUE(AllConnected(ts));
  std::vector<std::vector<float>> sums(4), shards(4), gathered(4);
  std::vector<float> from_neighbour(4);
  ExpectAllOk(RunOnEach(ts, [&](Transport& t) -> absl::Status {
    const int r = t.rank(), stage = r % 2, replica = r / 2;
    absl::StatusOr<std::unique_ptr<Transport>> group = t.Split(stage, {stage, stage + 2});
    if (!group.ok()) return group.status();
    if ((*group)->rank() != replica || (*group)->world_size() != 2) return absl::InternalError("group rank");
    absl::Status p2p;
    std::thread neighbours([&] {
      const float mine = 100.0f * r;
      const int peer = replica * 2 + (1 - stage);
      p2p = t.Group(
          {{true, const_cast<float*>(&mine), sizeof(float), peer}, {false, &from_neighbour[r], sizeof(float), peer}});
    });
    sums[r] = {1.0f * r, 2.0f * r};
    absl::Status s = (*group)->AllReduceSum(sums[r].data(), 2, DType::kFloat32);
    std::vector<float> both = {1.0f + r, 2.0f + r};
    shards[r].resize(1);
    if (s.ok()) s = (*group)->ReduceScatterSum(both.data(), shards[r].data(), 1, DType::kFloat32);
    gathered[r].resize(2);
    if (s.ok()) s = (*group)->AllGather(shards[r].data(), gathered[r].data(), 1, DType::kFloat32);
    neighbours.join();
    return s.ok() ? p2p : s;
  }));
  EXPECT_EQ(sums[0], (std::vector<float>{2, 4}));  // ranks 0 + 2
  EXPECT_EQ(sums[2], (std::vector<float>{2, 4}));
  EXPECT_EQ(sums[1], (std::vector<float>{4, 8}));  // ranks 1 + 3
  EXPECT_EQ(sums[3], (std::vector<float>{4, 8}));
  EXPECT_EQ(gathered[0], (std::vector<float>{4, 6}));  // (1 + 3), (2 + 4)
  EXPECT_EQ(gathered[2], (std::vector<float>{4, 6}));
  EXPECT_EQ(gathered[1], (std::vector<float>{6, 8}));  // (2 + 4), (3 + 5)
  EXPECT_EQ(gathered[3], (std::vector<float>{6, 8}));
  EXPECT_EQ(from_neighbour, (std::vector<float>{100, 0, 300, 200}));
}

}  // namespace
}  // namespace stagehand
