// The c10d store a launched program's `init_process_group(init_method="env://")` connects to when
// TORCHELASTIC_USE_AGENT_STORE=True (as under torchrun's elastic agent): a server of torch's TCPStore
// wire protocol without LibTorch. One thread runs a poll loop over non-blocking sockets; the protocol
// and the keys live in C10dStoreState (c10d_store_state.h).
#ifndef STAGEHAND_LAUNCHER_STORE_C10D_STORE_H_
#define STAGEHAND_LAUNCHER_STORE_C10D_STORE_H_

#include <sys/socket.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/fd.h"
#include "launcher/store/c10d_store_state.h"

namespace stagehand {

struct C10dStoreOptions {
  C10dStoreLimits limits;
  // Connections at once; one more is closed at accept, with a log line.
  size_t max_clients = 1024;
  // Numeric IPv4 or IPv6 addresses (the job's hosts) allowed to connect; empty: any that reaches the
  // bind address. A connection from elsewhere is closed at accept, with a log line.
  std::vector<std::string> allowed_peers;
};

class C10dStoreServer {
 public:
  explicit C10dStoreServer(C10dStoreOptions options = {});
  ~C10dStoreServer();  // Stops.
  C10dStoreServer(const C10dStoreServer&) = delete;
  C10dStoreServer& operator=(const C10dStoreServer&) = delete;

  // Listens on `bind_address` (numeric: "127.0.0.1", "::1", "0.0.0.0", "::"; the caller chooses
  // loopback or a host's address) and `port` (0: a free one), starts the loop and returns the port.
  // INVALID_ARGUMENT for an address that is not numeric, a port out of range or an allowed peer that
  // is not an address; UNAVAILABLE when the port is taken; FAILED_PRECONDITION when started already.
  absl::StatusOr<int> Start(const std::string& bind_address, int port);
  // Ends the loop and closes every socket (clients' waits end with the connection); returns once the
  // loop thread is gone. Idempotent.
  void Stop();

  int port() const { return port_; }

 private:
  struct Connection;
  void Run();
  // False when accepting should pause (out of descriptors or memory).
  bool AcceptAll(C10dStoreState& state, std::vector<Connection>& connections, uint64_t& next_id);
  // False when the connection is to be closed.
  bool ReadFrom(C10dStoreState& state, Connection& connection, short revents);
  bool WriteTo(C10dStoreState& state, Connection& connection);
  bool PeerAllowed(const sockaddr_storage& peer) const;

  const C10dStoreOptions options_;
  std::vector<std::string> allowed_;  // 16-byte IPv6 (IPv4 mapped) forms of allowed_peers
  UniqueFd listen_fd_;
  UniqueFd wake_fd_;  // eventfd: Stop() wakes the loop
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  bool started_ = false;
  int port_ = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_STORE_C10D_STORE_H_
