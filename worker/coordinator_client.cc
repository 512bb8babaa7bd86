// gRPC client of the Coordinator service (see coordinator_client.h).
#include "worker/coordinator_client.h"

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "protos/coordinator.grpc.pb.h"

namespace stagehand {
namespace {

constexpr absl::Duration kShortCall = absl::Seconds(30);
// Waits are answered by the server at their own timeout; the call's deadline comes this much later.
constexpr absl::Duration kServerAnswersFirst = absl::Seconds(5);

class GrpcCoordinatorClient final : public CoordinatorClient {
 public:
  GrpcCoordinatorClient(const std::string& address, std::string secret,
                        std::shared_ptr<grpc::ChannelCredentials> credentials)
      : secret_(std::move(secret)), stub_(Coordinator::NewStub(grpc::CreateChannel(address, credentials))) {}

  absl::StatusOr<GetJobResponse> GetJob(absl::Duration timeout) override {
    GetJobResponse response;
    if (absl::Status s = Call(&Coordinator::Stub::GetJob, "GetJob", GetJobRequest(), &response, timeout); !s.ok()) {
      return s;
    }
    return response;
  }

  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Duration timeout) override {
    RegisterResponse response;
    if (absl::Status s = Call(&Coordinator::Stub::Register, "Register", request, &response, timeout); !s.ok()) {
      return s;
    }
    absl::MutexLock lock(&mu_);
    identity_ = Identity{request.worker_index(), request.incarnation()};
    return response.assignment();
  }

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Duration timeout) override {
    HeartbeatResponse response;
    if (absl::Status s = Call(&Coordinator::Stub::Heartbeat, "Heartbeat", request, &response, timeout); !s.ok()) {
      return s;
    }
    return response;
  }

  absl::StatusOr<WaitForStopResponse> WaitForStop(const WaitForStopRequest& request) override;
  void CancelWaitForStop() override;

  absl::Status ReportMilestone(const ReportMilestoneRequest& request) override {
    ReportMilestoneResponse response;
    return Call(&Coordinator::Stub::ReportMilestone, "ReportMilestone", request, &response, kShortCall);
  }

  absl::StatusOr<ReportStepResponse> ReportStep(const ReportStepRequest& request) override {
    ReportStepResponse response;
    if (absl::Status s = Call(&Coordinator::Stub::ReportStep, "ReportStep", request, &response, kShortCall); !s.ok()) {
      return s;
    }
    return response;
  }

  absl::Status Finish(const FinishRequest& request) override {
    FinishResponse response;
    return Call(&Coordinator::Stub::Finish, "Finish", request, &response, absl::Seconds(5));
  }

  absl::Status Barrier(const BarrierRequest& request) override {
    BarrierResponse response;
    return Call(&Coordinator::Stub::Barrier, "Barrier", request, &response,
                absl::Milliseconds(request.timeout_ms()) + kServerAnswersFirst);
  }

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  struct Identity {
    int rank;
    int64_t incarnation;
  };

  void Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
    context.AddMetadata("authorization", "Bearer " + secret_);
    // The coordinator is up before any worker starts; waiting for the channel rides out its first
    // connection instead of failing at once.
    context.set_wait_for_ready(true);
    if (timeout != absl::InfiniteDuration()) context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (Coordinator::Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
                    absl::string_view name, const Request& request, Response* response, absl::Duration timeout) {
    grpc::ClientContext context;
    Prepare(context, timeout);
    return FromGrpcStatus((stub_.get()->*rpc)(&context, request, response), name);
  }

  const std::string secret_;
  const std::unique_ptr<Coordinator::Stub> stub_;
  absl::Mutex mu_;
  std::optional<Identity> identity_ ABSL_GUARDED_BY(mu_);
  grpc::ClientContext* wait_context_ ABSL_GUARDED_BY(mu_) = nullptr;  // the WaitForStop in flight
  bool wait_cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<WaitForStopResponse> GrpcCoordinatorClient::WaitForStop(const WaitForStopRequest& request) {
  grpc::ClientContext context;
  Prepare(context, absl::InfiniteDuration());  // a long poll: it ends when the job does
  {
    absl::MutexLock lock(&mu_);
    if (wait_cancelled_) return absl::CancelledError("WaitForStop: cancelled by this worker");
    wait_context_ = &context;
  }
  WaitForStopResponse response;
  grpc::Status s = stub_->WaitForStop(&context, request, &response);
  {
    absl::MutexLock lock(&mu_);
    wait_context_ = nullptr;
  }
  if (absl::Status status = FromGrpcStatus(s, "WaitForStop"); !status.ok()) return status;
  return response;
}

void GrpcCoordinatorClient::CancelWaitForStop() {
  absl::MutexLock lock(&mu_);
  wait_cancelled_ = true;
  if (wait_context_ != nullptr) wait_context_->TryCancel();
}

absl::Status GrpcCoordinatorClient::Set(const std::string& key, const std::string& value) {
  KeyValueSetRequest request;
  {
    absl::MutexLock lock(&mu_);
    if (!identity_) {
      return absl::FailedPreconditionError(
          absl::StrCat("KeyValueSet \"", key, "\": this worker has not registered; Register first"));
    }
    request.set_rank(identity_->rank);
    request.set_incarnation(identity_->incarnation);
  }
  request.set_key(key);
  request.set_value(value);
  KeyValueSetResponse response;
  return Call(&Coordinator::Stub::KeyValueSet, "KeyValueSet", request, &response, kShortCall);
}

absl::StatusOr<std::string> GrpcCoordinatorClient::Get(const std::string& key, absl::Duration timeout) {
  KeyValueGetRequest request;
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  KeyValueGetResponse response;
  if (absl::Status s =
          Call(&Coordinator::Stub::KeyValueGet, "KeyValueGet", request, &response, timeout + kServerAnswersFirst);
      !s.ok()) {
    return s;
  }
  return response.value();
}

}  // namespace

std::unique_ptr<CoordinatorClient> ConnectCoordinator(const std::string& address, std::string secret) {
  return std::make_unique<GrpcCoordinatorClient>(address, std::move(secret), grpc::InsecureChannelCredentials());
}

absl::StatusOr<std::unique_ptr<CoordinatorClient>> ConnectCoordinator(const std::string& address, std::string secret,
                                                                      const ClientTlsFiles& tls) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ClientTlsCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  return std::unique_ptr<CoordinatorClient>(
      std::make_unique<GrpcCoordinatorClient>(address, std::move(secret), *std::move(credentials)));
}

}  // namespace stagehand
