// The CPU transport: rendezvous through the key-value store, a TCP full mesh with a checked hello, framed
// blocking Send/Recv over non-blocking sockets and poll() (so deadlines and Abort work), and an
// all-reduce that reduces at rank 0 in rank order and broadcasts, so every rank gets the same bits.
#include "worker/cpu_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/logging.h"

namespace stagehand {
namespace {

constexpr uint32_t kHelloMagic = 0x54434853;  // "SHCT" on the wire (little-endian).
constexpr uint32_t kProtocolVersion = 1;
constexpr size_t kHelloBytes = 24;
constexpr size_t kHeaderBytes = 8;

std::string PeerName(int rank) { return absl::StrCat("rank ", rank); }

// A fixed hash (not absl::Hash, which is seeded per process) so that ranks on different hosts agree.
uint64_t Fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Wire integers are little-endian byte by byte, so hosts of either byte order interoperate.
void PutU64(uint64_t v, char* out, int bytes = 8) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t GetU64(const char* in, int bytes = 8) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return v;
}

// poll() takes milliseconds: an infinite deadline waits forever, a past one only polls.
int PollTimeoutMs(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

// Waits until `fd` is ready for `events`. Readiness includes hang-up and error, which the following
// recv/send then reports precisely.
absl::Status WaitReady(int fd, short events, absl::Time deadline, const std::string& who) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, PollTimeoutMs(deadline));
    if (n > 0) return absl::OkStatus();
    if (n == 0 && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("timed out waiting for ", who));
    }
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll on the socket of ", who, ": ", ErrnoText(errno)));
    }
  }
}

absl::Status SocketError(int err, const std::string& who) {
  if (err == EPIPE || err == ECONNRESET || err == ENOTCONN) {
    return absl::UnavailableError(absl::StrCat(who, " closed the connection"));
  }
  return absl::UnavailableError(absl::StrCat("socket error with ", who, ": ", ErrnoText(err)));
}

// Writes all `n` bytes, across short writes and EINTR. MSG_NOSIGNAL: a closed peer is an error
// to report, not a SIGPIPE that kills the worker.
absl::Status WriteFull(int fd, const char* data, size_t n, absl::Time deadline, const std::string& who) {
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      absl::Status st = WaitReady(fd, POLLOUT, deadline, who);
      if (!st.ok()) return st;
    } else {
      return SocketError(w < 0 ? errno : EPIPE, who);
    }
  }
  return absl::OkStatus();
}

absl::Status ReadFull(int fd, char* data, size_t n, absl::Time deadline, const std::string& who) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, data, n, 0);
    if (r > 0) {
      data += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0) {
      return absl::UnavailableError(absl::StrCat(who, " closed the connection"));
    } else if (errno == EINTR) {
      continue;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      absl::Status st = WaitReady(fd, POLLIN, deadline, who);
      if (!st.ok()) return st;
    } else {
      return SocketError(errno, who);
    }
  }
  return absl::OkStatus();
}

// ---- Rendezvous ----

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  int rank = 0;
  int world_size = 0;
  uint64_t prefix_hash = 0;
};

std::array<char, kHelloBytes> EncodeHello(const Hello& h) {
  std::array<char, kHelloBytes> out;
  PutU64(h.magic, &out[0], 4);
  PutU64(h.version, &out[4], 4);
  PutU64(static_cast<uint32_t>(h.rank), &out[8], 4);
  PutU64(static_cast<uint32_t>(h.world_size), &out[12], 4);
  PutU64(h.prefix_hash, &out[16]);
  return out;
}

Hello DecodeHello(const std::array<char, kHelloBytes>& in) {
  Hello h;
  h.magic = static_cast<uint32_t>(GetU64(&in[0], 4));
  h.version = static_cast<uint32_t>(GetU64(&in[4], 4));
  h.rank = static_cast<int32_t>(GetU64(&in[8], 4));
  h.world_size = static_cast<int32_t>(GetU64(&in[12], 4));
  h.prefix_hash = GetU64(&in[16]);
  return h;
}

