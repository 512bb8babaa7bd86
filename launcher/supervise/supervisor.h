// Supervision of one run: spawns a worker per slot, watches exits, heartbeats and progress, stops the
// job on the first failure (coordinator stop, then SIGTERM, a grace period, SIGKILL), and names the
// root cause. Driven by Tick() from the launcher's main loop; no threads of its own, so unit tests
// drive it with a fake spawner and a fake clock.
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_SUPERVISOR_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_SUPERVISOR_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/worker_contract.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/plan/devices.h"
#include "launcher/supervise/process.h"

namespace stagehand {

// Exit codes of the launcher (README.md lists them).
enum ExitCode {
  kExitSuccess = 0,
  kExitWorkerFailed = 1,   // a worker exited non-zero, was killed, or reported an error
  kExitUsage = 2,          // bad flags or job: nothing was started
  kExitWorkerHung = 3,     // a worker missed heartbeats, stalled, or never registered
  kExitLaunchFailed = 4,   // a worker could not be started, or the coordinator could not serve
  kExitInterrupted = 130,  // SIGINT (128 + 2); SIGTERM gives 143
};
// SIGTERM (or SIGHUP) with checkpoints on: every rank wrote a checkpoint at one step and the run
// stopped there; --resume=RUN_DIR continues it (EX_TEMPFAIL of sysexits.h: try again).
inline constexpr int kExitCheckpointedOnTerm = 75;

// The worker's exit code when it left because the coordinator told it to (worker/main.cc).

struct SupervisorOptions {
  std::string worker_binary;
  std::string coordinator_address;
  std::string run_dir;
  std::vector<std::string> env;              // the environment every worker starts from
  std::vector<GpuInfo> gpus;                 // one per worker for GPU jobs (pinned by UUID)
  absl::Time launch = absl::InfinitePast();  // when the launcher started; default: construction
  // Several hosts. The ranks this supervisor spawns: [first_rank, first_rank + local_workers); -1:
  // every rank of the job (one host). Node 0 judges the other ranks' exits as their agents report
  // them (CoordinatorState::RemoteExits) and watches the agents' heartbeats; an agent (report_exit
  // set) reports its workers' exits and judges none, as node 0 does that for the whole job.
  int first_rank = 0;
  int local_workers = -1;
  std::vector<std::string> worker_args;  // more flags for every worker (TLS files, --listen_host)
  std::function<void(int rank, const ProcessExit&)> report_exit;
  // An agent: each of its ranks that could not be started, and why (set with report_exit).
  std::function<void(int rank, const std::string& why)> report_spawn_failure;
  // A program job (JobSpec.program): what every rank's program of an attempt (the incarnation) gets
  // beside its own variables (ProgramEnvironment): MASTER_ADDR and MASTER_PORT, the launcher's c10d
  // store, which is a new one for every attempt, as torchrun's agent makes it (torch's env://
  // rendezvous adds no attempt prefix to its keys).
  std::function<std::vector<std::string>(int64_t incarnation)> program_env;
  // A program job on several hosts: this host's node and the nodes (GROUP_RANK, GROUP_WORLD_SIZE).
  int node_rank = 0;
  int nodes = 1;
};

// A program job's environment for one rank, as torchrun gives it (torch/distributed/run.py and its
// elastic agent), so that unchanged scripts run: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
// GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, TORCHELASTIC_RESTART_COUNT,
// TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE=True,
// TORCHELASTIC_ERROR_FILE; OMP_NUM_THREADS=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING=1 where `base`
// (the launcher's environment) does not set them; PYTHONUNBUFFERED=1 so that its lines arrive as
// written; STAGEHAND_STEPS_FILE for the `stagehand` module. `base`, then `extra` (MASTER_ADDR,
// MASTER_PORT, PYTHONPATH: over `base`'s of the same name), come first; what is set here wins.
struct ProgramRank {
  int rank = 0, local_rank = 0, world_size = 1, local_world_size = 1, node = 0, nodes = 1;
  int restart_count = 0, max_restarts = 0;
  std::string run_id, error_file;
  std::string steps_file;  // STAGEHAND_STEPS_FILE: where the `stagehand` module appends its steps
};
// <run_dir>/rank<N>.steps: the lines a rank's `stagehand.step()` calls append ("step=3 seconds=0.12
// loss=2.5 tokens=4096 samples=8 flops=1.2e+12"), which the launcher reads (ParseProgramStep).
std::string ProgramStepsFile(const std::string& run_dir, int rank);
// One such line as a step report of `rank`; nullopt for a line that is not one (an unknown key, a
// negative count, FLOPs that are not a finite number).
std::optional<ReportStepRequest> ParseProgramStep(absl::string_view line, int rank, int64_t incarnation);
std::vector<std::string> ProgramEnvironment(const std::vector<std::string>& base, const std::vector<std::string>& extra,
                                            const ProgramRank& r);
// The steps files of ranks [first_rank, first_rank + ranks) in `run_dir`, each read on from where the
// last Read stopped: the lines appended since, as step reports of `incarnation` (a line cut short
// waits for its end). Bounded per call (a flood waits for the next); not thread-safe.
class ProgramStepsReader {
 public:
  ProgramStepsReader(std::string run_dir, int first_rank, int ranks);
  std::vector<ReportStepRequest> Read(int64_t incarnation);

