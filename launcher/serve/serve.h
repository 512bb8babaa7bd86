// `launcher --serve`: the control service on --listen, the job server behind it, and the serve loop
// that drives every job. Signals are handled here only: SIGTERM or SIGINT stops the running jobs
// (a second one kills them) and then the server; queued jobs wait in the store for the next start.
#ifndef STAGEHAND_LAUNCHER_SERVE_SERVE_H_
#define STAGEHAND_LAUNCHER_SERVE_SERVE_H_

#include <string>

namespace stagehand {

struct ServeOptions {
  std::string listen = "127.0.0.1:7070";  // HOST:PORT; a non-loopback HOST needs TLS
  std::string state_dir;
  std::string tls_cert, tls_key;  // PEM files: the server's certificate and key
  std::string tls_client_ca;      // PEM: clients must present a certificate it signed
  std::string worker_binary;      // "" to find it beside the launcher
  int max_cpu_workers = 0;        // 0: the cores
  std::string job_roots;          // comma-separated directories jobs' paths must lie in ("": defaults)
  bool new_admin_token = false;   // mint another admin token into <state_dir>/admin.token
  bool allow_commands = false;    // submissions may carry a command (JobServerOptions::allow_commands)
  double peak_tflops_per_device = 989.0;
};

// Returns the launcher's exit code: 0 after a signal stopped it, 2 for bad options (nothing was
// created), 4 when it could not serve.
int Serve(const ServeOptions& options);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_SERVE_H_
