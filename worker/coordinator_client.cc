// gRPC client of the Coordinator service (see coordinator_client.h).
#include "worker/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"

namespace stagehand {
namespace {

constexpr absl::Duration kShortCall = absl::Seconds(30);

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, ": ", status.error_message()));
}

CoordinatorClient::CoordinatorClient(const std::string& address, std::string secret)
    : secret_(std::move(secret)),
      stub_(Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {}

void CoordinatorClient::Prepare(grpc::ClientContext& context, absl::Duration timeout) const {
  context.AddMetadata("authorization", "Bearer " + secret_);
  // The coordinator is up before any worker starts; waiting for the channel rides out its first
  // connection instead of failing at once.
  context.set_wait_for_ready(true);
  if (timeout != absl::InfiniteDuration()) context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

absl::StatusOr<GetJobResponse> CoordinatorClient::GetJob(absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  GetJobResponse response;
  absl::Status s = FromGrpcStatus(stub_->GetJob(&context, GetJobRequest(), &response), "GetJob");
  if (!s.ok()) return s;
  return response;
}

absl::StatusOr<Assignment> CoordinatorClient::Register(const RegisterRequest& request, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  RegisterResponse response;
  absl::Status s = FromGrpcStatus(stub_->Register(&context, request, &response), "Register");
  if (!s.ok()) return s;
  return response.assignment();
}

absl::StatusOr<HeartbeatResponse> CoordinatorClient::Heartbeat(const HeartbeatRequest& request,
                                                               absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout);
  HeartbeatResponse response;
  absl::Status s = FromGrpcStatus(stub_->Heartbeat(&context, request, &response), "Heartbeat");
  if (!s.ok()) return s;
  return response;
}

absl::Status CoordinatorClient::ReportMilestone(int rank, Milestone milestone, absl::Time when) {
  grpc::ClientContext context;
  Prepare(context, kShortCall);
  ReportMilestoneRequest request;
  request.set_rank(rank);
  request.set_milestone(milestone);
  request.set_unix_micros(absl::ToUnixMicros(when));
  ReportMilestoneResponse response;
  return FromGrpcStatus(stub_->ReportMilestone(&context, request, &response), "ReportMilestone");
}

absl::Status CoordinatorClient::ReportStep(const ReportStepRequest& request) {
  grpc::ClientContext context;
  Prepare(context, kShortCall);
  ReportStepResponse response;
  return FromGrpcStatus(stub_->ReportStep(&context, request, &response), "ReportStep");
}

absl::Status CoordinatorClient::Finish(const FinishRequest& request) {
  grpc::ClientContext context;
  Prepare(context, absl::Seconds(5));
  FinishResponse response;
  return FromGrpcStatus(stub_->Finish(&context, request, &response), "Finish");
}

absl::Status CoordinatorClient::Barrier(const std::string& id, int rank, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout + absl::Seconds(5));  // the server answers DEADLINE_EXCEEDED itself first
  BarrierRequest request;
  request.set_barrier_id(id);
  request.set_rank(rank);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  BarrierResponse response;
  return FromGrpcStatus(stub_->Barrier(&context, request, &response), "Barrier");
}

absl::Status CoordinatorClient::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  Prepare(context, kShortCall);
  KeyValueSetRequest request;
  request.set_key(key);
  request.set_value(value);
  KeyValueSetResponse response;
  return FromGrpcStatus(stub_->KeyValueSet(&context, request, &response), "KeyValueSet");
}

absl::StatusOr<std::string> CoordinatorClient::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext context;
  Prepare(context, timeout + absl::Seconds(5));  // the server answers DEADLINE_EXCEEDED itself first
  KeyValueGetRequest request;
  request.set_key(key);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  KeyValueGetResponse response;
  absl::Status s = FromGrpcStatus(stub_->KeyValueGet(&context, request, &response), "KeyValueGet");
  if (!s.ok()) return s;
  return response.value();
}

}  // namespace stagehand
