// The worker's side of the Coordinator service: one channel, the job secret attached to every call,
// grpc::Status turned into absl::Status. Also the KeyValueStore that transports rendezvous through.
#ifndef STAGEHAND_WORKER_COORDINATOR_CLIENT_H_
#define STAGEHAND_WORKER_COORDINATOR_CLIENT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "protos/coordinator.grpc.pb.h"
#include "worker/transport.h"

namespace stagehand {

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc);

class CoordinatorClient final : public KeyValueStore {
 public:
  CoordinatorClient(const std::string& address, std::string secret);

  absl::StatusOr<GetJobResponse> GetJob(absl::Duration timeout);
  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Duration timeout);
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Duration timeout);
  absl::Status ReportMilestone(int rank, Milestone milestone, absl::Time when);
  absl::Status ReportStep(const ReportStepRequest& request);
  absl::Status Finish(const FinishRequest& request);
  absl::Status Barrier(const std::string& id, int rank, absl::Duration timeout);

  // KeyValueStore
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const;

  const std::string secret_;
  std::unique_ptr<Coordinator::Stub> stub_;
};

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_COORDINATOR_CLIENT_H_
