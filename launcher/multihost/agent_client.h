// An agent's side of the Coordinator service (several hosts): registration, heartbeats, worker exits
// and the long poll for the job's stop, behind an interface so that the agent's logic is tested over
// a fake (fake_agent_client.h). Every call returns the codes protos/coordinator.proto documents, with
// messages that say what to check (common/tls.h's ExplainRpcError).
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_AGENT_CLIENT_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_AGENT_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "protos/coordinator.pb.h"

namespace stagehand {

class AgentClient {
 public:
  using StopCallback = std::function<void(absl::StatusOr<WaitForStopResponse>)>;
  virtual ~AgentClient() = default;

  virtual absl::StatusOr<RegisterAgentResponse> RegisterAgent(const RegisterAgentRequest& request,
                                                              absl::Duration timeout) = 0;
  // The job secret every call after RegisterAgent carries (RegisterAgent returns it).
  virtual void SetSecret(std::string secret) = 0;
  virtual absl::StatusOr<AgentHeartbeatResponse> Heartbeat(const AgentHeartbeatRequest& request,
                                                           absl::Duration timeout) = 0;
  virtual absl::Status ReportWorkerExit(const ReportWorkerExitRequest& request, absl::Duration timeout) = 0;
  // Starts the long poll; `done` runs once, on another thread, when it ends. One at a time: one still in
  // flight is ended first (its `done` sees CANCELLED).
  virtual void StartWaitForStop(const WaitForStopRequest& request, StopCallback done) = 0;
  // Ends the long poll in flight (its `done` sees CANCELLED) and waits until `done` has run.
  virtual void CancelWaitForStop() = 0;
};

// The gRPC client of the coordinator at `address` over `tls` (plaintext when every path is empty).
// `secret`: the job token (--job_token_file), or "" until RegisterAgent returns it.
// INVALID_ARGUMENT for a bad TLS file.
absl::StatusOr<std::unique_ptr<AgentClient>> ConnectAgentClient(const std::string& address, const ClientTlsFiles& tls,
                                                                std::string secret);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_AGENT_CLIENT_H_
