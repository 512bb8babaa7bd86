// gRPC client of the Coordinator service for agents (see agent_client.h).
#include "launcher/multihost/agent_client.h"

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "protos/coordinator.grpc.pb.h"

namespace stagehand {
namespace {

class GrpcAgentClient final : public AgentClient {
 public:
  GrpcAgentClient(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials, ClientTlsInfo info,
                  std::string secret)
      : info_(std::move(info)),
        stub_(Coordinator::NewStub(grpc::CreateChannel(address, credentials))),
        secret_(std::move(secret)) {}

  ~GrpcAgentClient() override { CancelWaitForStop(); }

  absl::StatusOr<RegisterAgentResponse> RegisterAgent(const RegisterAgentRequest& request,
                                                      absl::Duration timeout) override {
    RegisterAgentResponse response;
    grpc::ClientContext context;
    Prepare(context, timeout, /*wait_for_ready=*/true);  // node 0 may not serve yet
    if (absl::Status s = Explain(stub_->RegisterAgent(&context, request, &response), "RegisterAgent"); !s.ok()) {
      return s;
    }
    return response;
  }

  void SetSecret(std::string secret) override {
    absl::MutexLock lock(&mu_);
    secret_ = std::move(secret);
  }

  absl::StatusOr<AgentHeartbeatResponse> Heartbeat(const AgentHeartbeatRequest& request,
                                                   absl::Duration timeout) override {
    AgentHeartbeatResponse response;
    grpc::ClientContext context;
    // Not waiting for a channel that is down: a heartbeat that cannot go out counts as missed.
    Prepare(context, timeout, /*wait_for_ready=*/false);
    if (absl::Status s = Explain(stub_->AgentHeartbeat(&context, request, &response), "AgentHeartbeat"); !s.ok()) {
      return s;
    }
    return response;
  }

  absl::Status ReportWorkerExit(const ReportWorkerExitRequest& request, absl::Duration timeout) override {
    ReportWorkerExitResponse response;
    grpc::ClientContext context;
    Prepare(context, timeout, /*wait_for_ready=*/false);
    return Explain(stub_->ReportWorkerExit(&context, request, &response), "ReportWorkerExit");
  }

  void StartWaitForStop(const WaitForStopRequest& request, StopCallback done) override {
    // The last long poll (answered, or still in flight: ended now) is freed only once its callback
    // has returned.
    CancelWaitForStop();
    absl::MutexLock lock(&mu_);
    wait_ = std::make_unique<Wait>();
    Wait* w = wait_.get();
    w->request = request;
    Prepare(w->context, absl::InfiniteDuration(), /*wait_for_ready=*/false, /*locked=*/true);
    stub_->async()->WaitForStop(&w->context, &w->request, &w->response,
                                [this, w, done = std::move(done)](grpc::Status status) {
                                  absl::Status s = Explain(status, "WaitForStop");
                                  if (s.ok()) {
                                    done(w->response);
                                  } else {
                                    done(s);
                                  }
                                  w->finished.Notify();
                                });
  }

  void CancelWaitForStop() override {
    Wait* w;
    {
      absl::MutexLock lock(&mu_);
      w = wait_.get();
    }
    if (w == nullptr) return;
    w->context.TryCancel();
    w->finished.WaitForNotification();
  }

 private:
  struct Wait {
    grpc::ClientContext context;
    WaitForStopRequest request;
    WaitForStopResponse response;
    absl::Notification finished;
  };

  void Prepare(grpc::ClientContext& context, absl::Duration timeout, bool wait_for_ready, bool locked = false) {
    std::string secret;
    if (locked) {
      secret = secret_;
    } else {
      absl::MutexLock lock(&mu_);
      secret = secret_;
    }
    if (!secret.empty()) context.AddMetadata("authorization", "Bearer " + secret);
    context.set_wait_for_ready(wait_for_ready);
    if (timeout != absl::InfiniteDuration()) context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  }

  absl::Status Explain(const grpc::Status& status, absl::string_view rpc) const {
    absl::Status s = ExplainRpcError(status, info_);
    if (s.ok()) return s;
    return absl::Status(s.code(), absl::StrCat(rpc, ": ", s.message()));
  }

  const ClientTlsInfo info_;
  const std::unique_ptr<Coordinator::Stub> stub_;
  absl::Mutex mu_;
  std::string secret_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<Wait> wait_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<AgentClient>> ConnectAgentClient(const std::string& address, const ClientTlsFiles& tls,
                                                                std::string secret) {
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials = ClientTlsCredentials(tls);
  if (!credentials.ok()) return credentials.status();
  ClientTlsInfo info;
  info.server = address;
  info.tls = !tls.ca.empty() || !tls.cert.empty();
  info.client_cert = !tls.cert.empty();
  return std::unique_ptr<AgentClient>(
      std::make_unique<GrpcAgentClient>(address, *std::move(credentials), std::move(info), std::move(secret)));
}

}  // namespace stagehand
