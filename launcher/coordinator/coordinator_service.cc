// gRPC adapter for CoordinatorState (see coordinator_service.h): each RPC authenticates, hands the
// request to the state and finishes its reactor from the state's answer or completion callback.
#include "launcher/coordinator/coordinator_service.h"

#include <unistd.h>

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/host.h"
#include "launcher/coordinator/listen_address.h"

namespace stagehand {
namespace {

constexpr char kBearer[] = "Bearer ";

absl::Time Deadline(const grpc::ServerContextBase& context) {
  auto d = context.deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// The earlier of the call's own deadline and the request's timeout.
absl::Time Deadline(const grpc::ServerContextBase& context, int64_t timeout_ms) {
  absl::Time d = Deadline(context);
  if (timeout_ms > 0) d = std::min(d, absl::Now() + absl::Milliseconds(timeout_ms));
  return d;
}

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* context, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// Finishes `reactor` with `result`, first storing its value into the response with `store`.
template <typename T, typename Store>
void FinishWith(grpc::ServerUnaryReactor* reactor, absl::StatusOr<T> result, Store store) {
  if (result.ok()) store(*std::move(result));
  reactor->Finish(ToGrpcStatus(result.status()));
}

// An agent's WaitForStop: its cancellation (the connection closed under it) tells the state at once
// that the node is gone, before any heartbeat timeout.
class AgentStopReactor final : public grpc::ServerUnaryReactor {
 public:
  AgentStopReactor(CoordinatorState* state, const WaitForStopRequest& request) : state_(state), request_(request) {}
  void OnCancel() override {
    state_->AgentDisconnected(request_.node_rank(), request_.incarnation(), request_.restart_count(),
                              request_.until_restart());
  }
  void OnDone() override { delete this; }

 private:
  CoordinatorState* const state_;
  const WaitForStopRequest request_;
};

}  // namespace

absl::Status CoordinatorService::Authenticate(const grpc::ServerContextBase& context) const {
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return absl::UnauthenticatedError("no job secret presented");
  absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearer)) return absl::UnauthenticatedError("malformed authorization");
  value.remove_prefix(sizeof(kBearer) - 1);
  return state_->CheckSecret(value);
}

CoordinatorService::Reactor* CoordinatorService::Refused(Context* context) const {
  absl::Status auth = Authenticate(*context);
  return auth.ok() ? nullptr : Finished(context, auth);
}

#define STAGEHAND_AUTHENTICATE(context) \
  if (Reactor* refused = Refused(context)) return refused

CoordinatorService::Reactor* CoordinatorService::GetServerInfo(Context* context, const GetServerInfoRequest*,
                                                               GetServerInfoResponse* response) {
  response->set_server("stagehand");
  response->set_protocol_version(kProtocolVersion);
  response->set_job_id(state_->job_id());
  response->set_host(HostName());
  response->set_pid(getpid());
  return Finished(context, absl::OkStatus());
}

CoordinatorService::Reactor* CoordinatorService::GetJob(Context* context, const GetJobRequest*,
                                                        GetJobResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  response->set_job_id(state_->job_id());
  *response->mutable_job() = state_->job();
  return Finished(context, absl::OkStatus());
}