// What one rank knows while it builds the mesh.
struct Rendezvous {
  const CpuTransportOptions& options;
  Hello mine;
  absl::Time deadline;
  std::string Where() const {  // Prefix of every rendezvous error.
    return absl::StrCat("cpu transport rank ", options.rank, " of ", options.world_size,
                        " (key_prefix '", options.key_prefix, "'): ");
  }
};

std::string AddressKey(const std::string& prefix, int rank) {
  return absl::StrCat(prefix, "/cpu/addr/", rank);
}

// Checks the fields every rank of one communicator must share; `from` names the other side.
absl::Status CheckHello(const Hello& got, const Hello& mine, const std::string& from) {
  if (got.magic != kHelloMagic || got.version != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " does not speak cpu transport protocol ", kProtocolVersion, " (magic ", got.magic,
        ", version ", got.version, "); is another program using this port?"));
  }
  if (got.world_size != mine.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " (rank ", got.rank, ") has world size ", got.world_size, " but this rank has ",
        mine.world_size, "; start every rank of a communicator with the same world size"));
  }
  if (got.prefix_hash != mine.prefix_hash) {
    return absl::InvalidArgumentError(absl::StrCat(
        from, " (rank ", got.rank, ") has a different key_prefix; two communicators are sharing "
        "addresses, give each job and communicator its own key_prefix"));
  }
  return absl::OkStatus();
}

absl::Status SetNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return absl::UnavailableError(absl::StrCat("setsockopt(TCP_NODELAY): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

using AddrInfoPtr = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

absl::StatusOr<AddrInfoPtr> Resolve(const std::string& host, const std::string& port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return AddrInfoPtr(res, &freeaddrinfo);
}

struct Listener {
  UniqueFd fd;
  std::string address;  // "host:port" or "[v6]:port", as published.
};

int LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
}

absl::StatusOr<Listener> Listen(const std::string& host, int backlog) {
  // A wildcard would be published as is, and other hosts cannot connect to "0.0.0.0".
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen_host '", host, "' is not an address other ranks can reach; pass this host's address"));
  }
  absl::StatusOr<AddrInfoPtr> ais = Resolve(host, "0", AI_PASSIVE);
  if (!ais.ok()) return ais.status();
  int err = 0;
  for (addrinfo* ai = ais->get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.valid() && ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 &&
        ::listen(fd.get(), backlog) == 0) {
      const int port = LocalPort(fd.get());
      const bool v6 = host.find(':') != std::string::npos;
      std::string address = v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
      return Listener{std::move(fd), std::move(address)};
    }
    err = errno;
  }
  return absl::UnavailableError(absl::StrCat("cannot listen on '", host, "': ", ErrnoText(err),
                                             "; is it an address of this host?"));
}

// One non-blocking connect bounded by `deadline`; returns the socket or the errno that stopped it.
std::pair<UniqueFd, int> ConnectOnce(const addrinfo& ai, absl::Time deadline) {
  UniqueFd fd(::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return {UniqueFd(), errno};
  if (::connect(fd.get(), ai.ai_addr, ai.ai_addrlen) == 0) return {std::move(fd), 0};
  // EINTR leaves the connect going on asynchronously, exactly like EINPROGRESS.
  if (errno != EINPROGRESS && errno != EINTR) return {UniqueFd(), errno};
  if (!WaitReady(fd.get(), POLLOUT, deadline, "connect").ok()) return {UniqueFd(), ETIMEDOUT};
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return {UniqueFd(), err};
  return {std::move(fd), 0};
}

// Retries refusals until the deadline: a peer may publish its address a moment before a restarted
// network namespace or a slow host lets it accept.
absl::StatusOr<UniqueFd> ConnectWithRetry(const std::string& address, absl::Time deadline) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return absl::InvalidArgumentError("malformed address");
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  absl::StatusOr<AddrInfoPtr> ais = Resolve(host, address.substr(colon + 1), 0);
  if (!ais.ok()) return ais.status();
  absl::Duration backoff = absl::Milliseconds(5);
  for (;;) {
    int err = 0;
    for (addrinfo* ai = ais->get(); ai != nullptr; ai = ai->ai_next) {
      auto [fd, e] = ConnectOnce(*ai, deadline);
      if (fd.valid()) return std::move(fd);
      err = e;
    }
    const bool retry = err == ECONNREFUSED && absl::Now() + backoff < deadline;
    if (err == ETIMEDOUT || (err == ECONNREFUSED && !retry)) {
      return absl::DeadlineExceededError(absl::StrCat("could not connect before the deadline (",
                                                      ErrnoText(err), ")"));
    }
    if (!retry) return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(err)));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

