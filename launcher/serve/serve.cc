// `launcher --serve` (see serve.h).
#include "launcher/serve/serve.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "common/grpc_status.h"
#include "launcher/serve/control_service.h"
#include "launcher/coordinator/coordinator_service.h"
#include "launcher/plan/devices.h"
#include "launcher/serve/job_server.h"
#include "launcher/job/run_dir.h"
#include "launcher/supervise/supervisor.h"

namespace stagehand {
namespace {

void Say(const std::string& line) {
  std::printf("stagehand: %s\n", line.c_str());
  std::fflush(stdout);
}

// Everything that can refuse the options before anything is created: off loopback only with TLS.
absl::Status CheckServeOptions(const ServeOptions& o) {
  if (o.state_dir.empty())
    return absl::InvalidArgumentError(
        "--serve needs --state_dir=DIR (where the job store, the admin token and the run directories go)");
  if ((o.tls_cert.empty()) != (o.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: pass both (PEM files), or neither on loopback");
  }
  if (!o.tls_client_ca.empty() && o.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key (mutual TLS is TLS first)");
  }
  if (o.tls_cert.empty() && !LoopbackListenAddress(o.listen).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", o.listen,
        " is not a loopback address: off this machine the server takes only TLS; pass "
        "--tls_cert=FILE --tls_key=FILE (and --tls_client_ca=FILE for mutual TLS), or --listen=127.0.0.1:PORT"));
  }
  return absl::OkStatus();
}

}  // namespace

int Serve(const ServeOptions& options) {
  QuietGrpcLogs();  // a client's failed handshake is not the server's log line
  if (absl::Status s = CheckServeOptions(options); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  JobServerOptions so;
  so.state_dir = options.state_dir;
  so.worker_binary = options.worker_binary;
  so.inventory = QueryDevices();
  so.max_cpu_workers = options.max_cpu_workers;
  for (absl::string_view root : absl::StrSplit(options.job_roots, ',', absl::SkipWhitespace())) {
    so.job_roots.push_back(UserPath(std::string(absl::StripAsciiWhitespace(root))));
  }
  so.new_admin_token = options.new_admin_token;
  so.allow_commands = options.allow_commands;
  so.peak_tflops_per_device = options.peak_tflops_per_device;
  so.tls = !options.tls_cert.empty();
  so.mutual_tls = !options.tls_client_ca.empty();
  so.log = Say;
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<JobServer>> server = JobServer::Open(so, notes);
  if (!server.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(server.status().message()).c_str());
    return kExitUsage;
  }
  ControlServerOptions co;
  co.listen = options.listen;
  co.tls_cert = options.tls_cert;
  co.tls_key = options.tls_key;
  co.tls_client_ca = options.tls_client_ca;
  absl::StatusOr<std::unique_ptr<ControlServer>> control = ControlServer::Start(co, server->get());
  if (!control.ok()) {
    const StartCreated created = (*server)->created();
    server->reset();  // the store closed first
    RemoveCreated(created);
    std::fprintf(stderr, "stagehand: %s\n", std::string(control.status().message()).c_str());
    return control.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitLaunchFailed;
  }
  for (const std::string& note : notes) Say(note);
  const control::GetServerInfoResponse info = (*server)->Info();
  Say(absl::StrCat(
      "serving on ", (*control)->address(),
      so.tls ? (so.mutual_tls ? " (mutual TLS)" : " (TLS)") : " (plaintext, loopback)", "; ", info.gpus(), " GPU",
      info.gpus() == 1 ? "" : "s", ", up to ", info.cpu_workers(), " CPU workers at once; state in ", options.state_dir,
      so.allow_commands ? "; commands allowed (--allow_commands: every submit token is a shell here)" : ""));
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  int signals = 0;
  while (signals == 0 || (*server)->Running() > 0) {
    (*server)->Tick();
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t sig_info;
    const int sig = sigtimedwait(&set, &sig_info, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      ++signals;
      const int running = (*server)->Running();
      Say(absl::StrCat(sig == SIGINT    ? "SIGINT"
                       : sig == SIGTERM ? "SIGTERM"
                                        : "SIGHUP",
                       ": stopping",
                       running > 0 ? absl::StrCat(" (", running, " running job", running == 1 ? "" : "s",
                                                  signals == 1 ? " stopped; again to kill them at once)" : " killed)")
                                   : ""));
      (*server)->Shutdown(/*force=*/signals > 1);
    }
  }
  (*control)->Stop();
  Say("stopped; queued jobs stay queued for the next start");
  if (const int checks = (*server)->ValidationsRunning(); checks > 0) {
    // Their threads may be in anything static: end the process without running destructors (the
    // store's commits are on disk; the lock goes with the process).
    Say(absl::StrCat(checks, " submission check", checks == 1 ? " was" : "s were", " still running: abandoned"));
    std::fflush(nullptr);
    _exit(kExitSuccess);
  }
  return kExitSuccess;
}

}  // namespace stagehand
