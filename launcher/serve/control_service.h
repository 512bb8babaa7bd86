// The gRPC face of JobService (protos/control.proto): a thin adapter that reads the bearer token,
// authenticates it, calls the service and converts the status. All logic lives behind JobService.
#ifndef STAGEHAND_LAUNCHER_SERVE_CONTROL_SERVICE_H_
#define STAGEHAND_LAUNCHER_SERVE_CONTROL_SERVICE_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "launcher/serve/job_service.h"
#include "protos/control.grpc.pb.h"

namespace stagehand {

struct ControlServerOptions {
  std::string listen;                            // HOST:PORT; port 0 picks one
  std::string tls_cert, tls_key, tls_client_ca;  // PEM paths; a non-loopback listen needs cert and key
  // gRPC threads at most. A WatchJob or a followed Logs call holds one thread for as long as it
  // lasts (see control_service.cc), so this bounds the concurrent streams; a call beyond it gets
  // RESOURCE_EXHAUSTED.
  int max_threads = 256;
};

// The sync-API service. Each method's errors are those of the RPC (control.proto), plus
// UNAUTHENTICATED for a missing or malformed "authorization: Bearer <token>" entry, and UNAVAILABLE
// for a stream cut by the server's shutdown (its message says where to resume).
class ControlService final : public control::Control::Service {
 public:
  ControlService(JobService* service, bool tls, bool mutual_tls)
      : service_(service), tls_(tls), mutual_tls_(mutual_tls) {}

  // Streams end within about a second after this (JobService's waits are 1 s).
  void BeginShutdown() { stopping_ = true; }

  using Context = grpc::ServerContext;
  grpc::Status GetServerInfo(Context*, const control::GetServerInfoRequest*, control::GetServerInfoResponse*) override;
  grpc::Status SubmitJob(Context*, const control::SubmitJobRequest*, control::JobInfo*) override;
  grpc::Status GetJob(Context*, const control::GetJobRequest*, control::JobInfo*) override;
  grpc::Status ListJobs(Context*, const control::ListJobsRequest*, control::ListJobsResponse*) override;
  grpc::Status DeleteJob(Context*, const control::DeleteJobRequest*, control::DeleteJobResponse*) override;
  grpc::Status WatchJob(Context*, const control::WatchJobRequest*, grpc::ServerWriter<control::JobEvent>*) override;
  grpc::Status CancelJob(Context*, const control::CancelJobRequest*, control::JobInfo*) override;
  grpc::Status Logs(Context*, const control::LogsRequest*, grpc::ServerWriter<control::LogChunk>*) override;
  grpc::Status FetchFile(Context*, const control::FetchFileRequest*, grpc::ServerWriter<control::FileChunk>*) override;
  grpc::Status MintToken(Context*, const control::MintTokenRequest*, control::MintTokenResponse*) override;
  grpc::Status RevokeToken(Context*, const control::RevokeTokenRequest*, control::RevokeTokenResponse*) override;
  grpc::Status ListTokens(Context*, const control::ListTokensRequest*, control::ListTokensResponse*) override;

 private:
  absl::StatusOr<Caller> Authenticate(const grpc::ServerContext& context) const;

  JobService* const service_;
  const bool tls_, mutual_tls_;
  std::atomic<bool> stopping_{false};
};

// Where a --listen address binds, and whether every address its host resolves to is loopback.
struct ListenAddress {
  std::string bind;  // numeric HOST:PORT ([v6]:PORT)
  bool loopback = false;
};
// INVALID_ARGUMENT naming --listen for a malformed or unresolvable address.
absl::StatusOr<ListenAddress> ResolveListenAddress(const std::string& listen);

// A running control server. Stop() (or the destructor) ends every stream within about a second,
// each with UNAVAILABLE and where to resume, then shuts the server down.
class ControlServer {
 public:
  // INVALID_ARGUMENT: a malformed --listen, a non-loopback one without --tls_cert/--tls_key, a bad
  // PEM file (named), --tls_key without --tls_cert or --tls_client_ca without both. UNAVAILABLE: the
  // address is in use (or not this host's). `service` must outlive the server.
  static absl::StatusOr<std::unique_ptr<ControlServer>> Start(const ControlServerOptions& options, JobService* service);
  ~ControlServer();
  const std::string& address() const { return address_; }  // with the port actually bound
  void Stop();

 private:
  ControlServer() = default;

  std::unique_ptr<ControlService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_CONTROL_SERVICE_H_
