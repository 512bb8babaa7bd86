// Unit tests of listen_address.h: HOST:PORT splitting, loopback and resolution (numeric hosts only,
// so that no lookup leaves the machine).
#include "launcher/coordinator/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "gtest/gtest.h"

namespace stagehand {
namespace {

TEST(SplitHostPortTest, HostAndBracketedV6_AreSplit) {
  std::optional<HostPort> a = SplitHostPort("10.0.0.1:29500");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->host, "10.0.0.1");
  EXPECT_EQ(a->port, 29500);
  std::optional<HostPort> b = SplitHostPort("[::1]:0");
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->port, 0);
  EXPECT_EQ(SplitHostPort("n1:65535")->host, "n1");
}

TEST(SplitHostPortTest, Malformed_IsNullopt) {
  for (const char* bad :
       {"", "10.0.0.1", ":29500", "::1:29500", "[::1]29500", "[::1", "h:", "h:x", "h:-1", "h:65536", "h:1:2"}) {
    EXPECT_FALSE(SplitHostPort(bad).has_value()) << bad;
  }
}

sockaddr_in V4(const char* text) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, text, &a.sin_addr);
  return a;
}

sockaddr_in6 V6(const char* text) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  inet_pton(AF_INET6, text, &a.sin6_addr);
  return a;
}

TEST(IsLoopbackTest, LoopbackRangesOnly) {
  for (const char* yes : {"127.0.0.1", "127.1.2.3", "127.255.255.254"}) {
    sockaddr_in a = V4(yes);
    EXPECT_TRUE(IsLoopback(reinterpret_cast<sockaddr*>(&a))) << yes;
  }
  for (const char* no : {"198.18.0.11", "10.0.0.1", "128.0.0.1", "0.0.0.0"}) {
    sockaddr_in a = V4(no);
    EXPECT_FALSE(IsLoopback(reinterpret_cast<sockaddr*>(&a))) << no;
  }
  sockaddr_in6 one = V6("::1"), mapped = V6("::ffff:127.0.0.2"), other = V6("fd00::1"),
               mapped_out = V6("::ffff:10.0.0.1");
  EXPECT_TRUE(IsLoopback(reinterpret_cast<sockaddr*>(&one)));
  EXPECT_TRUE(IsLoopback(reinterpret_cast<sockaddr*>(&mapped)));
  EXPECT_FALSE(IsLoopback(reinterpret_cast<sockaddr*>(&other)));
  EXPECT_FALSE(IsLoopback(reinterpret_cast<sockaddr*>(&mapped_out)));
}

TEST(ResolveHostTest, NumericHosts_ResolveToThemselves) {
  absl::StatusOr<ResolvedHost> v4 = ResolveHost("127.0.0.1");
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_EQ(v4->numeric, "127.0.0.1");
  EXPECT_TRUE(v4->loopback);
  EXPECT_EQ(v4->non_loopback, "");
  absl::StatusOr<ResolvedHost> other = ResolveHost("198.18.0.11");  // resolved, never dialled
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->numeric, "198.18.0.11");
  EXPECT_FALSE(other->loopback);
  EXPECT_EQ(other->non_loopback, "198.18.0.11");
  absl::StatusOr<ResolvedHost> v6 = ResolveHost("::1");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->numeric, "[::1]");
  EXPECT_TRUE(v6->loopback);
}

}  // namespace
}  // namespace stagehand
