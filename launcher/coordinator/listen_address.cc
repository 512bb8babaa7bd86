// Addresses the launcher's servers listen on (see listen_address.h).
#include "launcher/coordinator/listen_address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

std::string Numeric(const addrinfo* a) {
  char text[INET6_ADDRSTRLEN] = {0};
  const void* addr = a->ai_family == AF_INET
                         ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr)
                         : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
  inet_ntop(a->ai_family, addr, text, sizeof(text));
  return a->ai_family == AF_INET6 ? absl::StrCat("[", text, "]") : std::string(text);
}

}  // namespace

std::optional<HostPort> SplitHostPort(const std::string& address) {
  std::string host, port;
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close == std::string::npos || close + 1 >= address.size() || address[close + 1] != ':') return std::nullopt;
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.find(':');
    if (colon == std::string::npos || address.find(':', colon + 1) != std::string::npos) return std::nullopt;
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  HostPort out;
  if (host.empty() || !absl::SimpleAtoi(port, &out.port) || out.port < 0 || out.port > 65535) return std::nullopt;
  out.host = std::move(host);
  return out;
}

bool IsLoopback(const sockaddr* a) {
  if (a->sa_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr) >> 24) == 127;  // 127.0.0.0/8
  }
  if (a->sa_family != AF_INET6) return false;
  const in6_addr& v6 = reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

absl::StatusOr<ResolvedHost> ResolveHost(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  ResolvedHost out;
  const addrinfo* chosen = nullptr;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family != AF_INET && a->ai_family != AF_INET6) continue;
    if (!IsLoopback(a->ai_addr) && out.loopback) {
      out.loopback = false;
      out.non_loopback = Numeric(a);
    }
    if (chosen == nullptr || (chosen->ai_family != AF_INET && a->ai_family == AF_INET)) chosen = a;  // IPv4 first
  }
  if (chosen != nullptr) out.numeric = Numeric(chosen);
  freeaddrinfo(found);
  if (out.numeric.empty()) return absl::InvalidArgumentError(absl::StrCat(host, " has no address"));
  return out;
}

}  // namespace stagehand
