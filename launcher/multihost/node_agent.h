// The agent of a job across several hosts (launcher --nodes=N --node_rank=K, K > 0): joins node 0's
// coordinator with this host's workers, spawns and supervises them (a Supervisor in agent mode: it
// reports each exit, node 0 judges), heartbeats, and stops its workers (SIGTERM, SIGKILL after the
// grace period) as soon as the coordinator pushes the job's stop or cannot be reached for
// kAgentTimeout. Driven by Tick(); no threads of its own but the client's, so unit tests drive it with
// a fake client, a fake spawner and a fake clock.
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_NODE_AGENT_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_NODE_AGENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/multihost/agent_client.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/plan/devices.h"
#include "launcher/multihost/nodes.h"
#include "launcher/supervise/process.h"
#include "launcher/supervise/program_gpus.h"
#include "launcher/supervise/supervisor.h"

namespace stagehand {

struct NodeAgentOptions {
  NodeOptions node;
  std::string device;         // this host's: "cpu" or "cuda"
  int workers = 0;            // this host's
  std::vector<GpuInfo> gpus;  // for "cuda": one per worker
  std::string worker_binary;
  NodeTls tls;              // given to the workers (the coordinator's hop needs it)
  int64_t incarnation = 1;  // higher on every start of the agent (the launcher uses the clock)
  std::string host;         // this host's name, for messages
  std::string machine;      // this machine's identity (common/host.h MachineId)
  int cores = 0;            // this machine's cores, shared among its workers (0: as the system says)
  int pid = 0;
  absl::Duration register_timeout = absl::Minutes(2);
  absl::Time launch = absl::InfinitePast();
  // A program job: this host's own `-- PROGRAM ARGS`, as typed (node 0 compares them with its own)
  // and as resolved here (what this host's ranks run, in program_cwd). Never a command from the network.
  std::vector<std::string> program, program_resolved;
  std::string program_cwd;
  // Where the agent's own lines go (a restart, the wait for one), one line each; empty: stdout.
  std::function<void(const std::string& line)> out;
};

class NodeAgent {
 public:
  NodeAgent(AgentClient* client, ProcessSpawner* spawner, NodeAgentOptions options,
            std::function<absl::Time()> now = absl::Now);
  ~NodeAgent();  // ends the long poll
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Joins the job: blocks until every node has joined and node 0 fixed the world (or the timeout).
  // The error is the coordinator's, with what to check.
  absl::Status Join();
  const RegisterAgentResponse& joined() const { return joined_; }
  // A program job on GPUs: this host's readings of its ranks' GPUs (the health gate passed, a sampler
  // per rank, program_gpus.h), whose per-step telemetry joins each step the agent sends to node 0, as
  // node 0's launcher does for its own ranks. After Join, before Start.
  void SetProgramGpus(std::unique_ptr<ProgramGpus> gpus) { program_gpus_ = std::move(gpus); }
  // Spawns this host's workers (after Join), their logs in `run_dir`, and starts the long poll.
  void Start(const std::string& run_dir);
  // One pass: the stop pushed, a heartbeat when due, exits reported, the supervisor; a program job's
  // new steps (its ranks' steps files) go to node 0 with the heartbeats. True once every worker of
  // this host is gone and its exit reported (or the coordinator is lost). A job with restarts left
  // (--max_restarts) that node 0 stopped waits, its workers gone, for node 0's next attempt and starts
  // them again with it (TORCHELASTIC_RESTART_COUNT counting up); node 0 done without one ends the wait.
  bool Tick();
  // SIGINT or SIGTERM to the agent: stops this host's workers (a second: kills them at once).
  void Interrupt(int signal, bool force);
  // The first SIGTERM or SIGHUP of a job that writes checkpoints (WritesTermCheckpoints): passed on
  // to node 0 with the next heartbeat (at once), which has every rank write a checkpoint at the same
  // next step and stop, as for its own signal; this host's workers are left to do so. False (nothing
  // done) for any other job or once the workers are stopping: the caller interrupts instead.
  bool ForwardTerm(int signal);

  int exit_code() const;
  std::string verdict() const;                              // the closing line, naming this node
  int64_t restart_count() const { return restart_count_; }  // the attempt this host's workers run
  std::string name() const { return Name(); }               // "node K at ADDRESS"

