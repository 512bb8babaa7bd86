// Addresses the launcher's servers listen on (the Coordinator's --coordinator_address, the control
// service's --listen): HOST:PORT split, and HOST resolved once, with whether it is loopback, so that
// both servers bind the numeric address they checked and refuse a name that resolves elsewhere.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_LISTEN_ADDRESS_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_LISTEN_ADDRESS_H_

#include <sys/socket.h>

#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace stagehand {

struct HostPort {
  std::string host;  // without the brackets of "[v6]"
  int port = 0;
};

// "host:port" or "[v6]:port" with a port of 0 to 65535 (0: pick one); nullopt for anything else
// (no port, an empty host, a bare IPv6 address without brackets).
std::optional<HostPort> SplitHostPort(const std::string& address);

// 127.0.0.0/8, ::1 and IPv4-mapped 127.0.0.0/8.
bool IsLoopback(const sockaddr* address);

struct ResolvedHost {
  std::string numeric;       // the address to bind, IPv4 first: "10.0.0.1" or "[fd00::1]"
  bool loopback = true;      // every address the name has is loopback ("127.evil.test" elsewhere is not)
  std::string non_loopback;  // the first address that is not, for messages ("" when loopback)
};

// HOST through getaddrinfo (files and DNS as nsswitch.conf says). INVALID_ARGUMENT with the
// resolver's reason when it does not resolve or has no IPv4 or IPv6 address.
absl::StatusOr<ResolvedHost> ResolveHost(const std::string& host);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_LISTEN_ADDRESS_H_