 private:
  const std::string run_dir_;
  const int first_rank_;
  std::vector<int64_t> read_;         // per rank: bytes read so far
  std::vector<std::string> partial_;  // per rank: a line cut short
};

// A Python traceback's exception in the tail of a log: "ValueError: bad batch (train.py:42)", the
// type and message of its last line with the file (its base name) and line of its innermost frame;
// "" when the tail holds no traceback.
std::string PythonException(absl::string_view log_tail);

// A worker's own last error, for the root cause of its exit: from the tail of its log (rank<N>.log),
// the last line stagehand's logger wrote at severity E or F, less its prefix ("E12:34:56.789 w0
// worker_main.cc:328] "), else the last other line that names an error or an exception ("Traceback
// ...", "terminate called after throwing ..."). One line of printable text, at most
// kLastErrorChars characters ("..." ends a longer one); "" when there is none.
inline constexpr size_t kLastErrorChars = 300;
std::string LastErrorLine(absl::string_view log_tail);
// The same from the file's last 64 KiB ("" when it cannot be read).
std::string WorkerLastError(const std::string& log_path);

// The non-finite losses that stop a training run (CheckLoss): this many steps in a row.
inline constexpr int kNonFiniteLossSteps = 5;

struct RankLedger {
  int rank = 0;
  std::optional<absl::Duration> spawned, cuda_ready, registered, nccl_ready, first_step;  // since launch
};

class Supervisor {
 public:
  Supervisor(CoordinatorState* state, ProcessSpawner* spawner, SupervisorOptions options,
             std::function<absl::Time()> now = absl::Now);

  // Spawns every worker. On error the workers already started are being stopped; keep ticking.
  absl::Status Start();

  // One pass over exits and deadlines. Returns true once every worker is gone and the run is over.
  bool Tick();

  // SIGINT or SIGTERM: the first stops gracefully; a second (force) kills every worker at once. On
  // node 0, a rank's failure that an agent reported before the signal is judged first and stays the
  // cause.
  void Interrupt(int signal, bool force);
  // The run is to end after a checkpoint (SIGTERM, job_run.h): a failure from now on is not restarted.
  void PreventRestarts() { restarts_prevented_ = true; }
  // Workers are running and nothing is stopping them (not stopping, not between restarts).
  bool running() const { return !stopping_ && !waiting_restart_; }
  // The run ended before any worker was spawned (several hosts: a node never joined, the job does
  // not fit the world): the verdict is `exit_code` with `why`.
  void Fail(int exit_code, const std::string& why);
  // An agent: the coordinator stopped the job (or was lost); stop the workers (SIGTERM after the
  // notice, SIGKILL after the grace period). The cause is node 0's to name.
  void StopWorkers(const std::string& reason);
  // An agent, once every one of its workers is gone: node 0 restarted the job (--max_restarts) as
  // attempt `restart_count` (1, 2, ...); spawns this host's workers again as that attempt (incarnation
  // restart_count + 1, TORCHELASTIC_RESTART_COUNT=restart_count). A spawn failure is reported as at Start.
  void Relaunch(int64_t restart_count);