// Connects to a lower rank: its address from the store, then our hello, then its reply, which must
// come from the rank we meant to reach.
absl::StatusOr<UniqueFd> ConnectToLower(const Rendezvous& rv, int peer, KeyValueStore& kv) {
  const std::string key = AddressKey(rv.options.key_prefix, peer);
  absl::StatusOr<std::string> address = kv.Get(key, rv.deadline - absl::Now());
  if (absl::IsDeadlineExceeded(address.status())) {
    return absl::DeadlineExceededError(absl::StrCat(
        rv.Where(), "rank ", peer, " did not publish its address under '", key, "' within ",
        absl::FormatDuration(rv.options.connect_timeout), "; was it started, with the same key_prefix?"));
  }
  if (!address.ok()) {
    return absl::Status(address.status().code(), absl::StrCat(rv.Where(), "reading '", key, "': ",
                                                              address.status().message()));
  }
  const std::string who = PeerName(peer);
  auto fail = [&](const absl::Status& st) {
    return absl::Status(st.code(), absl::StrCat(rv.Where(), "handshake with ", who, " at ", *address,
                                                ": ", st.message()));
  };
  absl::StatusOr<UniqueFd> fd = ConnectWithRetry(*address, rv.deadline);
  if (!fd.ok()) return fail(fd.status());
  const auto hello = EncodeHello(rv.mine);
  absl::Status st = WriteFull(fd->get(), hello.data(), hello.size(), rv.deadline, who);
  std::array<char, kHelloBytes> reply{};
  if (st.ok()) st = ReadFull(fd->get(), reply.data(), reply.size(), rv.deadline, who);
  if (absl::IsUnavailable(st)) {
    return fail(absl::UnavailableError(absl::StrCat(st.message(), " (it may have rejected this "
                                                    "rank's hello: see the error it reports)")));
  }
  const Hello theirs = DecodeHello(reply);
  if (st.ok()) st = CheckHello(theirs, rv.mine, who);
  if (st.ok() && theirs.rank != peer) {
    st = absl::InvalidArgumentError(
        absl::StrCat("the address answered as rank ", theirs.rank, "; is the address stale?"));
  }
  if (st.ok()) st = SetNoDelay(fd->get());
  if (!st.ok()) return fail(st);
  return std::move(*fd);
}

std::string MissingRanks(const std::vector<UniqueFd>& peers, int rank) {
  std::vector<int> missing;
  for (int r = rank + 1; r < static_cast<int>(peers.size()); ++r) {
    if (!peers[r].valid()) missing.push_back(r);
  }
  return absl::StrJoin(missing, ", ");
}

// Waits for the next incoming connection; DEADLINE_EXCEEDED when none comes in time.
absl::StatusOr<UniqueFd> AcceptOne(int listen_fd, absl::Time deadline) {
  for (;;) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd >= 0) return UniqueFd(fd);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("accept: ", ErrnoText(errno)));
    }
    absl::Status st = WaitReady(listen_fd, POLLIN, deadline, "connections");
    if (!st.ok()) return st;
  }
}

