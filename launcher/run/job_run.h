// One job from its coordinator's start to its reports, driven by Tick(): the part of a launch that
// the foreground run (launch.cc) and the server (serve.cc) share. It serves the coordinator, creates
// the run directory, spawns and supervises the workers through the spawner it is given, writes
// steps.csv as steps arrive and the reports at the end (each whole or absent). It handles no signal
// and prints nothing itself: its lines go to a JobListener, so a foreground run prints them and the
// server streams them to watchers.
#ifndef STAGEHAND_LAUNCHER_RUN_JOB_RUN_H_
#define STAGEHAND_LAUNCHER_RUN_JOB_RUN_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/coordinator/coordinator_service.h"
#include "launcher/store/c10d_store.h"
#include "launcher/job/job.h"
#include "launcher/multihost/nodes.h"
#include "launcher/supervise/process.h"
#include "launcher/supervise/program_gpus.h"
#include "launcher/run/progress.h"
#include "launcher/run/report.h"
#include "launcher/supervise/supervisor.h"
#include "protos/job.pb.h"

namespace stagehand {

// The run's results could not be written (a full disk, an I/O error, permissions): the run was
// stopped, and what is in the run directory is whole but not everything. Beside supervisor.h's codes.
inline constexpr int kExitWriteFailed = 5;

// Where a run's output goes.
class JobListener {
 public:
  virtual ~JobListener() = default;
  // The launcher's own output: whole lines (ending in "\n"), or a progress bar's redraw ("\r[##..] ...").
  virtual void Text(absl::string_view text) = 0;
  // A line refusing the job before anything started (no newline); by default as Text.
  virtual void Refusal(absl::string_view line) { Text(absl::StrCat(line, "\n")); }
  // Each step report as it arrives (after it is in steps.csv).
  virtual void Step(const ReportStepRequest& step) {}
};

struct JobRunOptions {
  ResolvedJob job;  // validated (ValidateLaunch)
  std::string job_id;
  std::string secret;  // the job's secret (workers and coordinator)
  std::string worker_binary;
  std::string run_dir;  // checked (CheckRunDir); created by Start
  bool overwrite = false;
  std::string coordinator_address;  // host:port; port 0 picks one
  absl::Time launch = absl::Now();  // the ledger counts from it
  double peak_tflops_per_device = 989.0;
  bool progress_bar = false;
  // Several hosts (launcher --nodes=N, this being node 0): the run waits for the agents of nodes
  // 1..N-1, then fixes the world (resolve_world: the job resolved for every node's workers; a refusal
  // ends the run with exit 2) and starts every node's workers. 1: this host only, as always.
  int nodes = 1;
  // Several hosts, a program job: `-- PROGRAM ARGS` as typed, which every agent's must equal (each
  // runs its own); its c10d store serves on the coordinator's host, to the nodes' addresses only.
  std::vector<std::string> program;
  NodeTls tls;  // mutual TLS of the coordinator and this host's workers (any non-loopback address)
  std::function<absl::StatusOr<JobSpec>(int world_workers, const std::vector<NodeState>& nodes)> resolve_world;
};

struct JobRunEnd {
  int exit_code = 0;
  RunReport report;
};

class JobRun {
 public:
  // Serves the coordinator, creates the run directory and its first files, spawns the workers. When
  // it fails, nothing was started and `exit_code` says why (2: the address or the run directory, 4:
  // the coordinator could not serve, 5: a first file could not be written); the line went to the
  // listener. `spawner` and `listener` outlive the run.
  static std::unique_ptr<JobRun> Start(JobRunOptions options, ProcessSpawner* spawner, JobListener* listener,
                                       int& exit_code);
  ~JobRun();

  // One pass over the workers, the progress and steps.csv. True once every worker is gone.
  bool Tick();
  // SIGINT or SIGTERM: the first stops gracefully (coordinator stop, SIGTERM, SIGKILL after the
  // grace period); `force` kills every worker at once.
  void Interrupt(int signal, bool force);
  // The first SIGTERM of a training job that writes checkpoints (and term_checkpoint_timeout_ms is
  // not 0): every rank writes a checkpoint at the next step boundary (CoordinatorState::
  // RequestCheckpointAndStop) and ends; if they are not all gone within the timeout, the run is
  // interrupted as by Interrupt(signal). Prints its line; false (nothing done, nothing printed) when
  // the job has no checkpoints or is not running, so the caller interrupts instead. True, with a line
  // saying so, when a checkpoint is already under way. `node`: the node whose agent got the signal
  // (several hosts), 0 for this launcher's own.
  bool CheckpointAndStop(int signal, int node = 0);
  // Once Tick() returned true: the reports, then the closing lines. `first_signal` is the first
  // signal taken (0: none; SIGHUP is named in the root cause). `note` (whole lines, or "") is printed
  // after the progress and before the summary, so that the last line is the verdict.
  JobRunEnd Finish(int first_signal, absl::string_view note = "");

  const std::string& run_dir() const { return options_.run_dir; }
  const std::string& coordinator_address() const;
  const CoordinatorState& state() const { return state_; }
  int64_t steps_done() const;

 private:
  class Files;
  JobRun(JobRunOptions options, ProcessSpawner* spawner, JobListener* listener);
  SupervisorOptions WorkerOptions();
  // Several hosts: true once the world is fixed (or refused) and the supervisor exists.
  bool StartWorld();
  void FailBeforeWorld(int exit_code, const std::string& why);
  int64_t TermCheckpointStep() const;

  const JobRunOptions options_;
  ProcessSpawner* const spawner_;
  JobListener* const listener_;
  CoordinatorState state_;
  std::unique_ptr<CoordinatorServer> server_;
  // A program job's c10d store (MASTER_ADDR/MASTER_PORT), which its ranks' env:// rendezvous use: on
  // loopback, or on several hosts on the coordinator's host, open to the nodes' addresses only.
  std::unique_ptr<C10dStoreServer> store_;
  int64_t store_incarnation_ = 1;  // the attempt store_ serves
  std::string store_host_ = "127.0.0.1";
  std::vector<std::string> store_peers_;  // empty: any (loopback)
  absl::Status StartStore();
  std::vector<std::string> ProgramEnv(int64_t incarnation);
  // A program job: this host's ranks' steps files (ProgramStepsFile), read on every tick.
  std::unique_ptr<ProgramStepsReader> steps_reader_;
  std::unique_ptr<ProgramGpus> program_gpus_;  // a program job on GPUs: health gate and telemetry
  void ReadProgramSteps(int64_t incarnation);
  std::unique_ptr<Files> files_;
  std::unique_ptr<Supervisor> supervisor_;
  Progress progress_;
  // A SIGTERM checkpoint asked for: its step (0: none), the signal, when to give up waiting.
  int64_t term_at_ = 0;
  int term_signal_ = 0;
  int term_node_ = 0;  // the node whose signal asked for the checkpoint (0: this launcher's)
  absl::Time term_deadline_;
  bool term_timed_out_ = false;
};

// The line a foreground run prints when a signal arrives (the `interrupts`-th).
std::string InterruptLine(int signal, int interrupts);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_JOB_RUN_H_
