// The c10d store's socket loop (see c10d_store.h): accept, read, hand bytes to C10dStoreState, write
// its answers. Nothing here reads a request; nothing here logs a value.
#include "launcher/store/c10d_store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace stagehand {
namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerWake = 16;  // then the other connections get their turn
constexpr int kAcceptsPerWake = 64;

// The 16-byte IPv6 form of an address (IPv4 as ::ffff:a.b.c.d), so that both families compare.
std::string AddressKey(const sockaddr_storage& address) {
  if (address.ss_family == AF_INET) {
    unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    std::memcpy(mapped + 12, &reinterpret_cast<const sockaddr_in&>(address).sin_addr, 4);
    return std::string(reinterpret_cast<const char*>(mapped), 16);
  }
  if (address.ss_family == AF_INET6) {
    return std::string(reinterpret_cast<const char*>(&reinterpret_cast<const sockaddr_in6&>(address).sin6_addr), 16);
  }
  return "";
}

std::string AddressText(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    const auto& in = reinterpret_cast<const sockaddr_in&>(address);
    inet_ntop(AF_INET, &in.sin_addr, text, sizeof text);
    return absl::StrCat(text, ":", ntohs(in.sin_port));
  }
  const auto& in6 = reinterpret_cast<const sockaddr_in6&>(address);
  inet_ntop(AF_INET6, &in6.sin6_addr, text, sizeof text);
  return absl::StrCat("[", text, "]:", ntohs(in6.sin6_port));
}

// A numeric IPv4 or IPv6 address and a port; nullopt-like false when `text` is not numeric.
bool ParseAddress(const std::string& text, int port, sockaddr_storage* out, socklen_t* length) {
  std::memset(out, 0, sizeof *out);
  auto* in = reinterpret_cast<sockaddr_in*>(out);
  if (inet_pton(AF_INET, text.c_str(), &in->sin_addr) == 1) {
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in);
    return true;
  }
  auto* in6 = reinterpret_cast<sockaddr_in6*>(out);
  if (inet_pton(AF_INET6, text.c_str(), &in6->sin6_addr) == 1) {
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    *length = sizeof(sockaddr_in6);
    return true;
  }
  return false;
}

}  // namespace

struct C10dStoreServer::Connection {
  uint64_t id = 0;
  UniqueFd fd;
  std::string peer;  // "a.b.c.d:port", for messages
  bool closed = false;
};

C10dStoreServer::C10dStoreServer(C10dStoreOptions options) : options_(std::move(options)) {}

C10dStoreServer::~C10dStoreServer() { Stop(); }

absl::StatusOr<int> C10dStoreServer::Start(const std::string& bind_address, int port) {
  if (started_) return absl::FailedPreconditionError("the c10d store was started already");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("c10d store port ", port, " is not 0 to 65535 (0: pick a free one)"));
  }
  sockaddr_storage address;
  socklen_t length = 0;
  if (!ParseAddress(bind_address, port, &address, &length)) {
    return absl::InvalidArgumentError(absl::StrCat("c10d store bind address '", bind_address,
                                                   "' is not a numeric IPv4 or IPv6 address; resolve it first"));
  }
  for (const std::string& peer : options_.allowed_peers) {
    sockaddr_storage allowed;
    socklen_t unused = 0;
    if (!ParseAddress(peer, 0, &allowed, &unused)) {
      return absl::InvalidArgumentError(
          absl::StrCat("c10d store allowed peer '", peer, "' is not a numeric IPv4 or IPv6 address"));
    }
    allowed_.push_back(AddressKey(allowed));
  }
  UniqueFd fd(socket(address.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("c10d store socket: ", ErrnoText(errno)));
  const int one = 1, zero = 0;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (address.ss_family == AF_INET6) setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    const int err = errno;
    const std::string where = absl::StrCat(bind_address, " port ", port);
    if (err == EADDRINUSE) {
      return absl::UnavailableError(absl::StrCat("c10d store: ", where, " is in use; pass port 0 to pick a free one"));
    }
    if (err == EADDRNOTAVAIL) {
      return absl::InvalidArgumentError(absl::StrCat("c10d store: ", bind_address, " is not an address of this host"));
    }
    return absl::InternalError(absl::StrCat("c10d store: bind ", where, ": ", ErrnoText(err)));
  }
  if (listen(fd.get(), SOMAXCONN) != 0) {
    return absl::InternalError(absl::StrCat("c10d store: listen: ", ErrnoText(errno)));
  }
  sockaddr_storage bound;
  socklen_t bound_length = sizeof bound;
  getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound), &bound_length);
  port_ = ntohs(bound.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(bound).sin_port
                                           : reinterpret_cast<sockaddr_in6&>(bound).sin6_port);
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return absl::InternalError(absl::StrCat("c10d store eventfd: ", ErrnoText(errno)));
  listen_fd_ = std::move(fd);
  started_ = true;
  thread_ = std::thread([this] { Run(); });
  return port_;
}

void C10dStoreServer::Stop() {
  if (!thread_.joinable()) return;
  stopping_.store(true);
  const uint64_t one = 1;
  while (write(wake_fd_.get(), &one, sizeof one) < 0 && errno == EINTR) {
  }
  thread_.join();
  listen_fd_.reset();
  wake_fd_.reset();
}