// Accepts one connection from a higher rank, checks its hello, answers with ours, and files the
// socket under the rank it claims (each higher rank exactly once). A bad hello fails the whole
// rendezvous rather than being skipped: it means a misconfigured job, which retrying cannot fix.
absl::Status AcceptFromHigher(const Rendezvous& rv, int listen_fd, std::vector<UniqueFd>& peers) {
  absl::StatusOr<UniqueFd> fd = AcceptOne(listen_fd, rv.deadline);
  if (absl::IsDeadlineExceeded(fd.status())) {
    return absl::DeadlineExceededError(absl::StrCat(
        rv.Where(), "ranks ", MissingRanks(peers, rv.options.rank), " did not connect within ",
        absl::FormatDuration(rv.options.connect_timeout), "; were they started, with the same "
        "key_prefix and world size?"));
  }
  if (!fd.ok()) return absl::Status(fd.status().code(), rv.Where() + std::string(fd.status().message()));
  const std::string who = "a connecting rank";
  std::array<char, kHelloBytes> buf{};
  absl::Status st = ReadFull(fd->get(), buf.data(), buf.size(), rv.deadline, who);
  const Hello got = DecodeHello(buf);
  if (st.ok()) st = CheckHello(got, rv.mine, who);
  if (st.ok() && (got.rank <= rv.options.rank || got.rank >= rv.options.world_size ||
                  peers[got.rank].valid())) {
    st = absl::InvalidArgumentError(absl::StrCat(
        who, " claims rank ", got.rank, ", which is not a higher rank still expected (",
        MissingRanks(peers, rv.options.rank), "); are two ranks started with the same rank?"));
  }
  const auto hello = EncodeHello(rv.mine);
  if (st.ok()) st = WriteFull(fd->get(), hello.data(), hello.size(), rv.deadline, PeerName(got.rank));
  if (st.ok()) st = SetNoDelay(fd->get());
  if (!st.ok()) return absl::Status(st.code(), rv.Where() + std::string(st.message()));
  peers[got.rank] = std::move(*fd);
  return absl::OkStatus();
}

// Rank r connects to every lower rank, then accepts every higher one. No cycle of waits: a rank waits
// only on lower ranks' replies, and rank 0 waits on nobody before it starts accepting.
absl::StatusOr<std::vector<UniqueFd>> BuildMesh(const Rendezvous& rv, KeyValueStore& kv) {
  const CpuTransportOptions& o = rv.options;
  std::vector<UniqueFd> peers(o.world_size);
  if (o.world_size == 1) return peers;
  absl::StatusOr<Listener> listener = Listen(o.listen_host, o.world_size);
  if (!listener.ok()) return absl::Status(listener.status().code(), rv.Where() +
                                          std::string(listener.status().message()));
  const std::string key = AddressKey(o.key_prefix, o.rank);
  absl::Status st = kv.Set(key, listener->address);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(rv.Where(), "publishing '", key, "': ", st.message(),
                                                "; is another job using the same key_prefix?"));
  }
  for (int peer = 0; peer < o.rank; ++peer) {
    absl::StatusOr<UniqueFd> fd = ConnectToLower(rv, peer, kv);
    if (!fd.ok()) return fd.status();
    peers[peer] = std::move(*fd);
  }
  for (int i = o.rank + 1; i < o.world_size; ++i) {
    st = AcceptFromHigher(rv, listener->fd.get(), peers);
    if (!st.ok()) return st;
  }
  return peers;
}

// ---- The transport ----

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kBFloat16: return "bfloat16";
    case DType::kInt64: return "int64";
  }
  return "unknown";
}

template <typename T>
void AddInto(void* acc, const void* x, int64_t count) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(x);
  for (int64_t i = 0; i < count; ++i) a[i] = a[i] + b[i];
}

// acc += x elementwise. int64 adds as uint64: the same bits as two's complement, without the
// undefined behaviour of signed overflow.
void Accumulate(void* acc, const void* x, int64_t count, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return AddInto<float>(acc, x, count);
    case DType::kFloat64: return AddInto<double>(acc, x, count);
    case DType::kInt64: return AddInto<uint64_t>(acc, x, count);
    case DType::kBFloat16: return;  // Rejected before any data moves.
  }
}