CoordinatorService::Reactor* CoordinatorService::Register(Context* context, const RegisterRequest* request,
                                                          RegisterResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  Reactor* reactor = context->DefaultReactor();
  state_->RegisterAsync(*request, Deadline(*context), [reactor, response](absl::StatusOr<Assignment> a) {
    FinishWith(reactor, std::move(a), [response](Assignment v) { *response->mutable_assignment() = std::move(v); });
  });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::KeyValueSet(Context* context, const KeyValueSetRequest* request,
                                                             KeyValueSetResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return Finished(context,
                  state_->KeyValueSet(request->rank(), request->incarnation(), request->key(), request->value()));
}

CoordinatorService::Reactor* CoordinatorService::KeyValueGet(Context* context, const KeyValueGetRequest* request,
                                                             KeyValueGetResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  Reactor* reactor = context->DefaultReactor();
  state_->KeyValueGetAsync(
      request->key(), Deadline(*context, request->timeout_ms()), [reactor, response](absl::StatusOr<std::string> v) {
        FinishWith(reactor, std::move(v), [response](std::string s) { response->set_value(std::move(s)); });
      });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::Barrier(Context* context, const BarrierRequest* request,
                                                         BarrierResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  Reactor* reactor = context->DefaultReactor();
  state_->BarrierAsync(request->barrier_id(), request->rank(), request->incarnation(),
                       Deadline(*context, request->timeout_ms()),
                       [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::Heartbeat(Context* context, const HeartbeatRequest* request,
                                                           HeartbeatResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  Reactor* reactor = context->DefaultReactor();
  FinishWith(reactor, state_->Heartbeat(*request), [response](HeartbeatResponse r) { *response = std::move(r); });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::WaitForStop(Context* context, const WaitForStopRequest* request,
                                                             WaitForStopResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  if (request->node_rank() != 0) {
    auto* agent = new AgentStopReactor(state_, *request);
    state_->AgentWaitForStopAsync(request->node_rank(), request->incarnation(), request->restart_count(),
                                  request->until_restart(), Deadline(*context),
                                  [agent, response](absl::StatusOr<WaitForStopResponse> r) {
                                    FinishWith(static_cast<Reactor*>(agent), std::move(r),
                                               [response](WaitForStopResponse v) { *response = std::move(v); });
                                  });
    return agent;
  }
  Reactor* reactor = context->DefaultReactor();
  state_->WaitForStopAsync(request->rank(), request->incarnation(), Deadline(*context),
                           [reactor, response](absl::StatusOr<WaitForStopResponse> r) {
                             FinishWith(reactor, std::move(r),
                                        [response](WaitForStopResponse v) { *response = std::move(v); });
                           });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::ReportMilestone(Context* context,
                                                                 const ReportMilestoneRequest* request,
                                                                 ReportMilestoneResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return Finished(context, state_->ReportMilestone(*request));
}

CoordinatorService::Reactor* CoordinatorService::ReportStep(Context* context, const ReportStepRequest* request,
                                                            ReportStepResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  absl::Status s = state_->ReportStep(*request);
  // Read after the report is recorded: a request made in between counts this step (coordinator.h).
  if (s.ok()) response->set_checkpoint_and_stop_at(state_->checkpoint_and_stop_at());
  return Finished(context, s);
}

CoordinatorService::Reactor* CoordinatorService::Finish(Context* context, const FinishRequest* request,
                                                        FinishResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return Finished(context, state_->Finish(*request));
}

// --- Agents (several hosts) ---

namespace {

// "ipv4:198.18.0.12:40000" or "ipv6:[::1]:40000" -> "198.18.0.12" or "::1": the address its
// workers can be reached at, as this coordinator sees the agent.
std::string PeerHost(const std::string& peer) {
  std::string p = peer;
  if (absl::StartsWith(p, "ipv4:"))
    p = p.substr(5);
  else if (absl::StartsWith(p, "ipv6:"))
    p = p.substr(5);
  const size_t colon = p.rfind(':');
  if (colon != std::string::npos) p = p.substr(0, colon);
  if (p.size() >= 2 && p.front() == '[' && p.back() == ']') p = p.substr(1, p.size() - 2);
  return p;
}

}  // namespace

CoordinatorService::Reactor* CoordinatorService::RegisterAgent(Context* context, const RegisterAgentRequest* request,
                                                               RegisterAgentResponse* response) {
  // A verified client certificate (mutual TLS) is the agent's proof; on loopback, the secret it read
  // from --job_token_file.
  std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    absl::Status s = Authenticate(*context);
    if (!s.ok()) {
      return Finished(context, absl::UnauthenticatedError(absl::StrCat(
                                   s.message(),
                                   "; an agent proves itself with a client certificate (--tls_cert, "
                                   "--tls_key) or, on loopback, with the same --job_token_file as node 0")));
    }
  }
  Reactor* reactor = context->DefaultReactor();
  state_->RegisterAgentAsync(*request, PeerHost(context->peer()), Deadline(*context),
                             [reactor, response](absl::StatusOr<RegisterAgentResponse> r) {
                               FinishWith(reactor, std::move(r),
                                          [response](RegisterAgentResponse v) { *response = std::move(v); });
                             });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::AgentHeartbeat(Context* context, const AgentHeartbeatRequest* request,
                                                                AgentHeartbeatResponse* response) {
  STAGEHAND_AUTHENTICATE(context);
  Reactor* reactor = context->DefaultReactor();
  FinishWith(reactor, state_->AgentHeartbeat(*request),
             [response](AgentHeartbeatResponse r) { *response = std::move(r); });
  return reactor;
}

CoordinatorService::Reactor* CoordinatorService::ReportWorkerExit(Context* context,
                                                                  const ReportWorkerExitRequest* request,
                                                                  ReportWorkerExitResponse*) {
  STAGEHAND_AUTHENTICATE(context);
  return Finished(context, state_->ReportWorkerExit(*request));
}

absl::StatusOr<std::string> LoopbackListenAddress(const std::string& address) { return ListenAddress(address, false); }

bool IsLoopbackAddress(const std::string& address) { return LoopbackListenAddress(address).ok(); }

absl::StatusOr<std::string> ListenAddress(const std::string& address, bool tls) {
  const std::optional<HostPort> split = SplitHostPort(address);
  if (!split) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator_address=", address, ": expected HOST:PORT or [IPv6]:PORT (port 0 picks one)"));
  }
  absl::StatusOr<ResolvedHost> host = ResolveHost(split->host);
  if (!host.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--coordinator_address=", address, ": ", host.status().message(), "; use 127.0.0.1:PORT"));
  }
  if (!host->loopback && !tls) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--coordinator_address=", address, ": ", split->host, " resolves to ", host->non_loopback,
        ", not loopback (127.0.0.0/8 or ::1); another address is served only over mutual TLS: pass --tls_cert, "
        "--tls_key and --tls_ca (or use 127.0.0.1:PORT)"));
  }
  return absl::StrCat(host->numeric, ":", split->port);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const std::string& address,
                                                                            CoordinatorState* state, int max_threads) {
  CoordinatorServerOptions options;
  options.address = address;
  options.max_threads = max_threads;
  return Start(options, state);
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const CoordinatorServerOptions& options,
                                                                            CoordinatorState* state) {
  const std::string& address = options.address;
  const int max_threads = options.max_threads;
  const bool tls = !options.tls.cert.empty();
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> c = ServerTlsCredentials(options.tls);
    if (!c.ok()) return c.status();
    credentials = *std::move(c);
  }
  absl::StatusOr<std::string> bind = ListenAddress(address, tls);
  if (!bind.ok()) return bind.status();
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer(state, std::make_unique<CoordinatorService>(state)));
  grpc::ServerBuilder builder;
  int bound = 0;
  // The resolved address, not the name: a second resolution could give another answer.
  builder.AddListeningPort(*bind, credentials, &bound);
  // Otherwise two servers can bind one port silently (gRPC sets SO_REUSEPORT); this way the second fails.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(server->service_.get());
  // No server-side deadline timer per call: every wait of CoordinatorState ends at the call's own
  // deadline (the service hands it over) and every other call is answered at once, so the timer only
  // cost time: a fifth of the coordinator's CPU at 10,000 workers (tools/coordinator_load). Clients
  // still enforce their deadlines, and a cancelled call is still cancelled.
  builder.AddChannelArgument(GRPC_ARG_ENABLE_DEADLINE_CHECKS, 0);
  if (max_threads > 0) {
    grpc::ResourceQuota quota("coordinator");
    quota.SetMaxThreads(max_threads);
    builder.SetResourceQuota(quota);
  }
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, " (is the port in use?)"));
  }
  server->address_ = absl::StrCat(bind->substr(0, bind->rfind(':')), ":", bound);
  return server;
}

void CoordinatorServer::Stop() {
  if (server_ == nullptr) return;
  // The server's shutdown waits for every call to finish, and a waiting call finishes only when
  // its wait completes: end them all first (WaitForStop among them, which never times out).
  state_->Shutdown();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  server_->Wait();
  server_.reset();
}

CoordinatorServer::~CoordinatorServer() { Stop(); }

}  // namespace stagehand
