// The CPU transport: rendezvous through the key-value store, a TCP full mesh whose every connection
// proves the job secret (an HMAC challenge both ways; strangers are dropped and the job goes on), framed
// blocking Send/Recv over non-blocking sockets and poll() (so deadlines and Abort work), and an
// all-reduce that reduces at rank 0 in rank order and broadcasts, so every rank gets the same bits.
#include "transport/cpu_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
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
#include "common/crypto.h"
#include "common/fd.h"
#include "common/logging.h"

namespace stagehand {
namespace {

constexpr uint32_t kHelloMagic = 0x54434853;  // "SHCT" on the wire (little-endian).
constexpr uint32_t kProtocolVersion = 2;      // 1 had no proof of the job secret
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
//
// The handshake (protocol 2), higher rank C connecting to lower rank A; integers little-endian:
//   C -> A  hello      magic "SHCT" u32, version u32, sender rank u32, receiver rank u32, world size u32,
//                      key-prefix hash u64 (a diagnostic only), C's nonce [32]                 60 bytes
//   A -> C  challenge  A's hello (its rank, C's rank, A's nonce), then MAC_A [32]             92 bytes
//   C -> A  proof      MAC_C [32]                                                              32 bytes
//   A -> C  verdict    "SHOK" u32, once A has filed the connection under C's rank              4 bytes
// MAC_X = HMAC-SHA256(secret, "stagehand-cpu-transport v2" || role X ('A' or 'C') || u32 length of the
// key prefix || key prefix || C's nonce || A's nonce || u32 X's rank || u32 the other's rank || u32 world
// size). Each side checks the other's MAC (constant time) before it trusts the connection; fresh nonces
// on both sides make a captured exchange worthless, and the role byte keeps one side's answer from
// being reflected as the other's. The secret itself never goes on the wire.

constexpr uint32_t kVerdictMagic = 0x4b4f4853;  // "SHOK"
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloBytes = 28 + kNonceBytes;
constexpr size_t kChallengeBytes = kHelloBytes + kSha256Bytes;
constexpr size_t kVerdictBytes = 4;
// More connections than this in handshake at once are a flood: the oldest is dropped to make room.
constexpr size_t kMaxPendingHandshakes = 64;
// Warnings for dropped connections are rate-limited so that a flood cannot fill the rank's log.
constexpr int kDropsLoggedInFull = 10;
constexpr char kMacLabel[] = "stagehand-cpu-transport v2";

using Nonce = std::array<uint8_t, kNonceBytes>;

struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  int sender = 0;
  int receiver = 0;
  int world_size = 0;
  uint64_t prefix_hash = 0;
  Nonce nonce{};
};

std::string EncodeHello(const Hello& h) {
  std::string out(kHelloBytes, '\0');
  PutU64(h.magic, &out[0], 4);
  PutU64(h.version, &out[4], 4);
  PutU64(static_cast<uint32_t>(h.sender), &out[8], 4);
  PutU64(static_cast<uint32_t>(h.receiver), &out[12], 4);
  PutU64(static_cast<uint32_t>(h.world_size), &out[16], 4);
  PutU64(h.prefix_hash, &out[20]);
  std::memcpy(&out[28], h.nonce.data(), kNonceBytes);
  return out;
}

Hello DecodeHello(const char* in) {
  Hello h;
  h.magic = static_cast<uint32_t>(GetU64(&in[0], 4));
  h.version = static_cast<uint32_t>(GetU64(&in[4], 4));
  h.sender = static_cast<int32_t>(GetU64(&in[8], 4));
  h.receiver = static_cast<int32_t>(GetU64(&in[12], 4));
  h.world_size = static_cast<int32_t>(GetU64(&in[16], 4));
  h.prefix_hash = GetU64(&in[20]);
  std::memcpy(h.nonce.data(), &in[28], kNonceBytes);
  return h;
}

// What both sides of one connection put under their MACs; `role` is the side that computes it.
Sha256Digest HandshakeMac(const CpuTransportOptions& o, char role, const Nonce& connector_nonce,
                          const Nonce& acceptor_nonce, int sender, int receiver) {
  std::string m(kMacLabel);
  m.push_back(role);
  char u32[4];
  PutU64(o.key_prefix.size(), u32, 4);
  m.append(u32, 4).append(o.key_prefix);
  m.append(reinterpret_cast<const char*>(connector_nonce.data()), kNonceBytes);
  m.append(reinterpret_cast<const char*>(acceptor_nonce.data()), kNonceBytes);
  for (int v : {sender, receiver, o.world_size}) {
    PutU64(static_cast<uint32_t>(v), u32, 4);
    m.append(u32, 4);
  }
  return HmacSha256(o.secret, m);
}

Sha256Digest DigestAt(const char* in) {
  Sha256Digest d;
  std::memcpy(d.data(), in, d.size());
  return d;
}

std::string DigestBytes(const Sha256Digest& d) {
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

// What one rank knows while it builds the mesh.
struct Rendezvous {
  const CpuTransportOptions& options;
  uint64_t prefix_hash;
  absl::Time deadline;
  std::string Where() const {  // Prefix of every rendezvous error.
    return absl::StrCat("cpu transport rank ", options.rank, " of ", options.world_size, " (key_prefix '",
                        options.key_prefix, "'): ");
  }
};

std::string AddressKey(const std::string& prefix, int rank) { return absl::StrCat(prefix, "/cpu/addr/", rank); }

// The magic and version are checked as soon as they arrive, so that junk is dropped at once.
absl::Status CheckMagic(uint32_t magic, uint32_t version) {
  if (magic != kHelloMagic) {
    return absl::InvalidArgumentError(absl::StrCat("does not speak the cpu transport protocol (magic ", magic,
                                                   "); is another program using this port?"));
  }
  if (version != kProtocolVersion) {
    return absl::InvalidArgumentError(absl::StrCat("speaks cpu transport protocol ", version, " but this rank speaks ",
                                                   kProtocolVersion,
                                                   "; start every worker of a job from the same build"));
  }
  return absl::OkStatus();
}

// Checks the fields every rank of one communicator must share, and that `got` is from `sender` to
// `receiver` (-1: any sender, checked by the caller).
absl::Status CheckHello(const Hello& got, const Rendezvous& rv, int sender, int receiver) {
  if (absl::Status st = CheckMagic(got.magic, got.version); !st.ok()) return st;
  if (got.world_size != rv.options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", got.sender, " has world size ", got.world_size,
                                                   " but this rank has ", rv.options.world_size,
                                                   "; start every rank of a communicator with the same world size"));
  }
  if (got.prefix_hash != rv.prefix_hash) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", got.sender,
                                                   " has a different key_prefix; two communicators are sharing "
                                                   "addresses, give each job and communicator its own key_prefix"));
  }
  if (got.receiver != receiver) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", got.sender, " addressed rank ", got.receiver,
                                                   " but this is rank ", receiver, "; is the address stale?"));
  }
  if (sender >= 0 && got.sender != sender) {
    return absl::InvalidArgumentError(
        absl::StrCat("the address answered as rank ", got.sender, "; is the address stale?"));
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

// A deep backlog: strangers' connections wait there while this rank connects to lower ranks, and must
// not crowd out a real peer's.
constexpr int kListenBacklog = 128;

absl::StatusOr<Listener> Listen(const std::string& host) {
  // A wildcard would be published as is, and other hosts cannot connect to "0.0.0.0".
  if (host.empty() || host == "0.0.0.0" || host == "::") {
    return absl::InvalidArgumentError(
        absl::StrCat("listen_host '", host, "' is not an address other ranks can reach; pass this host's address"));
  }
  absl::StatusOr<AddrInfoPtr> ais = Resolve(host, "0", AI_PASSIVE);
  if (!ais.ok()) return ais.status();
  int err = 0;
  for (addrinfo* ai = ais->get(); ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.valid() && ::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd.get(), kListenBacklog) == 0) {
      const int port = LocalPort(fd.get());
      const bool v6 = host.find(':') != std::string::npos;
      std::string address = v6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
      return Listener{std::move(fd), std::move(address)};
    }
    err = errno;
  }
  return absl::UnavailableError(
      absl::StrCat("cannot listen on '", host, "': ", ErrnoText(err), "; is it an address of this host?"));
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
      return absl::DeadlineExceededError(absl::StrCat("could not connect before the deadline (", ErrnoText(err), ")"));
    }
    if (!retry) return absl::UnavailableError(absl::StrCat("connect: ", ErrnoText(err)));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
}