 private:
  void OnStop(const std::string& reason);
  void Beat(absl::Time now);
  void FlushExits();
  void ReadSteps();
  // The long poll: for the stop of the attempt running, or (`until_restart`) for node 0's next one.
  void StartWait(bool until_restart);
  // Once this host's workers are gone after node 0's stop: whether node 0 may start another attempt.
  bool MayRestart() const;
  // Tick while waiting for node 0's next attempt; true once the wait is over without one.
  bool AwaitRestart(std::optional<absl::StatusOr<WaitForStopResponse>> pushed);
  void Relaunch(const WaitForStopResponse& restart);
  void Print(const std::string& line) const;
  // After a checkpoint-and-stop, once this host's workers are gone: true when the wait for rank 0's
  // manifest is over (found, node 0 gone, or the timeout), false to wait on.
  bool TermCheckpointSettled(absl::Time now);
  std::string Name() const;

  AgentClient* const client_;
  ProcessSpawner* const spawner_;
  const NodeAgentOptions options_;
  const std::function<absl::Time()> now_;
  RegisterAgentResponse joined_;
  std::unique_ptr<CoordinatorState> view_;  // the job as this agent knows it (never served)
  std::unique_ptr<Supervisor> supervisor_;
  absl::Time last_beat_ = absl::InfinitePast();
  absl::Time last_answer_ = absl::InfinitePast();
  std::vector<ReportWorkerExitRequest> unreported_;
  std::vector<ReportWorkerExitRequest> exits_;  // every local exit, for the verdict
  std::optional<std::string> stop_reason_;
  std::optional<std::string> lost_;
  int interrupt_signal_ = 0;
  bool workers_gone_ = false;
  int forward_signal_ = 0;         // ForwardTerm's, until a heartbeat carried it
  int forwarded_signal_ = 0;       // the one passed on (0: none)
  int64_t term_at_ = 0;            // node 0's checkpoint-and-stop step (heartbeat answers; 0: none)
  int64_t term_step_ = 0;          // the complete checkpoint it wrote (0: none seen)
  bool term_final_ = false;        // that checkpoint is the last step's: the run ended, no stop
  bool coordinator_gone_ = false;  // the long poll ended: node 0 stopped serving
  absl::Time term_wait_until_ = absl::InfiniteFuture();
  int64_t restart_count_ = 0;      // the attempt this host's workers run (node 0's restarts)
  bool awaiting_restart_ = false;  // the workers stopped with the job: waiting for node 0's next attempt
  std::string store_host_;         // a program job: this attempt's c10d store
  int store_port_ = 0;
  std::string run_dir_;
  std::unique_ptr<ProgramStepsReader> steps_;  // a program job: its ranks' steps files
  std::vector<ReportStepRequest> unsent_steps_;
  std::unique_ptr<ProgramGpus> program_gpus_;  // by local rank; null: no telemetry here

  absl::Mutex mu_;  // the long poll's answer comes on the client's thread
  std::optional<absl::StatusOr<WaitForStopResponse>> pushed_ ABSL_GUARDED_BY(mu_);
};

// `launcher --nodes=N --node_rank=K` (K > 0): the whole agent, from joining to the closing line.
// Returns its exit code: 0 when its workers succeeded, 1 when the job failed or the coordinator was
// lost, 2 bad flags (nothing started), 4 it could not join or start its workers, 75 its workers
// stopped after a checkpoint that a SIGTERM asked for (this host's or another's), 130/143 interrupted.
struct AgentLaunch {
  NodeOptions node;
  NodeTls tls;
  std::string job_token_file;
  std::string run_dir;  // "" for runs/<time>-node<K>-<job id>/
  bool overwrite = false;
  std::string worker_binary;  // "" to find it beside the launcher
  std::string device;         // --device ("" or "auto": GPUs if visible)
  std::optional<int> gpus, workers;
  std::optional<int64_t> register_timeout_ms;
  absl::Time launch = absl::Now();
  std::vector<std::string> program;  // `-- PROGRAM ARGS` as typed; empty: a job of ours
};
int RunAgent(const AgentLaunch& launch);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_NODE_AGENT_H_
