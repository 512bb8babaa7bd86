// The gRPC face of CoordinatorState: a thin adapter that checks the job secret, turns absl::Status
// into grpc::Status and request deadlines into absl::Time. All logic lives in coordinator.h.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_SERVICE_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "launcher/coordinator.h"
#include "protos/coordinator.grpc.pb.h"

namespace stagehand {

inline constexpr int kProtocolVersion = 1;

grpc::Status ToGrpcStatus(const absl::Status& status);

class CoordinatorService final : public Coordinator::Service {
 public:
  explicit CoordinatorService(CoordinatorState* state) : state_(state) {}

  grpc::Status GetServerInfo(grpc::ServerContext*, const GetServerInfoRequest*, GetServerInfoResponse*) override;
  grpc::Status GetJob(grpc::ServerContext*, const GetJobRequest*, GetJobResponse*) override;
  grpc::Status Register(grpc::ServerContext*, const RegisterRequest*, RegisterResponse*) override;
  grpc::Status KeyValueSet(grpc::ServerContext*, const KeyValueSetRequest*, KeyValueSetResponse*) override;
  grpc::Status KeyValueGet(grpc::ServerContext*, const KeyValueGetRequest*, KeyValueGetResponse*) override;
  grpc::Status Barrier(grpc::ServerContext*, const BarrierRequest*, BarrierResponse*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const HeartbeatRequest*, HeartbeatResponse*) override;
  grpc::Status ReportMilestone(grpc::ServerContext*, const ReportMilestoneRequest*, ReportMilestoneResponse*) override;
  grpc::Status ReportStep(grpc::ServerContext*, const ReportStepRequest*, ReportStepResponse*) override;
  grpc::Status Finish(grpc::ServerContext*, const FinishRequest*, FinishResponse*) override;

 private:
  absl::Status Authenticate(const grpc::ServerContext& context) const;

  CoordinatorState* const state_;
};

// A running server. Stop() (or the destructor) shuts it down without waiting for blocked calls,
// which the coordinator's Stop() has already woken.
class CoordinatorServer {
 public:
  // `address` is host:port; port 0 picks a free one. Binding anything but loopback is refused for now:
  // a non-loopback control port needs TLS and a token (design.md), which land with multi-host.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const std::string& address,
                                                                  CoordinatorState* state);
  ~CoordinatorServer();
  const std::string& address() const { return address_; }  // with the port actually bound
  void Stop();

 private:
  CoordinatorServer(std::unique_ptr<CoordinatorService> service) : service_(std::move(service)) {}

  std::unique_ptr<CoordinatorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_SERVICE_H_