// The connecting side of the handshake, on a connected socket to `peer`: hello, then the challenge,
// whose MAC must prove the job secret, then our proof, then the verdict.
absl::Status ConnectorHandshake(const Rendezvous& rv, int fd, int peer) {
  const CpuTransportOptions& o = rv.options;
  const std::string who = PeerName(peer);
  Hello mine{kHelloMagic, kProtocolVersion, o.rank, peer, o.world_size, rv.prefix_hash};
  if (absl::Status st = RandomBytes(mine.nonce.data(), mine.nonce.size()); !st.ok()) return st;
  const std::string hello = EncodeHello(mine);
  absl::Status st = WriteFull(fd, hello.data(), hello.size(), rv.deadline, who);
  char challenge[kChallengeBytes];
  if (st.ok()) st = ReadFull(fd, challenge, sizeof(challenge), rv.deadline, who);
  if (absl::IsUnavailable(st)) {
    return absl::UnavailableError(absl::StrCat(st.message(),
                                               " before its challenge (it refused this "
                                               "rank's hello: its log says why)"));
  }
  if (!st.ok()) return st;
  const Hello theirs = DecodeHello(challenge);
  if (st = CheckHello(theirs, rv, peer, o.rank); !st.ok()) return st;
  const Sha256Digest expected = HandshakeMac(o, 'A', mine.nonce, theirs.nonce, peer, o.rank);
  if (!ConstantTimeEqual(expected, DigestAt(challenge + kHelloBytes))) {
    return absl::PermissionDeniedError(
        absl::StrCat(who,
                     " answered without proving this job's secret: the two ranks were given different job "
                     "secrets (workers of two launches?) or another process answers at this address; start every "
                     "worker of a job from the same launcher"));
  }
  const std::string proof = DigestBytes(HandshakeMac(o, 'C', mine.nonce, theirs.nonce, o.rank, peer));
  st = WriteFull(fd, proof.data(), proof.size(), rv.deadline, who);
  char verdict[kVerdictBytes];
  if (st.ok()) st = ReadFull(fd, verdict, sizeof(verdict), rv.deadline, who);
  if (absl::IsUnavailable(st)) {
    return absl::UnavailableError(absl::StrCat(st.message(),
                                               " after this rank's proof: it refused "
                                               "this rank (is another worker running as rank ",
                                               o.rank, "? its log says why)"));
  }
  if (st.ok() && GetU64(verdict, 4) != kVerdictMagic) {
    st = absl::InvalidArgumentError("answered the proof with something other than the verdict");
  }
  return st;
}

