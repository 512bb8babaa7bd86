// gRPC adapter for JobService (see control_service.h): each RPC reads the token, authenticates it
// and hands the request to the service; streams loop over the service's bounded waits.
//
// Why the sync API with a thread per stream rather than the callback API (which the Coordinator
// uses): JobService's waits are blocking calls (Events and ReadLog wait up to a second for news), so
// a watcher needs a thread while it waits whichever API serves it; callbacks would only move those
// threads into a pool of our own. gRPC 1.51's sync server starts a thread per active call, bounded by
// the ResourceQuota's thread count (ControlServerOptions::max_threads, 256 by default: 50 watchers of
// a job, the test's figure, use about 55); a call beyond the bound is answered RESOURCE_EXHAUSTED
// rather than queued behind streams that may last hours.
#include "launcher/serve/control_service.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/tls.h"
#include "launcher/coordinator/listen_address.h"

namespace stagehand {
namespace {

constexpr char kBearer[] = "Bearer ";
constexpr int64_t kChunkBytes = 64 * 1024;
constexpr absl::Duration kStreamWait = absl::Seconds(1);  // how long the server may miss a Stop()

// The most of a status message sent back: it travels in the HTTP/2 trailers, where gRPC turns one
// over 16 KiB into a bare "Stream removed"; messages that echo what a client sent are cut here, whatever
// sent them.
constexpr size_t kMaxStatusMessageBytes = 2048;

grpc::Status ToGrpc(const absl::Status& status) {
  grpc::Status out = ToGrpcStatus(status);
  if (out.error_message().size() <= kMaxStatusMessageBytes) return out;
  const std::string& m = out.error_message();
  return grpc::Status(out.error_code(),
                      absl::StrCat(m.substr(0, kMaxStatusMessageBytes - 40), "... (cut: ", m.size(), " bytes in all)"));
}

template <typename T>
grpc::Status Reply(absl::StatusOr<T> result, T* response) {
  if (result.ok()) *response = *std::move(result);
  return ToGrpc(result.status());
}

grpc::Status Unavailable(const std::string& message) { return grpc::Status(grpc::StatusCode::UNAVAILABLE, message); }
grpc::Status ClientGone() { return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away"); }

}  // namespace

absl::StatusOr<Caller> ControlService::Authenticate(const grpc::ServerContext& context) const {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) {
    return absl::UnauthenticatedError(
        "no token presented: pass --token_file=FILE (or set STAGEHAND_TOKEN_FILE); the server's admin mints one "
        "with `client token mint`");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) {
    return absl::UnauthenticatedError("malformed authorization metadata: expected \"Bearer <token>\"");
  }
  value.remove_prefix(sizeof(kBearer) - 1);
  return service_->Authenticate(value);
}

#define STAGEHAND_AUTHENTICATE(caller, context)             \
  absl::StatusOr<Caller> caller = Authenticate(*(context)); \
  if (!caller.ok()) return ToGrpc(caller.status())

grpc::Status ControlService::GetServerInfo(Context*, const control::GetServerInfoRequest*,
                                           control::GetServerInfoResponse* response) {
  *response = service_->Info();
  // Only the adapter knows how it listens.
  response->set_tls(tls_);
  response->set_mutual_tls(mutual_tls_);
  return grpc::Status::OK;
}

grpc::Status ControlService::SubmitJob(Context* context, const control::SubmitJobRequest* request,
                                       control::JobInfo* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  return Reply(service_->Submit(*caller, *request), response);
}

grpc::Status ControlService::GetJob(Context* context, const control::GetJobRequest* request,
                                    control::JobInfo* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  return Reply(service_->Get(*caller, request->id()), response);
}

grpc::Status ControlService::ListJobs(Context* context, const control::ListJobsRequest* request,
                                      control::ListJobsResponse* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  return Reply(service_->List(*caller, *request), response);
}

grpc::Status ControlService::DeleteJob(Context* context, const control::DeleteJobRequest* request,
                                       control::DeleteJobResponse* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  absl::StatusOr<std::string> run_dir = service_->Delete(*caller, request->id());
  if (run_dir.ok()) response->set_run_dir(*run_dir);
  return ToGrpc(run_dir.status());
}

grpc::Status ControlService::WatchJob(Context* context, const control::WatchJobRequest* request,
                                      grpc::ServerWriter<control::JobEvent>* writer) {
  STAGEHAND_AUTHENTICATE(caller, context);
  int64_t last_seq = request->after_seq();
  // Each turn waits at most kStreamWait, so a client gone or a Stop() is seen within that.
  for (;;) {
    if (context->IsCancelled()) return ClientGone();
    if (stopping_) {
      return Unavailable(absl::StrCat("the server is shutting down; resume with after_seq=", last_seq));
    }
    absl::StatusOr<EventBatch> batch =
        service_->Events(*caller, request->id(), last_seq, !request->no_lines(), kStreamWait);
    if (!batch.ok()) return ToGrpc(batch.status());
    for (const control::JobEvent& event : batch->events) {
      if (!writer->Write(event)) return ClientGone();
      last_seq = event.seq();
    }
    if (batch->ended) return grpc::Status::OK;
  }
}

grpc::Status ControlService::CancelJob(Context* context, const control::CancelJobRequest* request,
                                       control::JobInfo* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  return Reply(service_->Cancel(*caller, request->id()), response);
}

grpc::Status ControlService::Logs(Context* context, const control::LogsRequest* request,
                                  grpc::ServerWriter<control::LogChunk>* writer) {
  STAGEHAND_AUTHENTICATE(caller, context);
  int64_t offset = request->offset();
  const absl::Duration wait = request->follow() ? kStreamWait : absl::ZeroDuration();
  for (;;) {
    if (context->IsCancelled()) return ClientGone();
    if (stopping_) return Unavailable(absl::StrCat("the server is shutting down; resume from offset ", offset));
    absl::StatusOr<LogRead> read = service_->ReadLog(
        *caller, request->id(), request->launcher() ? kLauncherLogRank : request->rank(), offset, kChunkBytes, wait);
    if (!read.ok()) return ToGrpc(read.status());
    if (!read->data.empty()) {
      control::LogChunk chunk;
      chunk.set_offset(read->offset);
      offset = read->offset + static_cast<int64_t>(read->data.size());
      chunk.set_data(std::move(read->data));
      if (!writer->Write(chunk)) return ClientGone();
    } else if (!request->follow()) {
      return grpc::Status::OK;  // the log as it is now, read to its end
    }
    if (read->ended) return grpc::Status::OK;
  }
}

grpc::Status ControlService::FetchFile(Context* context, const control::FetchFileRequest* request,
                                       grpc::ServerWriter<control::FileChunk>* writer) {
  STAGEHAND_AUTHENTICATE(caller, context);
  int64_t offset = 0;
  for (bool first = true;; first = false) {
    if (context->IsCancelled()) return ClientGone();
    if (stopping_) return Unavailable("the server is shutting down; fetch the file again");
    absl::StatusOr<FileRead> read = service_->ReadFile(*caller, request->id(), request->path(), offset, kChunkBytes);
    if (!read.ok()) return ToGrpc(read.status());
    if (read->data.empty() && !read->eof) {
      return grpc::Status(
          grpc::StatusCode::INTERNAL,
          absl::StrCat(request->path().substr(0, 200), ": read nothing at offset ", offset, " before its end"));
    }
    control::FileChunk chunk;
    if (first) chunk.set_total_bytes(read->total_bytes);  // sent even for an empty file
    offset += static_cast<int64_t>(read->data.size());
    chunk.set_data(std::move(read->data));
    if ((first || !chunk.data().empty()) && !writer->Write(chunk)) return ClientGone();
    if (read->eof) return grpc::Status::OK;
  }
}

grpc::Status ControlService::MintToken(Context* context, const control::MintTokenRequest* request,
                                       control::MintTokenResponse* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  absl::StatusOr<std::string> token = service_->MintToken(*caller, request->name(), request->role());
  if (token.ok()) response->set_token(*std::move(token));
  return ToGrpc(token.status());
}

grpc::Status ControlService::RevokeToken(Context* context, const control::RevokeTokenRequest* request,
                                         control::RevokeTokenResponse*) {
  STAGEHAND_AUTHENTICATE(caller, context);
  return ToGrpc(service_->RevokeToken(*caller, request->name()));
}

grpc::Status ControlService::ListTokens(Context* context, const control::ListTokensRequest*,
                                        control::ListTokensResponse* response) {
  STAGEHAND_AUTHENTICATE(caller, context);
  absl::StatusOr<std::vector<control::TokenInfo>> tokens = service_->ListTokens(*caller);
  if (!tokens.ok()) return ToGrpc(tokens.status());
  for (control::TokenInfo& t : *tokens) *response->add_tokens() = std::move(t);
  return grpc::Status::OK;
}

absl::StatusOr<ListenAddress> ResolveListenAddress(const std::string& listen) {
  const std::optional<HostPort> split = SplitHostPort(listen);
  if (!split) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": expected HOST:PORT or [IPv6]:PORT (port 0 picks one)"));
  }
  absl::StatusOr<ResolvedHost> host = ResolveHost(split->host);
  if (!host.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", listen, ": ", host.status().message(), "; pass a numeric address"));
  }
  ListenAddress out;
  out.loopback = host->loopback;  // every address the name has: "127.evil.test" resolving elsewhere is not
  out.bind = absl::StrCat(host->numeric, ":", split->port);
  return out;
}