class CpuTransport final : public Transport {
 public:
  CpuTransport(const CpuTransportOptions& options, std::vector<UniqueFd> peers)
      : options_(options), peers_(std::move(peers)), broken_(options.world_size) {}

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }
  std::string name() const override { return "cpu"; }

  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override;
  absl::Status Send(const void* data, int64_t bytes, int peer) override;
  absl::Status Recv(void* data, int64_t bytes, int peer) override;
  absl::Status Group(const std::vector<P2POp>& ops) override;

  // Only shutdown(), never close(): another thread may be inside poll/recv on these descriptors,
  // and a closed number could be reused by an unrelated file under it.
  void Abort() override {
    aborted_.store(true);
    for (const UniqueFd& fd : peers_) {
      if (fd.valid()) ::shutdown(fd.get(), SHUT_RDWR);
    }
  }

 private:
  absl::Status CheckCall(int peer, int64_t bytes) const;
  absl::Status SendFrame(const void* data, int64_t bytes, int peer);
  absl::Status RecvFrame(void* data, int64_t bytes, int peer);
  absl::Status Settle(absl::Status st, int peer);
  absl::Status Broken(int peer) const {
    absl::MutexLock lock(&broken_mu_);
    return broken_[peer];
  }
  absl::Status WithContext(absl::Status st, const std::string& what) const;
  absl::Time IoDeadline() const { return absl::Now() + options_.io_timeout; }

  const CpuTransportOptions options_;
  const std::vector<UniqueFd> peers_;  // Indexed by rank; this rank's entry stays invalid.
  // Set when a frame to or from a peer failed part-way: the byte stream is out of step after that, so
  // later calls on it fail instead of reading garbage. Group() sends and receives from two threads.
  mutable absl::Mutex broken_mu_;
  std::vector<absl::Status> broken_ ABSL_GUARDED_BY(broken_mu_);
  std::atomic<bool> aborted_{false};
};

absl::Status Cancelled() { return absl::CancelledError("transport aborted"); }

absl::Status CpuTransport::CheckCall(int peer, int64_t bytes) const {
  if (peer < 0 || peer >= options_.world_size || peer == options_.rank) {
    return absl::InvalidArgumentError(absl::StrCat("peer ", peer, " is not another rank of world size ",
                                                   options_.world_size));
  }
  if (bytes < 0) return absl::InvalidArgumentError(absl::StrCat("negative size ", bytes));
  return absl::OkStatus();
}

absl::Status CpuTransport::Settle(absl::Status st, int peer) {
  if (st.ok()) return st;
  if (aborted_.load()) return Cancelled();
  if (absl::IsDeadlineExceeded(st)) {
    st = absl::DeadlineExceededError(
        absl::StrCat(st.message(), " (io_timeout ", absl::FormatDuration(options_.io_timeout), ")"));
  }
  absl::MutexLock lock(&broken_mu_);
  broken_[peer] = absl::FailedPreconditionError(absl::StrCat(
      "the connection to rank ", peer, " is unusable after an earlier error: ", st.message()));
  return st;
}

absl::Status CpuTransport::WithContext(absl::Status st, const std::string& what) const {
  if (st.ok() || absl::IsCancelled(st)) return st;
  return absl::Status(st.code(), absl::StrCat("cpu transport rank ", options_.rank, ": ", what, ": ",
                                              st.message()));
}

// A frame is an 8-byte length, then the bytes; the length lets the receiver catch schedule bugs.
absl::Status CpuTransport::SendFrame(const void* data, int64_t bytes, int peer) {
  if (absl::Status b = Broken(peer); !b.ok()) return b;
  const absl::Time deadline = IoDeadline();
  const int fd = peers_[peer].get();
  char header[kHeaderBytes];
  PutU64(static_cast<uint64_t>(bytes), header);
  absl::Status st = WriteFull(fd, header, sizeof(header), deadline, PeerName(peer));
  if (st.ok()) st = WriteFull(fd, static_cast<const char*>(data), bytes, deadline, PeerName(peer));
  return Settle(std::move(st), peer);
}

absl::Status CpuTransport::RecvFrame(void* data, int64_t bytes, int peer) {
  if (absl::Status b = Broken(peer); !b.ok()) return b;
  const absl::Time deadline = IoDeadline();
  const int fd = peers_[peer].get();
  char header[kHeaderBytes];
  absl::Status st = ReadFull(fd, header, sizeof(header), deadline, PeerName(peer));
  const uint64_t sent = GetU64(header);
  if (st.ok() && sent != static_cast<uint64_t>(bytes)) {
    st = absl::InternalError(absl::StrCat("rank ", peer, " sent ", sent, " bytes but this rank expected ",
                                          bytes, " bytes; the two ranks' schedules disagree"));
  }
  if (st.ok()) st = ReadFull(fd, static_cast<char*>(data), bytes, deadline, PeerName(peer));
  return Settle(std::move(st), peer);
}