// Connects to a lower rank: its address from the store, then the handshake.
absl::StatusOr<UniqueFd> ConnectToLower(const Rendezvous& rv, int peer, KeyValueStore& kv) {
  const std::string key = AddressKey(rv.options.key_prefix, peer);
  absl::StatusOr<std::string> address = kv.Get(key, rv.deadline - absl::Now());
  if (absl::IsDeadlineExceeded(address.status())) {
    return absl::DeadlineExceededError(absl::StrCat(rv.Where(), "rank ", peer, " did not publish its address under '",
                                                    key, "' within ", absl::FormatDuration(rv.options.connect_timeout),
                                                    "; was it started, with the same key_prefix?"));
  }
  if (!address.ok()) {
    return absl::Status(address.status().code(),
                        absl::StrCat(rv.Where(), "reading '", key, "': ", address.status().message()));
  }
  auto fail = [&](const absl::Status& st) {
    return absl::Status(
        st.code(), absl::StrCat(rv.Where(), "handshake with ", PeerName(peer), " at ", *address, ": ", st.message()));
  };
  absl::StatusOr<UniqueFd> fd = ConnectWithRetry(*address, rv.deadline);
  if (!fd.ok()) return fail(fd.status());
  absl::Status st = ConnectorHandshake(rv, fd->get(), peer);
  if (st.ok()) st = SetNoDelay(fd->get());
  if (!st.ok()) return fail(st);
  return std::move(*fd);
}

