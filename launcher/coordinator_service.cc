// gRPC adapter for CoordinatorState (see coordinator_service.h).
#include "launcher/coordinator_service.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/host.h"

namespace stagehand {
namespace {

constexpr char kBearer[] = "Bearer ";

absl::Time Deadline(const grpc::ServerContext& context) {
  auto d = context.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// The earlier of the call's own deadline and the request's timeout.
absl::Time Deadline(const grpc::ServerContext& context, int64_t timeout_ms) {
  absl::Time d = Deadline(context);
  if (timeout_ms > 0) d = std::min(d, absl::Now() + absl::Milliseconds(timeout_ms));
  return d;
}

bool IsLoopback(absl::string_view host) {
  return host == "127.0.0.1" || host == "localhost" || host == "[::1]" || absl::StartsWith(host, "127.");
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status CoordinatorService::Authenticate(const grpc::ServerContext& context) const {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("no job secret presented");
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) return absl::UnauthenticatedError("malformed authorization");
  value.remove_prefix(sizeof(kBearer) - 1);
  return state_->CheckSecret(value);
}

grpc::Status CoordinatorService::GetServerInfo(grpc::ServerContext*, const GetServerInfoRequest*,
                                               GetServerInfoResponse* response) {
  response->set_server("stagehand");
  response->set_protocol_version(kProtocolVersion);
  response->set_job_id(state_->job_id());
  response->set_host(HostName());
  response->set_pid(getpid());
  return grpc::Status::OK;
}

#define STAGEHAND_AUTHENTICATE(context)                                \
  if (absl::Status auth = Authenticate(*context); !auth.ok()) return ToGrpcStatus(auth)

grpc::Status CoordinatorService::GetJob(grpc::ServerContext* context, const GetJobRequest*, GetJobResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  response->set_job_id(state_->job_id());
  *response->mutable_job() = state_->job();
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Register(grpc::ServerContext* context, const RegisterRequest* request,
                                          RegisterResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  absl::StatusOr<Assignment> assignment = state_->Register(*request, Deadline(*context));
  if (!assignment.ok()) return ToGrpcStatus(assignment.status());
  *response->mutable_assignment() = *std::move(assignment);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::KeyValueSet(grpc::ServerContext* context, const KeyValueSetRequest* request,
                                             KeyValueSetResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return ToGrpcStatus(state_->KeyValueSet(request->key(), request->value()));
}

grpc::Status CoordinatorService::KeyValueGet(grpc::ServerContext* context, const KeyValueGetRequest* request,
                                             KeyValueGetResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  absl::StatusOr<std::string> value = state_->KeyValueGet(request->key(), Deadline(*context, request->timeout_ms()));
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::Barrier(grpc::ServerContext* context, const BarrierRequest* request,
                                         BarrierResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return ToGrpcStatus(
      state_->Barrier(request->barrier_id(), request->rank(), Deadline(*context, request->timeout_ms())));
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* context, const HeartbeatRequest* request,
                                           HeartbeatResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  absl::StatusOr<HeartbeatResponse> r = state_->Heartbeat(*request);
  if (!r.ok()) return ToGrpcStatus(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ReportMilestone(grpc::ServerContext* context, const ReportMilestoneRequest* request,
                                                 ReportMilestoneResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return ToGrpcStatus(state_->ReportMilestone(*request));
}

grpc::Status CoordinatorService::ReportStep(grpc::ServerContext* context, const ReportStepRequest* request,
                                            ReportStepResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return ToGrpcStatus(state_->ReportStep(*request));
}

grpc::Status CoordinatorService::Finish(grpc::ServerContext* context, const FinishRequest* request, FinishResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return ToGrpcStatus(state_->Finish(*request));
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const std::string& address,
                                                                            CoordinatorState* state) {
  std::pair<std::string, std::string> hp = absl::StrSplit(address, absl::MaxSplits(':', 1));
  int port = 0;
  if (hp.second.empty() || !absl::SimpleAtoi(hp.second, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--coordinator_address=", address, ": expected HOST:PORT (port 0 picks one)"));
  }
  if (!IsLoopback(hp.first)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator_address=", address,
        ": only loopback addresses are served until TLS and tokens land; use 127.0.0.1:PORT"));
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer(std::make_unique<CoordinatorService>(state)));
  grpc::ServerBuilder builder;
  int bound = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  builder.RegisterService(server->service_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (is the port in use?)"));
  }
  server->address_ = absl::StrCat(hp.first, ":", bound);
  return server;
}

void CoordinatorServer::Stop() {
  if (server_ == nullptr) return;
  // Blocked calls were woken by CoordinatorState::Stop; do not wait for stragglers.
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
}

CoordinatorServer::~CoordinatorServer() { Stop(); }

}  // namespace stagehand