namespace {

absl::Status CheckTlsOptions(const ControlServerOptions& o, const ListenAddress& address) {
  const bool tls = !o.tls_cert.empty() || !o.tls_key.empty();
  if (tls && (o.tls_cert.empty() || o.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: pass both (the server's certificate and its key)");
  }
  if (!o.tls_client_ca.empty() && !tls) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS first)");
  }
  if (!address.loopback && !tls) {
    return absl::InvalidArgumentError(
        absl::StrCat("--listen=", o.listen, " is not a loopback address: pass --tls_cert=FILE --tls_key=FILE (and ",
                     "--tls_client_ca=FILE for mutual TLS), or listen on 127.0.0.1"));
  }
  return absl::OkStatus();
}

void ConfigureBuilder(grpc::ServerBuilder& builder, int max_threads) {
  // gRPC sets SO_REUSEPORT by default, and then two servers bind one port silently.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The client pings every 30 s to notice a dead connection under a quiet stream; allow it.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A submission is at most 256 KiB (job_server.h); nothing a client sends needs more than this.
  builder.SetMaxReceiveMessageSize(1 << 20);
  grpc::ResourceQuota quota("control");
  quota.SetMaxThreads(max_threads);
  builder.SetResourceQuota(quota);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MIN_POLLERS, 1);
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 2);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(const ControlServerOptions& options,
                                                                    JobService* service) {
  absl::StatusOr<ListenAddress> address = ResolveListenAddress(options.listen);
  if (!address.ok()) return address.status();
  if (absl::Status s = CheckTlsOptions(options, *address); !s.ok()) return s;
  const bool tls = !options.tls_cert.empty();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls) {
    auto ssl = ServerTlsCredentials({options.tls_cert, options.tls_key, options.tls_client_ca});
    if (!ssl.ok()) return ssl.status();
    credentials = *std::move(ssl);
  }
  std::unique_ptr<ControlServer> server(new ControlServer());
  server->service_ = std::make_unique<ControlService>(service, tls, !options.tls_client_ca.empty());
  grpc::ServerBuilder builder;
  int bound = 0;
  // The resolved address, not the name: a second resolution could give another answer.
  builder.AddListeningPort(address->bind, credentials, &bound);
  builder.RegisterService(server->service_.get());
  ConfigureBuilder(builder, options.max_threads);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on --listen=", options.listen, " (", address->bind,
                                               "): the address is in use, or not one of this host's; stop the other "
                                               "server or pick another port"));
  }
  server->address_ = absl::StrCat(address->bind.substr(0, address->bind.rfind(':')), ":", bound);
  return server;
}

void ControlServer::Stop() {
  if (server_ == nullptr) return;
  // Streams see the flag within kStreamWait and end with UNAVAILABLE and where to resume; the
  // deadline cancels whatever is still blocked (a write to a client that reads nothing).
  service_->BeginShutdown();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(kStreamWait + absl::Seconds(1)));
  server_->Wait();
  server_.reset();
}

ControlServer::~ControlServer() { Stop(); }

}  // namespace stagehand