std::string PeerAddress(const sockaddr_storage& ss, socklen_t len) {
  char host[NI_MAXHOST], port[NI_MAXSERV];
  if (::getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "an unknown address";
  }
  return ss.ss_family == AF_INET6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

// The accepting side of the handshake for every connection that reaches this rank's listener, all at
// once in one poll() loop: a stranger that stalls holds only its own slot until its own deadline, and
// a connection that fails any check is dropped with a warning while the listener goes on accepting.
// During the rendezvous it files the higher ranks that prove themselves; afterwards (Serve, on the
// transport's thread) every rank is connected, so it drops whatever comes until Stop.
class Doorman {
 public:
  Doorman(const CpuTransportOptions& options, uint64_t prefix_hash, UniqueFd listener)
      : options_(options),
        rv_{options_, prefix_hash, absl::InfiniteFuture()},
        listener_(std::move(listener)),
        wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  // False when the eventfd could not be made: Stop() could not reach Serve(), so none may run.
  bool ok() const { return wake_.valid(); }

  // Until every higher rank has a verified socket in `peers`, or `deadline`.
  absl::Status AcceptHigherRanks(std::vector<UniqueFd>& peers, absl::Time deadline);
  // Drops every connection until Stop() is called (from any thread).
  void Serve() { (void)Loop(nullptr, absl::InfiniteFuture()); }
  void Stop() {
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  }

 private:
  enum class Stage { kHello, kProof };
  struct Pending {
    UniqueFd fd;
    std::string from;  // the stranger's address, for the warning
    absl::Time deadline;
    Stage stage = Stage::kHello;
    std::string buf;  // what has come of the message this stage reads
    Hello hello;      // theirs, once read
    Nonce nonce{};    // ours
  };

  absl::Status Loop(std::vector<UniqueFd>* peers, absl::Time deadline);
  bool Connected(const std::vector<UniqueFd>* peers, int rank) const {
    return peers == nullptr || rank <= options_.rank || (*peers)[rank].valid();
  }
  void AcceptNew();
  absl::StatusOr<bool> ReadSome(Pending& p, size_t need);
  absl::StatusOr<bool> Advance(Pending& p, std::vector<UniqueFd>* peers);
  absl::Status OnHello(Pending& p, const std::vector<UniqueFd>* peers);
  absl::Status OnProof(Pending& p, std::vector<UniqueFd>* peers);
  void Drop(const Pending& p, const absl::Status& why);

  const CpuTransportOptions options_;
  const Rendezvous rv_;
  const UniqueFd listener_;
  const UniqueFd wake_;  // an eventfd: Stop() makes it readable
  std::vector<Pending> pending_;
  int drops_ = 0;
  std::string last_drop_;
};

void Doorman::Drop(const Pending& p, const absl::Status& why) {
  ++drops_;
  const std::string text = absl::StrCat("dropped the connection from ", p.from, ": ", why.message());
  last_drop_ = text;
  if (drops_ <= kDropsLoggedInFull || drops_ % 100 == 0) {
    LOG(WARNING) << rv_.Where() << text
                 << (drops_ > kDropsLoggedInFull ? absl::StrCat(" (", drops_, " dropped so far)") : "")
                 << "; the transport goes on";
  }
  if (options_.on_dropped_connection) options_.on_dropped_connection(absl::Status(why.code(), text));
}

void Doorman::AcceptNew() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors under a flood: the oldest stranger makes room, or the listener would stay
      // readable and spin this loop. EAGAIN (drained) and anything else wait for the next readiness.
      if ((errno == EMFILE || errno == ENFILE) && !pending_.empty()) {
        Drop(pending_.front(), absl::ResourceExhaustedError(
                                   absl::StrCat("this process ran out of file descriptors (", ErrnoText(errno), ")")));
        pending_.erase(pending_.begin());
        continue;
      }
      return;
    }
    if (pending_.size() >= kMaxPendingHandshakes) {
      Drop(pending_.front(), absl::ResourceExhaustedError(absl::StrCat("more than ", kMaxPendingHandshakes,
                                                                       " connections in handshake at once")));
      pending_.erase(pending_.begin());
    }
    Pending p;
    p.fd.reset(fd);
    p.from = PeerAddress(ss, len);
    p.deadline = absl::Now() + options_.handshake_timeout;
    pending_.push_back(std::move(p));
  }
}

