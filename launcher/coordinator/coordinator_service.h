// The gRPC face of CoordinatorState: a thin adapter that checks the job secret, turns absl::Status
// into grpc::Status and request deadlines into absl::Time. All logic lives in coordinator.h. It uses
// gRPC's callback API, so a call that waits (Register, KeyValueGet, Barrier, WaitForStop) holds no
// thread: its reactor finishes when CoordinatorState completes the wait.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_SERVICE_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/tls.h"
#include "grpcpp/grpcpp.h"
#include "launcher/coordinator/coordinator.h"
#include "protos/coordinator.grpc.pb.h"

namespace stagehand {

// 2: incarnations on every report, WaitForStop; 3: agents (RegisterAgent, AgentHeartbeat,
// ReportWorkerExit, WaitForStop.node_rank), for jobs of several hosts.
inline constexpr int kProtocolVersion = 3;

class CoordinatorService final : public Coordinator::CallbackService {
 public:
  explicit CoordinatorService(CoordinatorState* state) : state_(state) {}

  using Context = grpc::CallbackServerContext;
  using Reactor = grpc::ServerUnaryReactor;
  Reactor* GetServerInfo(Context*, const GetServerInfoRequest*, GetServerInfoResponse*) override;
  Reactor* GetJob(Context*, const GetJobRequest*, GetJobResponse*) override;
  Reactor* Register(Context*, const RegisterRequest*, RegisterResponse*) override;
  Reactor* KeyValueSet(Context*, const KeyValueSetRequest*, KeyValueSetResponse*) override;
  Reactor* KeyValueGet(Context*, const KeyValueGetRequest*, KeyValueGetResponse*) override;
  Reactor* Barrier(Context*, const BarrierRequest*, BarrierResponse*) override;
  Reactor* Heartbeat(Context*, const HeartbeatRequest*, HeartbeatResponse*) override;
  Reactor* WaitForStop(Context*, const WaitForStopRequest*, WaitForStopResponse*) override;
  Reactor* ReportMilestone(Context*, const ReportMilestoneRequest*, ReportMilestoneResponse*) override;
  Reactor* ReportStep(Context*, const ReportStepRequest*, ReportStepResponse*) override;
  Reactor* Finish(Context*, const FinishRequest*, FinishResponse*) override;
  Reactor* RegisterAgent(Context*, const RegisterAgentRequest*, RegisterAgentResponse*) override;
  Reactor* AgentHeartbeat(Context*, const AgentHeartbeatRequest*, AgentHeartbeatResponse*) override;
  Reactor* ReportWorkerExit(Context*, const ReportWorkerExitRequest*, ReportWorkerExitResponse*) override;

 private:
  absl::Status Authenticate(const grpc::ServerContextBase& context) const;
  // The call's reactor, already finished with UNAUTHENTICATED, or nullptr when the secret is right.
  Reactor* Refused(Context* context) const;

  CoordinatorState* const state_;
};

// The numeric address to listen on for `address` (HOST:PORT or [IPv6]:PORT): HOST is resolved and
// every address it has must be loopback (127.0.0.0/8 or ::1), so a name like "127.evil.test" that
// resolves elsewhere is refused. INVALID_ARGUMENT naming --coordinator_address and what to pass.
absl::StatusOr<std::string> LoopbackListenAddress(const std::string& address);
// The same, but any address when `tls` (a non-loopback coordinator serves only mutual TLS); the
// refusal of a non-loopback address without it says what to pass.
absl::StatusOr<std::string> ListenAddress(const std::string& address, bool tls);
// Whether HOST of HOST:PORT resolves only to loopback addresses (false when it does not resolve).
bool IsLoopbackAddress(const std::string& address);

// A coordinator server's settings beyond the address.
struct CoordinatorServerOptions {
  std::string address;  // host:port; port 0 picks one
  int max_threads = 0;
  // The job's certificate and key, and the CA that must have signed every client's certificate
  // (mutual TLS). Empty: plaintext, loopback only.
  ServerTlsFiles tls;
};

// A running server. Stop() (or the destructor) ends every pending wait of the state with
// UNAVAILABLE (CoordinatorState::Shutdown) and then shuts the server down.
class CoordinatorServer {
 public:
  // `address` is host:port; port 0 picks a free one. Plaintext, so binding anything but loopback is
  // refused: another address is served only over mutual TLS (the options form below, design.md).
  // `max_threads` > 0 caps gRPC's threads (ResourceQuota); tests use it to show waits need none.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const std::string& address, CoordinatorState* state,
                                                                  int max_threads = 0);
  // Loopback plaintext, or any address over mutual TLS (options.tls).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorServerOptions& options,
                                                                  CoordinatorState* state);
  ~CoordinatorServer();
  const std::string& address() const { return address_; }  // with the port actually bound
  void Stop();

 private:
  CoordinatorServer(CoordinatorState* state, std::unique_ptr<CoordinatorService> service)
      : state_(state), service_(std::move(service)) {}

  CoordinatorState* const state_;
  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_SERVICE_H_