void C10dStoreServer::Run() {
  C10dStoreState state(options_.limits);
  std::vector<Connection> connections;
  uint64_t next_id = 1;
  std::vector<pollfd> fds;
  // After EMFILE the listening socket stays readable: accepting pauses a while instead of spinning.
  auto accept_after = std::chrono::steady_clock::time_point();
  while (!stopping_.load()) {
    const bool accepting = std::chrono::steady_clock::now() >= accept_after;
    fds.clear();
    fds.push_back({wake_fd_.get(), POLLIN, 0});
    fds.push_back({listen_fd_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
    for (const Connection& c : connections) {
      short events = 0;
      if (state.WantsInput(c.id)) events |= POLLIN;
      if (!state.Output(c.id).empty()) events |= POLLOUT;
      fds.push_back({c.fd.get(), events, 0});
    }
    if (poll(fds.data(), fds.size(), accepting ? -1 : 100) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "c10d store: poll: " << ErrnoText(errno) << "; the store stops";
      break;
    }
    if (fds[0].revents != 0) break;
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& c = connections[i];
      const short revents = fds[i + 2].revents;
      bool open = true;
      if (revents & (POLLIN | POLLHUP | POLLERR)) open = ReadFrom(state, c, revents);
      c.closed = !open;
    }
    // Every connection with answers (its own, or a wait another's SET ended) is written to now.
    for (Connection& c : connections) {
      if (!c.closed && !state.Output(c.id).empty()) c.closed = !WriteTo(state, c);
    }
    for (Connection& c : connections) {
      if (c.closed) state.Disconnect(c.id);
    }
    connections.erase(
        std::remove_if(connections.begin(), connections.end(), [](const Connection& c) { return c.closed; }),
        connections.end());
    if (fds[1].revents & POLLIN) {
      if (!AcceptAll(state, connections, next_id)) {
        accept_after = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      }
    }
  }
  for (Connection& c : connections) state.Disconnect(c.id);
  // The connections' sockets close as `connections` goes.
}

bool C10dStoreServer::AcceptAll(C10dStoreState& state, std::vector<Connection>& connections, uint64_t& next_id) {
  for (int i = 0; i < kAcceptsPerWake; ++i) {
    sockaddr_storage peer;
    socklen_t length = sizeof peer;
    UniqueFd fd(accept4(listen_fd_.get(), reinterpret_cast<sockaddr*>(&peer), &length, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd.valid()) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        LOG(WARNING) << "c10d store: accept: " << ErrnoText(errno) << "; accepting again in 100 ms";
        return false;
      }
      continue;  // ECONNABORTED and the like: that connection only
    }
    const std::string text = AddressText(peer);
    if (!PeerAllowed(peer)) {
      LOG(WARNING) << "c10d store: closed a connection from " << text << ": not one of the job's hosts";
      continue;
    }
    if (connections.size() >= options_.max_clients) {
      LOG(WARNING) << "c10d store: closed a connection from " << text << ": " << connections.size()
                   << " connections already, the most it takes (max_clients)";
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Connection c;
    c.id = next_id++;
    c.fd = std::move(fd);
    c.peer = text;
    state.Connect(c.id);
    connections.push_back(std::move(c));
  }
  return true;
}

bool C10dStoreServer::ReadFrom(C10dStoreState& state, Connection& c, short revents) {
  // Paused (its unsent answers first), unless the connection is gone: poll reports that unasked.
  if (!state.WantsInput(c.id)) return (revents & (POLLHUP | POLLERR)) == 0;
  std::string bytes;
  bool eof = false;
  char buffer[kReadChunk];
  for (int i = 0; i < kReadsPerWake; ++i) {
    const ssize_t n = read(c.fd.get(), buffer, sizeof buffer);
    if (n > 0) {
      bytes.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) {
      eof = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      eof = true;  // ECONNRESET and the like: the client is gone
    }
    break;
  }
  // Requests that came before the end are still applied (a SET, then the client exits).
  if (absl::Status status = state.Receive(c.id, bytes); !status.ok()) {
    LOG(WARNING) << "c10d store: closed the connection from " << c.peer << ": " << status.message();
    return false;
  }
  return !eof;
}

bool C10dStoreServer::WriteTo(C10dStoreState& state, Connection& c) {
  for (;;) {
    absl::string_view out = state.Output(c.id);
    if (out.empty()) {
      if (!state.HasPendingInput(c.id)) return true;
      // Its answers are out: the requests it sent meanwhile are answered now.
      if (absl::Status status = state.Resume(c.id); !status.ok()) {
        LOG(WARNING) << "c10d store: closed the connection from " << c.peer << ": " << status.message();
        return false;
      }
      if (state.Output(c.id).empty()) return true;
      continue;
    }
    const ssize_t n = send(c.fd.get(), out.data(), out.size(), MSG_NOSIGNAL);
    if (n > 0) {
      state.ConsumeOutput(c.id, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // else: the client is gone
  }
}

bool C10dStoreServer::PeerAllowed(const sockaddr_storage& peer) const {
  if (allowed_.empty()) return true;
  const std::string key = AddressKey(peer);
  for (const std::string& allowed : allowed_) {
    if (allowed == key) return true;
  }
  return false;
}

}  // namespace stagehand