// Reads toward `need` bytes of the current message without blocking: true once they are all there.
// Never reads past the message, so what a stranger sends early waits for the stage that reads it.
absl::StatusOr<bool> Doorman::ReadSome(Pending& p, size_t need) {
  while (p.buf.size() < need) {
    char chunk[kChallengeBytes];
    const ssize_t r = ::recv(p.fd.get(), chunk, need - p.buf.size(), 0);
    if (r > 0) {
      p.buf.append(chunk, r);
      if (p.stage == Stage::kHello && p.buf.size() >= 8) {
        absl::Status st = CheckMagic(GetU64(&p.buf[0], 4), GetU64(&p.buf[4], 4));
        if (!st.ok()) return st;
      }
    } else if (r == 0) {
      return absl::UnavailableError(absl::StrCat("closed the connection after ", p.buf.size(), " of the ", need,
                                                 " bytes of its ", p.stage == Stage::kHello ? "hello" : "proof"));
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return false;
    } else if (errno != EINTR) {
      return SocketError(errno, "the connecting side");
    }
  }
  return true;
}

// Sends a short message whole or not at all: the first bytes of a new connection always fit its send
// buffer, so a short write means something is wrong with the socket, and waiting would let a stranger
// hold this loop.
absl::Status SendSmall(int fd, const std::string& bytes) {
  const ssize_t w = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w == static_cast<ssize_t>(bytes.size())) return absl::OkStatus();
  return w < 0 ? SocketError(errno, "the connecting side")
               : absl::UnavailableError("the connecting side took only part of a handshake message");
}

absl::Status Doorman::OnHello(Pending& p, const std::vector<UniqueFd>* peers) {
  p.hello = DecodeHello(p.buf.data());
  const int claimed = p.hello.sender;
  if (absl::Status st = CheckHello(p.hello, rv_, -1, options_.rank); !st.ok()) return st;
  if (claimed <= options_.rank || claimed >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("claims rank ", claimed,
                                                   ", which is not a higher rank of world size ", options_.world_size,
                                                   " (lower ranks are the ones connected to)"));
  }
  if (Connected(peers, claimed)) {
    return absl::AlreadyExistsError(absl::StrCat("claims rank ", claimed, ", which is already connected"));
  }
  if (absl::Status st = RandomBytes(p.nonce.data(), p.nonce.size()); !st.ok()) return st;
  Hello mine{kHelloMagic, kProtocolVersion, options_.rank, claimed, options_.world_size, rv_.prefix_hash, p.nonce};
  const std::string challenge =
      EncodeHello(mine) + DigestBytes(HandshakeMac(options_, 'A', p.hello.nonce, p.nonce, options_.rank, claimed));
  if (absl::Status st = SendSmall(p.fd.get(), challenge); !st.ok()) return st;
  p.stage = Stage::kProof;
  p.buf.clear();
  return absl::OkStatus();
}

absl::Status Doorman::OnProof(Pending& p, std::vector<UniqueFd>* peers) {
  const int claimed = p.hello.sender;
  const Sha256Digest expected = HandshakeMac(options_, 'C', p.hello.nonce, p.nonce, claimed, options_.rank);
  if (!ConstantTimeEqual(expected, DigestAt(p.buf.data()))) {
    return absl::PermissionDeniedError(absl::StrCat("claimed rank ", claimed,
                                                    " but did not prove the job secret (a stranger, or a worker given "
                                                    "another job's secret)"));
  }
  if (Connected(peers, claimed)) {  // another connection proved it first
    return absl::AlreadyExistsError(absl::StrCat("claims rank ", claimed, ", which is already connected"));
  }
  std::string verdict(kVerdictBytes, '\0');
  PutU64(kVerdictMagic, &verdict[0], 4);
  if (absl::Status st = SendSmall(p.fd.get(), verdict); !st.ok()) return st;
  if (absl::Status st = SetNoDelay(p.fd.get()); !st.ok()) return st;
  (*peers)[claimed] = std::move(p.fd);
  return absl::OkStatus();
}

// True when `p` is finished with: filed under its rank, or failed (the error says why).
absl::StatusOr<bool> Doorman::Advance(Pending& p, std::vector<UniqueFd>* peers) {
  for (;;) {
    const size_t need = p.stage == Stage::kHello ? kHelloBytes : kSha256Bytes;
    absl::StatusOr<bool> complete = ReadSome(p, need);
    if (!complete.ok() || !*complete) return complete;
    if (p.stage == Stage::kHello) {
      if (absl::Status st = OnHello(p, peers); !st.ok()) return st;
      continue;  // the proof may be there already
    }
    if (absl::Status st = OnProof(p, peers); !st.ok()) return st;
    return true;
  }
}

