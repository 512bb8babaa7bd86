// Spawning and supervising worker processes, behind an interface so that the supervisor's logic can
// be unit-tested with a fake (fake_process.h). The real spawner is PosixProcessSpawner.
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_PROCESS_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_PROCESS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/supervise/terminal.h"

namespace stagehand {

// kSecretFdEnv (common/worker_contract.h) names the inherited file descriptor from which a child reads
// the job secret.

struct ProcessSpec {
  std::vector<std::string> argv;  // argv[0] is the path of the executable
  std::vector<std::string> env;   // the child's whole environment, "NAME=value"
  std::string output_prefix;      // each line the child writes (stdout and stderr) is printed with it
  std::string log_path;           // and appended, without the prefix, to this file (if not empty),
                                  // which the terminal's notice of dropped lines names
  std::string secret;             // written to a pipe whose read end the child inherits
  std::string cwd;                // the child's working directory ("": the launcher's)
  // A program of the user's (a program job's rank): the child is a small guard of ours that runs
  // the program as its own child in the same process group and ends as it ends (its exit code, or
  // the signal that killed it). Should the launcher die, even by SIGKILL, the guard kills the whole
  // group, so the program's own children (data loader workers, a shell's background jobs) do not
  // outlive it; without a guard only the direct child has PR_SET_PDEATHSIG.
  bool guard = false;
};

struct ProcessExit {
  int pid = 0;
  int exit_code = -1;  // when it exited; -1 when a signal ended it
  int signal = 0;      // the signal that ended it; 0 when it exited
};

class ProcessSpawner {
 public:
  virtual ~ProcessSpawner() = default;

  // Starts a child that leads its own process group. Returns its pid.
  virtual absl::StatusOr<int> Spawn(const ProcessSpec& spec) = 0;

  // Sends a signal to the process group of a child this spawner started (pid = its group id).
  virtual void SignalGroup(int pid, int signal) = 0;

  // Children (of this spawner) that ended since the last call. Never blocks.
  virtual std::vector<ProcessExit> Reap() = 0;

  // Waits until the output of an ended child has been forwarded to the end (or the timeout passes:
  // a grandchild may hold the pipe open), so that its last lines come before what follows.
  virtual void DrainOutput(int pid, absl::Duration timeout) = 0;
};

// The real spawner: fork/exec; the child gets its own process group, PR_SET_PDEATHSIG(SIGKILL) with a
// getppid() check (so it dies with the launcher, even if the launcher is killed with SIGKILL), a reset
// signal mask, and its stdout and stderr on one pipe that a thread forwards line by line to the log
// file (every line) and with the prefix to `terminal` (StdoutTerminal() when null), which drops lines
// rather than wait for a terminal that does not read.
// Spawn() must be called from a thread that lives as long as the children: PR_SET_PDEATHSIG fires when
// the thread that forked exits.
std::unique_ptr<ProcessSpawner> NewPosixProcessSpawner(TerminalWriter* terminal = nullptr);

// Makes this process a child subreaper (PR_SET_CHILD_SUBREAPER), so that orphaned grandchildren are
// reparented to it and reaped, not to init.
absl::Status BecomeSubreaper();

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_PROCESS_H_
