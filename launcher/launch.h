// One launch from start to end: resolve and validate the job, create the run directory, serve the
// coordinator, spawn and supervise the workers, handle SIGINT/SIGTERM, print the root cause or the
// summary and the startup ledger. Returns the launcher's exit code (supervisor.h lists them).
#ifndef STAGEHAND_LAUNCHER_LAUNCH_H_
#define STAGEHAND_LAUNCHER_LAUNCH_H_

#include <string>

#include "absl/time/clock.h"
#include "launcher/job.h"

namespace stagehand {

struct LaunchOptions {
  JobRequest job;
  std::string run_dir;              // "" for runs/<time>-<name>-<id> under the working directory
  std::string coordinator_address;  // host:port; port 0 picks one
  std::string worker_binary;        // "" to find it beside the launcher
  absl::Time launch = absl::Now();  // when the launcher process started (the ledger counts from it)
};

// SIGINT, SIGTERM and SIGCHLD must be blocked in every thread before this is called (main() does it
// first thing), so that Launch() receives them with sigtimedwait.
int Launch(const LaunchOptions& options);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_LAUNCH_H_