std::string MissingRanks(const std::vector<UniqueFd>& peers, int rank) {
  std::vector<int> missing;
  for (int r = rank + 1; r < static_cast<int>(peers.size()); ++r) {
    if (!peers[r].valid()) missing.push_back(r);
  }
  return absl::StrJoin(missing, ", ");
}

// With `peers` null: serves until Stop(). Otherwise until every higher rank is filed or `deadline`.
absl::Status Doorman::Loop(std::vector<UniqueFd>* peers, absl::Time deadline) {
  std::vector<pollfd> fds;
  for (;;) {
    if (peers != nullptr && MissingRanks(*peers, options_.rank).empty()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) return absl::DeadlineExceededError("deadline");
    absl::Time wake_at = deadline;
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (now < it->deadline) {
        wake_at = std::min(wake_at, it->deadline);
        ++it;
        continue;
      }
      Drop(*it, absl::DeadlineExceededError(absl::StrCat("sent ", it->buf.size(), " bytes of its ",
                                                         it->stage == Stage::kHello ? "hello" : "proof",
                                                         " and then nothing within the handshake timeout (",
                                                         absl::FormatDuration(options_.handshake_timeout), ")")));
      it = pending_.erase(it);
    }
    fds.assign({pollfd{listener_.get(), POLLIN, 0}, pollfd{wake_.get(), POLLIN, 0}});
    for (const Pending& p : pending_) fds.push_back(pollfd{p.fd.get(), POLLIN, 0});
    const int n = ::poll(fds.data(), fds.size(), PollTimeoutMs(wake_at));
    if (n < 0 && errno != EINTR) {
      return absl::UnavailableError(absl::StrCat("poll on the listener: ", ErrnoText(errno)));
    }
    if (n <= 0) continue;
    if (fds[1].revents != 0) return absl::CancelledError("stopped");
    // Back to front, so that erasing keeps the indices of the ones still to visit.
    for (size_t i = pending_.size(); i-- > 0;) {
      if (fds[i + 2].revents == 0) continue;
      absl::StatusOr<bool> done = Advance(pending_[i], peers);
      if (done.ok() && !*done) continue;
      if (!done.ok()) Drop(pending_[i], done.status());
      pending_.erase(pending_.begin() + i);
    }
    if (fds[0].revents != 0) AcceptNew();
  }
}

absl::Status Doorman::AcceptHigherRanks(std::vector<UniqueFd>& peers, absl::Time deadline) {
  absl::Status st = Loop(&peers, deadline);
  if (absl::IsDeadlineExceeded(st)) {
    std::string dropped;
    if (drops_ > 0) {
      dropped = absl::StrCat("; ", drops_, " connection(s) were dropped meanwhile, the last: ", last_drop_);
    }
    return absl::DeadlineExceededError(absl::StrCat(rv_.Where(), "ranks ", MissingRanks(peers, options_.rank),
                                                    " did not connect within ",
                                                    absl::FormatDuration(options_.connect_timeout),
                                                    "; were they started, with the same "
                                                    "key_prefix, world size and job secret?",
                                                    dropped));
  }
  if (!st.ok()) return absl::Status(st.code(), rv_.Where() + std::string(st.message()));
  return st;
}

struct Mesh {
  std::vector<UniqueFd> peers;
  std::unique_ptr<Doorman> doorman;  // null for a world of one
};

