// One launch from start to end: resolve and validate the job and the run directory, serve the
// coordinator, create the run directory (after everything that can refuse), spawn and supervise the
// workers, write steps.csv as steps arrive, handle SIGINT/SIGTERM/SIGHUP, write the reports (each
// whole or absent), print the root cause or the summary and the startup ledger. Returns the
// launcher's exit code (supervisor.h lists them; kExitWriteFailed is in job_run.h).
#ifndef STAGEHAND_LAUNCHER_RUN_LAUNCH_H_
#define STAGEHAND_LAUNCHER_RUN_LAUNCH_H_

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/status/statusor.h"
#include "launcher/plan/devices.h"
#include "launcher/job/job.h"
#include "launcher/run/job_run.h"
#include "launcher/multihost/nodes.h"
#include "protos/job.pb.h"

namespace stagehand {

// The launcher's version (--version), bumped with each release; the wire protocol has its own number
// (kProtocolVersion, launcher/coordinator/coordinator_service.h).
inline constexpr char kVersion[] = "0.11.0";

struct LaunchOptions {
  JobRequest job;
  std::string run_dir;                    // "" for runs/<time>-<name>-<id> under the working directory
  bool overwrite = false;                 // a non-empty run_dir holding an earlier run of ours is cleared
  std::string coordinator_address;        // host:port; port 0 picks one
  std::string worker_binary;              // "" to find it beside the launcher
  absl::Time launch = absl::Now();        // when the launcher process started (the ledger counts from it)
  double peak_tflops_per_device = 989.0;  // for MFU: dense bf16 of an H100/H200
  bool progress_bar = false;              // a live bar (a terminal) rather than a line per step
  // Several hosts: node 0 coordinates (at coordinator_address) and runs this host's workers; a
  // node_rank > 0 is an agent (node_agent.h). node.coordinator_address is coordinator_address.
  NodeOptions node;
  NodeTls tls;                 // the job's certificates: any non-loopback hop needs them
  std::string job_token_file;  // the job secret shared by every node (agents on loopback)
};

struct LaunchResult {
  int exit_code = 0;
  bool started = false;  // workers were spawned (false: refused before anything started)
  RunReport report;
  std::string run_dir;
};

struct ValidatedLaunch {
  ResolvedJob job;
  std::string worker_binary;
};

// Everything checked before anything is created (a run directory, a port, a process): the job
// (ResolveJob), the worker binary, the model's schedule and memory, the coordinator's address.
// INVALID_ARGUMENT (exit 2) with one line.
absl::StatusOr<ValidatedLaunch> ValidateLaunch(const LaunchOptions& options, const DeviceInventory& inventory);

// SIGINT, SIGTERM, SIGHUP and SIGCHLD must be blocked in every thread before this is called (main() does it
// first thing), so that Launch() receives them with sigtimedwait.
LaunchResult Launch(const LaunchOptions& options);

// `launcher --sweep=1,2,4`: the same job, a model or a program (`-- PROGRAM`), at each worker count
// (counts beyond the visible GPUs are skipped with a note), each run in <run_dir>/workers_<N>, then
// sweep.csv, sweep.md and sweep.svg in <run_dir> (sweep_report.h: a program's runs compare by the
// throughput its script reports). Every count is checked before the first runs (a refused one: exit 2, nothing
// started). Returns 0 when every run that was not skipped succeeded, else the first failure's code.
int Sweep(const LaunchOptions& options, const std::vector<int>& counts);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_LAUNCH_H_