absl::Status CpuTransport::Send(const void* data, int64_t bytes, int peer) {
  if (aborted_.load()) return Cancelled();
  absl::Status st = CheckCall(peer, bytes);
  if (st.ok()) st = SendFrame(data, bytes, peer);
  return WithContext(std::move(st), absl::StrCat("Send of ", bytes, " bytes to rank ", peer));
}

absl::Status CpuTransport::Recv(void* data, int64_t bytes, int peer) {
  if (aborted_.load()) return Cancelled();
  absl::Status st = CheckCall(peer, bytes);
  if (st.ok()) st = RecvFrame(data, bytes, peer);
  return WithContext(std::move(st), absl::StrCat("Recv of ", bytes, " bytes from rank ", peer));
}

// Sends go on their own thread while this one receives: a peer that sends to us in the same group
// would otherwise wait for our receive while we wait for its receive (blocking sockets).
absl::Status CpuTransport::Group(const std::vector<P2POp>& ops) {
  absl::Status send_status;
  std::thread sender([&] {
    for (const P2POp& op : ops) {
      if (op.send && send_status.ok()) send_status = Send(op.data, op.bytes, op.peer);
    }
  });
  absl::Status recv_status;
  for (const P2POp& op : ops) {
    if (!op.send && recv_status.ok()) recv_status = Recv(op.data, op.bytes, op.peer);
  }
  if (!recv_status.ok()) Abort();  // the sender may wait on a peer that will never read
  sender.join();
  return recv_status.ok() ? send_status : recv_status;
}

// Reduce at rank 0 in rank order (((r0 + r1) + r2) + ...), then broadcast rank 0's bytes: the result
// is deterministic and bit-identical everywhere. Blocking sends cannot deadlock: rank 0 drains the
// ranks one by one while they wait, then each rank only waits to receive.
absl::Status CpuTransport::AllReduceSum(void* data, int64_t count, DType dtype) {
  if (aborted_.load()) return Cancelled();
  const std::string what = absl::StrCat("AllReduceSum of ", count, " ", DTypeName(dtype), " elements");
  if (dtype == DType::kBFloat16) {
    return absl::UnimplementedError(absl::StrCat(
        "cpu transport: AllReduceSum of bfloat16 is not supported; reduce in float32"));
  }
  if (count < 0 || count > INT64_MAX / 8) {
    return absl::InvalidArgumentError(absl::StrCat("cpu transport: ", what, ": bad count"));
  }
  const int64_t bytes = count * DTypeSize(dtype);
  absl::Status st;
  if (options_.rank != 0) {
    st = SendFrame(data, bytes, 0);
    if (st.ok()) st = RecvFrame(data, bytes, 0);
    return WithContext(std::move(st), what);
  }
  std::vector<uint64_t> incoming((bytes + 7) / 8);  // uint64 storage: aligned for every dtype.
  for (int peer = 1; peer < options_.world_size && st.ok(); ++peer) {
    st = RecvFrame(incoming.data(), bytes, peer);
    if (st.ok()) Accumulate(data, incoming.data(), count, dtype);
  }
  for (int peer = 1; peer < options_.world_size && st.ok(); ++peer) st = SendFrame(data, bytes, peer);
  return WithContext(std::move(st), what);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectCpuTransport(const CpuTransportOptions& options,
                                                               KeyValueStore& kv) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("cpu transport: rank ", options.rank,
                                                   " is not in [0, world size ", options.world_size, ")"));
  }
  const absl::Time start = absl::Now();
  Rendezvous rv{options, Hello{}, start + options.connect_timeout};
  rv.mine.rank = options.rank;
  rv.mine.world_size = options.world_size;
  rv.mine.prefix_hash = Fnv1a64(options.key_prefix);
  absl::StatusOr<std::vector<UniqueFd>> peers = BuildMesh(rv, kv);
  if (!peers.ok()) return peers.status();
  LOG(INFO) << "cpu transport rank " << options.rank << " of " << options.world_size << " ('"
            << options.key_prefix << "') connected in " << absl::FormatDuration(absl::Now() - start);
  return std::unique_ptr<Transport>(new CpuTransport(options, std::move(*peers)));
}

}  // namespace stagehand
