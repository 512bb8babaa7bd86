// The worker's side of the Coordinator service, behind an interface so that the agent and the job
// can be tested over a fake (fake_coordinator_client.h). The gRPC client keeps one channel, attaches
// the job secret to every call and converts statuses with common/grpc_status.h. It is also the
// KeyValueStore that transports rendezvous through.
#ifndef STAGEHAND_WORKER_COORDINATOR_CLIENT_H_
#define STAGEHAND_WORKER_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/tls.h"
#include "protos/coordinator.pb.h"
#include "transport/transport.h"

namespace stagehand {

// Every call returns the codes protos/coordinator.proto documents for its RPC, with the RPC's name
// leading the message. Thread-safe.
class CoordinatorClient : public KeyValueStore {
 public:
  virtual absl::StatusOr<GetJobResponse> GetJob(absl::Duration timeout) = 0;
  // On success the client keeps the request's worker_index and incarnation to stamp on Set, whose
  // KeyValueStore signature has no room for them.
  virtual absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Duration timeout) = 0;
  virtual absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Duration timeout) = 0;
  // Blocks until the job stops (OK, with the reason and its origin) or the call fails. One call at
  // a time; CancelWaitForStop() ends it (and any later one) with CANCELLED, for the worker's exit.
  virtual absl::StatusOr<WaitForStopResponse> WaitForStop(const WaitForStopRequest& request) = 0;
  virtual void CancelWaitForStop() = 0;
  virtual absl::Status ReportMilestone(const ReportMilestoneRequest& request) = 0;
  // The answer may ask for a checkpoint and the end of the run (ReportStepResponse).
  virtual absl::StatusOr<ReportStepResponse> ReportStep(const ReportStepRequest& request) = 0;
  virtual absl::Status Finish(const FinishRequest& request) = 0;
  // Waits up to request.timeout_ms for every rank to enter the barrier.
  virtual absl::Status Barrier(const BarrierRequest& request) = 0;

  // KeyValueStore. Set is FAILED_PRECONDITION until Register has succeeded.
  absl::Status Set(const std::string& key, const std::string& value) override = 0;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override = 0;
};

// The gRPC client of the coordinator at `address` (host:port). Connects lazily: calls wait for the
// channel to come up (within their own deadline).
std::unique_ptr<CoordinatorClient> ConnectCoordinator(const std::string& address, std::string secret);
// The same over TLS with `tls`'s files (mutual TLS with a client certificate: a coordinator of
// several hosts requires it); plaintext when every path is empty. INVALID_ARGUMENT for a bad file.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectCoordinator(const std::string& address, std::string secret,
                                                                      const ClientTlsFiles& tls);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_COORDINATOR_CLIENT_H_
