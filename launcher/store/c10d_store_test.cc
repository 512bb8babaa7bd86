// C10dStoreServer over real loopback sockets: ports picked, requests answered across connections, a
// bad client closed alone, the allowlist and the client limit at accept, a client that does not read
// its answers, and Stop with clients connected and a wait blocked. (Every query's answer is in
// c10d_store_state_test.cc; torch's own client is in tests/c10d_store_test.sh.)
#include "launcher/store/c10d_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/fd.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

// A blocking loopback client that speaks the wire format by hand; every receive is bounded (10 s).
class RawClient {
 public:
  // To 127.0.0.1, or ::1 when ipv6.
  explicit RawClient(int port, bool ipv6 = false)
      : fd_(socket(ipv6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    timeval tv{10, 0};
    setsockopt(fd_.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (ipv6) {
      sockaddr_in6 address{};
      address.sin6_family = AF_INET6;
      address.sin6_port = htons(static_cast<uint16_t>(port));
      address.sin6_addr = in6addr_loopback;
      connected_ = connect(fd_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
      return;
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
  }
  bool connected() const { return connected_; }

  template <typename T>
  RawClient& Put(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    pending_.append(bytes, sizeof(T));
    return *this;
  }
  RawClient& Str(const std::string& s) {
    Put<uint64_t>(s.size());
    pending_ += s;
    return *this;
  }
  RawClient& Query(C10dQuery q) { return Put<uint8_t>(static_cast<uint8_t>(q)); }
  RawClient& Validate() { return Query(C10dQuery::kValidate).Put<uint32_t>(kC10dValidationMagic); }
  RawClient& Raw(const std::string& bytes) {
    pending_ += bytes;
    return *this;
  }
  bool Flush() {
    size_t sent = 0;
    while (sent < pending_.size()) {
      const ssize_t n = send(fd_.get(), pending_.data() + sent, pending_.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    pending_.clear();
    return true;
  }
  // Exactly n bytes, or nullopt on the end, an error or the 10 s bound.
  std::optional<std::string> Read(size_t n) {
    std::string out(n, '\0');
    size_t got = 0;
    while (got < n) {
      const ssize_t r = recv(fd_.get(), out.data() + got, n - got, 0);
      if (r <= 0) return std::nullopt;
      got += static_cast<size_t>(r);
    }
    return out;
  }
  template <typename T>
  std::optional<T> ReadValue() {
    std::optional<std::string> bytes = Read(sizeof(T));
    if (!bytes) return std::nullopt;
    T value;
    std::memcpy(&value, bytes->data(), sizeof(T));
    return value;
  }
  std::optional<std::string> ReadBytes() {
    std::optional<uint64_t> n = ReadValue<uint64_t>();
    if (!n) return std::nullopt;
    return Read(*n);
  }
  // The server closed this connection (the end or a reset, not the 10 s bound).
  bool SeesClose() {
    char byte;
    for (;;) {
      const ssize_t r = recv(fd_.get(), &byte, 1, 0);
      if (r == 0) return true;
      if (r < 0) return errno == ECONNRESET || errno == EPIPE;
    }
  }
  // Validated, then PING answered: what torch's client does on connect.
  bool Handshake() {
    Validate().Query(C10dQuery::kPing).Put<uint32_t>(77);
    return Flush() && ReadValue<uint32_t>() == std::optional<uint32_t>(77);
  }

 private:
  UniqueFd fd_;
  bool connected_ = false;
  std::string pending_;
};

TEST(C10dStoreServerTest, Start_PortZero_PicksFreePorts) {
  C10dStoreServer a, b;
  absl::StatusOr<int> pa = a.Start("127.0.0.1", 0);
  absl::StatusOr<int> pb = b.Start("127.0.0.1", 0);
  ASSERT_TRUE(pa.ok()) << pa.status();
  ASSERT_TRUE(pb.ok()) << pb.status();
  EXPECT_GT(*pa, 0);
  EXPECT_NE(*pa, *pb);
  EXPECT_EQ(a.port(), *pa);
}

TEST(C10dStoreServerTest, Start_BadArguments_SayWhat) {
  C10dStoreServer server;
  EXPECT_EQ(server.Start("localhost", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(server.Start("127.0.0.1", 70000).status().code(), absl::StatusCode::kInvalidArgument);
  C10dStoreOptions options;
  options.allowed_peers = {"host-a"};
  C10dStoreServer with_bad_peer(options);
  absl::Status s = with_bad_peer.Start("127.0.0.1", 0).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("host-a"), absl::string_view::npos) << s;
}

TEST(C10dStoreServerTest, Start_PortTaken_IsUnavailable_AndTwiceIsFailedPrecondition) {
  C10dStoreServer a, b;
  absl::StatusOr<int> port = a.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  absl::Status s = b.Start("127.0.0.1", *port).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("pass port 0"), absl::string_view::npos) << s;
  EXPECT_EQ(a.Start("127.0.0.1", 0).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(C10dStoreServerTest, SetOnOneConnection_EndsWaitOnAnother) {
  C10dStoreServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient waiter(*port), setter(*port);
  ASSERT_TRUE(waiter.Handshake());
  ASSERT_TRUE(setter.Handshake());
  // The PING's answer comes first: the wait is registered by then, the key not there.
  waiter.Query(C10dQuery::kWait).Put<uint64_t>(1).Str("/k").Query(C10dQuery::kPing).Put<uint32_t>(8);
  ASSERT_TRUE(waiter.Flush());
  ASSERT_EQ(waiter.ReadValue<uint32_t>(), std::optional<uint32_t>(8));
  setter.Query(C10dQuery::kSet).Str("/k").Str("v").Query(C10dQuery::kGet).Str("/k");
  ASSERT_TRUE(setter.Flush());
  EXPECT_EQ(setter.ReadBytes(), std::optional<std::string>("v"));
  EXPECT_EQ(waiter.ReadValue<uint8_t>(), std::optional<uint8_t>(kC10dStopWaiting));
}

TEST(C10dStoreServerTest, BigValue_RoundTrips) {
  C10dStoreServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient client(*port);
  ASSERT_TRUE(client.Handshake());
  std::string value(16 << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) value[i] = static_cast<char>(i * 131);
  client.Query(C10dQuery::kSet).Str("/big").Str(value).Query(C10dQuery::kGet).Str("/big");
  ASSERT_TRUE(client.Flush());
  std::optional<std::string> back = client.ReadBytes();
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(*back == value);
}

TEST(C10dStoreServerTest, MalformedClient_ClosedAlone) {
  C10dStoreServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient good(*port), no_validate(*port), junk(*port), bad_magic(*port);
  ASSERT_TRUE(good.Handshake());
  no_validate.Query(C10dQuery::kGet).Str("/k");
  ASSERT_TRUE(no_validate.Flush());
  ASSERT_TRUE(junk.Validate().Raw("\xc8garbage").Flush());
  ASSERT_TRUE(bad_magic.Query(C10dQuery::kValidate).Put<uint32_t>(1).Flush());
  EXPECT_TRUE(no_validate.SeesClose());
  EXPECT_TRUE(junk.SeesClose());
  EXPECT_TRUE(bad_magic.SeesClose());
  good.Query(C10dQuery::kAdd).Str("/n").Put<int64_t>(3);
  ASSERT_TRUE(good.Flush());
  EXPECT_EQ(good.ReadValue<int64_t>(), std::optional<int64_t>(3));
}

TEST(C10dStoreServerTest, AllowedPeers_OthersClosedAtAccept) {
  C10dStoreOptions elsewhere;
  elsewhere.allowed_peers = {"10.9.8.7", "fd00::1"};
  C10dStoreServer closed(elsewhere);
  absl::StatusOr<int> port = closed.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient refused(*port);
  ASSERT_TRUE(refused.connected());  // the kernel accepts; the store closes it
  EXPECT_TRUE(refused.SeesClose());

  C10dStoreOptions loopback;
  loopback.allowed_peers = {"10.9.8.7", "127.0.0.1"};
  C10dStoreServer open(loopback);
  port = open.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient allowed(*port);
  EXPECT_TRUE(allowed.Handshake());
}

TEST(C10dStoreServerTest, AllowedPeers_IPv6Loopback) {
  C10dStoreOptions v6;
  v6.allowed_peers = {"::1"};
  C10dStoreServer server(v6);
  absl::StatusOr<int> port = server.Start("::1", 0);
  if (!port.ok() && port.status().code() == absl::StatusCode::kInvalidArgument) {
    GTEST_SKIP() << "no ::1 here: " << port.status();
  }
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient allowed(*port, /*ipv6=*/true);
  EXPECT_TRUE(allowed.Handshake());

  C10dStoreOptions v4_only;
  v4_only.allowed_peers = {"127.0.0.1"};
  C10dStoreServer other(v4_only);
  port = other.Start("::1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient refused(*port, /*ipv6=*/true);
  EXPECT_TRUE(refused.SeesClose());
}

TEST(C10dStoreServerTest, MaxClients_OneMoreClosed) {
  C10dStoreOptions options;
  options.max_clients = 2;
  C10dStoreServer server(options);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient a(*port), b(*port);
  ASSERT_TRUE(a.Handshake());
  ASSERT_TRUE(b.Handshake());
  RawClient c(*port);
  EXPECT_TRUE(c.SeesClose());
  a.Query(C10dQuery::kGetNumKeys);
  ASSERT_TRUE(a.Flush());
  EXPECT_EQ(a.ReadValue<int64_t>(), std::optional<int64_t>(0));
}

TEST(C10dStoreServerTest, ClientNotReadingItsAnswers_DoesNotStallOthers) {
  C10dStoreServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient hog(*port), other(*port);
  ASSERT_TRUE(hog.Handshake());
  ASSERT_TRUE(other.Handshake());
  hog.Query(C10dQuery::kSet).Str("/v").Str(std::string(1 << 20, 'x'));
  for (int i = 0; i < 64; ++i) hog.Query(C10dQuery::kGet).Str("/v");
  ASSERT_TRUE(hog.Flush());  // 64 MiB of answers asked for, none read
  other.Query(C10dQuery::kPing).Put<uint32_t>(5);
  ASSERT_TRUE(other.Flush());
  EXPECT_EQ(other.ReadValue<uint32_t>(), std::optional<uint32_t>(5));
  // The hog's answers are all there once it reads.
  for (int i = 0; i < 64; ++i) {
    std::optional<std::string> v = hog.ReadBytes();
    ASSERT_TRUE(v.has_value()) << i;
    ASSERT_EQ(v->size(), size_t{1} << 20);
  }
}

TEST(C10dStoreServerTest, Stop_WithClientsAndABlockedWait_ClosesAllPromptly) {
  C10dStoreServer server;
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  RawClient waiter(*port), idle(*port);
  ASSERT_TRUE(waiter.Handshake());
  ASSERT_TRUE(idle.Handshake());
  // The PING's answer comes first: the wait is registered by then.
  waiter.Query(C10dQuery::kWait).Put<uint64_t>(1).Str("/never").Query(C10dQuery::kPing).Put<uint32_t>(1);
  ASSERT_TRUE(waiter.Flush());
  ASSERT_EQ(waiter.ReadValue<uint32_t>(), std::optional<uint32_t>(1));
  const auto start = std::chrono::steady_clock::now();
  server.Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(waiter.SeesClose());
  EXPECT_TRUE(idle.SeesClose());
  RawClient late(*port);
  EXPECT_FALSE(late.connected());
  server.Stop();  // idempotent
}

}  // namespace
}  // namespace stagehand