  // The run's verdict: the best-ranked incident (see Incident), else the interrupt, else success.
  int exit_code() const;
  std::string root_cause() const;  // empty on success
  std::vector<RankLedger> Ledger() const;
  absl::Time launch_time() const { return launch_; }

  int64_t incarnation() const { return incarnation_; }  // 1, then one more per restart
  int restarts() const { return restarts_; }

 private:
  struct Slot {
    int pid = 0;
    absl::Time spawned = absl::InfinitePast();
    bool exited = false;
    int exit_code = -1;
    int signal = 0;
  };

  // Something that went wrong. The first one stops the job; the root cause is chosen among those seen
  // before the workers are signalled, by kind, then by time: when rank 2 is killed, rank 0 may report
  // "rank 2 closed the connection" before rank 2's exit is reaped, and the crash must still be named.
  enum class Kind { kCrash = 0, kReportedFailure = 1, kHang = 2, kLaunch = 3 };
  struct Incident {
    Kind kind;
    absl::Time when;
    int exit_code;
    std::string text;
  };

  ProcessSpec SpecFor(int index) const;
  bool IsLocal(int rank) const;
  bool agent() const { return static_cast<bool>(options_.report_exit); }
  // A program job: its workers never register; their exits are all that is judged.
  bool program() const { return state_->job().program_size() > 0; }
  // `remote_error`: a remote rank's last error line as its agent read it; a local rank's is read here.
  void Judge(int rank, int exit_code, int signal, const std::string* remote_error = nullptr);
  void CheckLoss(bool at_end);
  void CheckRemote();
  bool ShouldRestart() const;
  void BeginRestart();
  void Record(Kind kind, int exit_code, std::string text);
  const Incident* RootIncident() const;
  void OnExit(const ProcessExit& e);
  void CheckReports();
  void CheckDeadlines();
  void BeginStop(const std::string& cause);
  void Escalate();
  std::string Describe(int rank) const;
  std::string Unregistered(const std::vector<WorkerState>& workers) const;

  CoordinatorState* const state_;
  ProcessSpawner* const spawner_;
  const SupervisorOptions options_;
  const std::function<absl::Time()> now_;
  const absl::Time launch_;
  std::vector<Slot> slots_;
  bool stopping_ = false;
  absl::Time stop_began_;
  bool sent_term_ = false;
  bool sent_kill_ = false;
  std::vector<Incident> incidents_;
  std::vector<bool> reported_;             // per rank: its Finish(ok=false) is among the incidents
  size_t steps_seen_ = 0;                  // step reports CheckLoss has read
  std::vector<int64_t> non_finite_;        // per rank: its last losses that were NaN or infinite, in a row
  std::vector<int64_t> first_non_finite_;  // per rank: the step that began that run of them
  std::vector<int64_t> finite_;            // per rank: its finite losses so far
  double last_loss_ = 0;                   // the last non-finite loss seen (NaN or an infinity)
  int interrupt_signal_ = 0;               // the first SIGINT/SIGTERM, when it came before any incident
  // Restarts (--max_restarts): every worker again, a newer incarnation, after a backoff.
  int restarts_ = 0;
  int64_t incarnation_ = 1;
  bool waiting_restart_ = false;
  bool restarts_prevented_ = false;
  bool node_lost_ = false;  // several hosts: an agent was lost (its ranks cannot start again)
  absl::Time restart_at_;
  absl::Time attempt_start_;  // this incarnation's launch (its registration deadline counts from it)
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_SUPERVISOR_H_