// Rank r connects to every lower rank, then accepts every higher one. No cycle of waits: a rank waits
// only on lower ranks' replies, and rank 0 waits on nobody before it starts accepting. Strangers that
// connect meanwhile wait in the listen backlog and meet the doorman after.
absl::StatusOr<Mesh> BuildMesh(const Rendezvous& rv, KeyValueStore& kv) {
  const CpuTransportOptions& o = rv.options;
  Mesh mesh;
  mesh.peers.resize(o.world_size);
  if (o.world_size == 1) return mesh;
  absl::StatusOr<Listener> listener = Listen(o.listen_host);
  if (!listener.ok())
    return absl::Status(listener.status().code(), rv.Where() + std::string(listener.status().message()));
  const std::string key = AddressKey(o.key_prefix, o.rank);
  absl::Status st = kv.Set(key, listener->address);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(rv.Where(), "publishing '", key, "': ", st.message(),
                                                "; is another job using the same key_prefix?"));
  }
  mesh.doorman = std::make_unique<Doorman>(o, rv.prefix_hash, std::move(listener->fd));
  if (!mesh.doorman->ok()) {
    return absl::UnavailableError(
        absl::StrCat(rv.Where(), "eventfd: ", ErrnoText(errno), "; is the process out of file descriptors?"));
  }
  for (int peer = 0; peer < o.rank; ++peer) {
    absl::StatusOr<UniqueFd> fd = ConnectToLower(rv, peer, kv);
    if (!fd.ok()) return fd.status();
    mesh.peers[peer] = std::move(*fd);
  }
  st = mesh.doorman->AcceptHigherRanks(mesh.peers, rv.deadline);
  if (!st.ok()) return st;
  return mesh;
}

// ---- The transport ----

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt64:
      return "int64";
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
    case DType::kFloat32:
      return AddInto<float>(acc, x, count);
    case DType::kFloat64:
      return AddInto<double>(acc, x, count);
    case DType::kInt64:
      return AddInto<uint64_t>(acc, x, count);
    case DType::kBFloat16:
      return;  // Rejected before any data moves.
  }
}

class CpuTransport final : public Transport {
 public:
  CpuTransport(const CpuTransportOptions& options, Mesh mesh)
      : options_(options),
        peers_(std::move(mesh.peers)),
        broken_(options.world_size),
        doorman_(std::move(mesh.doorman)) {
    // The listener stays open, its doorman dropping whoever comes, so that a stranger on the
    // published port meets a warning in this rank's log instead of a port the kernel may reuse.
    if (doorman_ != nullptr) doorman_thread_ = std::thread([this] { doorman_->Serve(); });
  }
  ~CpuTransport() override {
    if (doorman_thread_.joinable()) {
      doorman_->Stop();
      doorman_thread_.join();
    }
  }

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
  const std::unique_ptr<Doorman> doorman_;
  std::thread doorman_thread_;
};

absl::Status Cancelled() { return absl::CancelledError("transport aborted"); }

absl::Status CpuTransport::CheckCall(int peer, int64_t bytes) const {
  if (peer < 0 || peer >= options_.world_size || peer == options_.rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer ", peer, " is not another rank of world size ", options_.world_size));
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
  broken_[peer] = absl::FailedPreconditionError(
      absl::StrCat("the connection to rank ", peer, " is unusable after an earlier error: ", st.message()));
  return st;
}

absl::Status CpuTransport::WithContext(absl::Status st, const std::string& what) const {
  if (st.ok() || absl::IsCancelled(st)) return st;
  return absl::Status(st.code(), absl::StrCat("cpu transport rank ", options_.rank, ": ", what, ": ", st.message()));
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
    st = absl::InternalError(absl::StrCat("rank ", peer, " sent ", sent, " bytes but this rank expected ", bytes,
                                          " bytes; the two ranks' schedules disagree"));
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
    return absl::UnimplementedError(
        absl::StrCat("cpu transport: AllReduceSum of bfloat16 is not supported; reduce in float32"));
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

absl::StatusOr<std::unique_ptr<Transport>> ConnectCpuTransport(const CpuTransportOptions& options, KeyValueStore& kv) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu transport: rank ", options.rank, " is not in [0, world size ", options.world_size, ")"));
  }
  if (options.world_size > 1 && options.secret.empty()) {
    return absl::InvalidArgumentError(
        "cpu transport: no job secret; set CpuTransportOptions::secret to the job secret the launcher "
        "gives each worker (without one, anyone could join the communicator)");
  }
  const absl::Time start = absl::Now();
  const Rendezvous rv{options, Fnv1a64(options.key_prefix), start + options.connect_timeout};
  absl::StatusOr<Mesh> mesh = BuildMesh(rv, kv);
  if (!mesh.ok()) return mesh.status();
  LOG(INFO) << "cpu transport rank " << options.rank << " of " << options.world_size << " ('" << options.key_prefix
            << "') connected in " << absl::FormatDuration(absl::Now() - start);
  return std::unique_ptr<Transport>(new CpuTransport(options, std::move(*mesh)));
}

}  // namespace stagehand
