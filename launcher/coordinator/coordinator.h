// The coordinator's state machine: registration and rank assignment, the write-once key-value store,
// barriers, heartbeats and progress, milestones, step reports and the end of each worker. It knows
// nothing of gRPC (coordinator_service.h adapts it); every call returns absl::Status with the codes
// that protos/coordinator.proto documents. Thread-safe. Waits (Register's wait for all, KeyValueGet,
// Barrier, WaitForStop) are callbacks, as in TSL's coordination service, so that a waiting RPC holds
// no thread; one timer thread ends those whose deadline passes.
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/coordinator/liveness.h"
#include "protos/coordinator.pb.h"
#include "protos/job.pb.h"

namespace stagehand {

// What the supervisor sees of one worker slot.
struct WorkerState {
  bool registered = false;
  int64_t incarnation = 0;
  int pid = 0;
  std::string host;
  DeviceInfo device;
  absl::Time registered_at = absl::InfinitePast();
  // Its Register call has returned the assignment. Until then it waits in that call (for the
  // others' registrations and profiles), alive, and sends no heartbeats: the registration deadline,
  // not the heartbeat timeout, bounds that wait.
  bool assigned = false;
  absl::Time last_heartbeat = absl::InfinitePast();  // coordinator clock; from the assignment on
  int64_t steps_done = 0;
  absl::Time last_progress = absl::InfinitePast();  // when steps_done last grew (or registration)
  std::map<int, absl::Time> milestones;             // Milestone -> worker clock time
  LayerProfile profile;                             // GPT jobs: the model's costs on its device
  GpuHealth health;                                 // GPU jobs: its GPU's pre-flight readings
  LoadClock load_clock;                             // GPU jobs with telemetry: its SM clock under load
  bool finished = false;
  bool ok = false;
  bool failed_before_stop = false;  // reported a failure while the job still ran: a candidate root cause
  std::string error;
  int failed_action = -1;  // the index of the action that failed in its schedule (-1: none or unknown)
};

// One host of a job of several (launcher --nodes=N). Node 0 is the coordinator's own launcher; nodes
// 1..N-1 are agents that join with RegisterAgent. Ranks are node-major: node 0's first.
struct NodeState {
  bool registered = false;
  int64_t incarnation = 0;
  std::string host;     // its host name, for messages (network namespaces share one: not an identity)
  std::string address;  // its address as the coordinator sees it (node 0: the address it serves on)
  std::string machine;  // its kernel's boot id ("" unknown): nodes on one machine share its cores
  int pid = 0;
  std::string device;  // "cpu" or "cuda"
  int workers = 0;
  std::vector<NodeGpu> gpus;
  int first_rank = 0;                                // once the world is fixed
  absl::Time last_heartbeat = absl::InfinitePast();  // coordinator clock
  bool lost = false;                                 // its agent's connection closed while its workers ran
  std::string lost_reason;
  // A program job: `-- PROGRAM ARGS` as typed on its command line (empty: a job of ours). An agent's
  // must equal node 0's; each node runs its own.
  std::vector<std::string> program;
};

// The workers of every registered node on `node`'s machine, its own among them (only its own when its
// machine is unknown): how many workers share that machine's cores.
int WorkersOnMachine(const std::vector<NodeState>& nodes, int node);

// An agent's worker that ended, as its agent reported it.
struct RemoteExit {
  int pid = 0;
  int exit_code = -1;
  int signal = 0;
  std::string spawn_error;  // not empty: it was never started, and why
  std::string last_error;   // its own last error line, as its agent read it from its log ("": none)
};

// kAgentHeartbeatInterval and kAgentTimeout: launcher/coordinator/liveness.h, with every other failure timing.

// How the model's pipeline layers are split into stages, decided once every worker has registered.
struct Partition {
  std::vector<int> layers_per_stage;    // per (virtual) stage of the schedule
  std::string description;              // for the log and the assignment
  std::vector<RankSchedule> schedules;  // per rank: the action list its Assignment ships
  // Data parallelism: per rank, the ranks that hold its stages, one per replica (empty: one replica).
  std::vector<std::vector<int>> replica_groups;
  double predicted_step_ms = 0;  // the simulated step (with the replicas' all-reduce), for the report
  std::string predicted_from;    // "profile" (the workers' measurement), "estimate" (the family's), "": none
  std::vector<double> predicted_rank_bubble;  // per rank, the simulated idle fraction
  // Per rank, from a measured profile (else empty): the simulated compute (forward + backward) per step,
  // and the SM clock under load the partition weighed the rank at (0: clock-blind).
  std::vector<double> predicted_compute_ms;
  std::vector<double> planned_sm_mhz;
};
// Given every worker's registration (profiles included); an error stops the job with its message.
using PartitionFn = std::function<absl::StatusOr<Partition>(const std::vector<WorkerState>&)>;
// Whether the registered workers may run the job (the GPU health gate, launcher/plan/health_gate.h); runs
// once, when the last worker registers, before the partition. An error stops the job with its message.
using AdmissionFn = std::function<absl::Status(const std::vector<WorkerState>&)>;

// Assignments list every rank as a peer (host, pid, device) in jobs of at most this many workers.
// Beyond it the lists would cost world_size^2 on the wire (1,000 workers: 50 MB, 10,000: 5 GB) and
// the list is left empty; ranks find each other through the key-value store, as the NCCL unique id and the
// CPU transport's addresses already do.
inline constexpr int kMaxListedPeers = 256;

// The topic of the waits that end when every worker has registered.
inline constexpr char kRegisteredTopic[] = "r";

class CoordinatorState {
 public:
  // Completions of the waits. Each runs exactly once, on the thread that ended the wait (the caller
  // itself when it can end at once, the caller of the call that ended it, or the timer thread), and
  // never under the state's lock, so it may call back into the state.
  using AssignmentCallback = std::function<void(absl::StatusOr<Assignment>)>;
  using ValueCallback = std::function<void(absl::StatusOr<std::string>)>;
  using StatusCallback = std::function<void(absl::Status)>;
  using StopCallback = std::function<void(absl::StatusOr<WaitForStopResponse>)>;
  using AgentCallback = std::function<void(absl::StatusOr<RegisterAgentResponse>)>;

  // `now` is the clock for heartbeats and progress (absl::Now in production, a fake in tests).
  // Deadlines of waits are always on the real clock.
  CoordinatorState(JobSpec job, std::string job_id, std::string secret, std::function<absl::Time()> now = absl::Now);
  ~CoordinatorState();  // ends pending waits as Shutdown() does
  CoordinatorState(const CoordinatorState&) = delete;
  CoordinatorState& operator=(const CoordinatorState&) = delete;

  // The job. Final from the start on one host; on several, once SetWorld has run (which writes it on
  // the caller's thread, so that thread may read it without the lock).
  const JobSpec& job() const { return job_; }
  const std::string& job_id() const { return job_id_; }
  const std::string& secret() const { return secret_; }  // handed to spawned workers, never logged

  // GPT jobs: decides the stages when the last worker registers. Set before serving.
  void SetPartitioner(PartitionFn fn) { partition_fn_ = std::move(fn); }
  // Decides whether the registered workers may run, before the partition. Set before serving.
  void SetAdmission(AdmissionFn fn) { admission_fn_ = std::move(fn); }

  // UNAUTHENTICATED unless `presented` equals the job secret (compared in constant time).
  absl::Status CheckSecret(absl::string_view presented) const;

  // Records the worker, then completes `done` once every slot has registered (or `deadline`, or the
  // job stops, or a newer incarnation replaces this one) with its Assignment. Rank = worker_index; a
  // re-registration with a newer incarnation replaces the slot.
  void RegisterAsync(const RegisterRequest& request, absl::Time deadline, AssignmentCallback done);
  // Write-once; `rank` and `incarnation` name the writer (stale writers are ABORTED).
  absl::Status KeyValueSet(int rank, int64_t incarnation, const std::string& key, const std::string& value);
  // Completes `done` with the key's value once it is set (or `deadline`, or the job stops).
  void KeyValueGetAsync(const std::string& key, absl::Time deadline, ValueCallback done);
  // Enters `rank` into the barrier; completes `done` once every rank has entered it.
  void BarrierAsync(const std::string& barrier_id, int rank, int64_t incarnation, absl::Time deadline,
                    StatusCallback done);
  // Completes `done` when the job stops, with the reason and its origin (TSL's PollForError).
  void WaitForStopAsync(int rank, int64_t incarnation, absl::Time deadline, StopCallback done);

  // Blocking forms of the waits for in-process callers and tests (the gRPC service uses the above).
  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Time deadline);
  absl::StatusOr<std::string> KeyValueGet(const std::string& key, absl::Time deadline);
  absl::Status Barrier(const std::string& barrier_id, int rank, int64_t incarnation, absl::Time deadline);

  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request);
  absl::Status ReportMilestone(const ReportMilestoneRequest& request);
  // A repeat of the same (rank, incarnation, step) is recorded once: retries are safe.
  absl::Status ReportStep(const ReportStepRequest& request);
  // A program job's step, which the launcher read from the rank's steps file (its ranks never
  // register, so no caller is checked); recorded as ReportStep records one, once per (rank,
  // incarnation, step).
  void RecordProgramStep(const ReportStepRequest& request);
  // SIGTERM with checkpoints on (job_run.h): from now on every step report is answered with a step
  // count T above any rank's steps done so far; each rank writes a checkpoint at the first step
  // boundary at or past T (the same one on every rank: none passed T without hearing it) and ends.
  // Returns T; a second call returns the first's T.
  int64_t RequestCheckpointAndStop();
  int64_t checkpoint_and_stop_at() const;  // 0 until requested
  // A SIGTERM or SIGHUP that reached another node's agent (AgentHeartbeatRequest.term_signal), for
  // node 0's launcher to act on as on its own (JobRun): the first one's signal and node, once.
  struct NodeSignal {
    int signal = 0;
    int node = 0;
  };
  std::optional<NodeSignal> TakeNodeSignal();
  absl::Status Finish(const FinishRequest& request);

  // Moves the job to stopping: waiters complete (WaitForStop with the reason and `origin`, the
  // others with CANCELLED), new registrations and writes fail with FAILED_PRECONDITION, heartbeats
  // answer stop=true with the reason. The first reason is kept.
  void Stop(const std::string& reason, const std::string& origin = "the launcher");
  bool stopping() const;
  // Ends a stopped incarnation of the job so that the next one runs on the same service (the
  // supervisor's restarts): every slot waits for a registration of a newer incarnation than any so
  // far, and the key-value store, barriers, partition and stop are cleared; the step reports stay
  // (keyed by incarnation). Several hosts: the agents' exits are forgotten (a late one of the stopped
  // attempt is ignored from now on), and `cause` (the root cause that made the restart) goes to the
  // agents with StartAttempt. FAILED_PRECONDITION unless the job is stopping.
  absl::Status Restart(const std::string& cause = "");
  std::optional<std::string> stop_reason() const;  // the first reason given to Stop()

  // For the server's shutdown, which must finish every call before it returns: completes every
  // pending wait with UNAVAILABLE, and later waits at once. The job's state stays readable.
  void Shutdown();

  // Snapshots for the supervisor and the reports.
  std::vector<WorkerState> Workers() const;
  std::vector<ReportStepRequest> Steps() const;  // every step once, in arrival order
  // The steps from the `from`-th on (arrival order): what arrived since a reader's last call, without
  // copying the whole history each time.
  std::vector<ReportStepRequest> StepsSince(size_t from) const;
  std::optional<Partition> partition() const;  // once planned

  // --- Several hosts (coordinator_nodes.cc). ---
  // Before serving: the job spans `nodes` nodes, this launcher being node 0 with `node0`'s workers.
  // The world (the job's worker count, hence its slots) is fixed by SetWorld once every agent has
  // registered; until then no worker can register.
  void ExpectNodes(int nodes, NodeState node0);
  int nodes() const;  // 1 unless ExpectNodes said more
  std::vector<NodeState> Nodes() const;
  bool AllNodesRegistered() const;
  bool world_fixed() const;
  // The final job, its `workers` the sum over the nodes, from node 0's launcher once every node
  // registered: gives each node its first rank (node-major) and completes the agents' RegisterAgent.
  // A program job: `store_host` and `store_port` are its c10d store's, which the agents' answers carry.
  void SetWorld(JobSpec job, const std::string& store_host = "", int store_port = 0);
  // RegisterAgent (protos/coordinator.proto): records the node, then completes `done` once the world
  // is fixed (or `deadline`, or the job stops). `peer_address` is the agent's address as seen here.
  void RegisterAgentAsync(const RegisterAgentRequest& request, const std::string& peer_address, absl::Time deadline,
                          AgentCallback done);
  absl::StatusOr<AgentHeartbeatResponse> AgentHeartbeat(const AgentHeartbeatRequest& request);
  // A repeat of the same rank's exit is recorded once.
  absl::Status ReportWorkerExit(const ReportWorkerExitRequest& request);
  // WaitForStop of an agent: completes when the job stops.
  // `restart_count`: the attempt the agent's workers run. `until_restart` (its workers stopped with
  // the job, which has restarts left): completes when StartAttempt announces a later attempt (with it,
  // the restart's cause and the c10d store), not at the stop; UNAVAILABLE at Shutdown (no restart).
  // A wait of an attempt older than the announced one completes at once with the announced one.
  void AgentWaitForStopAsync(int node, int64_t incarnation, int64_t restart_count, bool until_restart,
                             absl::Time deadline, StopCallback done);
  // Node 0 runs the attempt Restart() made (its own workers are spawned): the agents' waits complete
  // with it, so every node starts its ranks again together. Returns the attempt (0 first).
  int64_t StartAttempt();
  int64_t attempt() const;  // Restart()s so far: the attempt the exits and steps belong to
  // A program job's c10d store from now on (a new one for every attempt), for StartAttempt's answers.
  void SetProgramStore(const std::string& host, int port);
  // The agent's long poll was cancelled (its connection closed: the agent died, or its host did):
  // the node is lost unless every one of its workers already ended. The wait for the stop of an
  // attempt restarted since (the agent replaced it with its wait for the next) is no loss.
  void AgentDisconnected(int node, int64_t incarnation, int64_t restart_count = 0, bool until_restart = false);
  std::map<int, RemoteExit> RemoteExits() const;  // rank -> exit, as the agents reported them
  int NodeOfRank(int rank) const;                 // 0 on a job of one host

  // For tests: true once at least `count` waits are pending (false if `deadline` passes first), so
  // that a test knows its calls are waiting without sleeping.
  bool AwaitPendingWaits(int count, absl::Time deadline) const;

 private:
  // A pending wait. `poll` runs under mu_ after a change that may end the wait and once `deadline`
  // passes (`expired`); it returns the completion to run outside the lock, or nullptr to keep
  // waiting. Changes poll only the waits they can end, so that N workers cost O(N log N), not O(N^2):
  // the waits on `topic` (every registration, one key, one barrier), the waits of `rank` when the
  // rank re-registers (a stale waiter), and every wait on Stop and Shutdown.
  using Completion = std::function<void()>;
  struct Wait {
    absl::Time deadline;
    std::string topic;  // kRegisteredTopic, "k" + key, "b" + barrier id, or "" (WaitForStop)
    int rank = -1;      // the waiting rank (-1: a key-value read, which no rank owns)
    std::function<Completion(bool expired)> poll;
  };
  using WaitId = int64_t;  // in arrival order
  struct BarrierArrivals {
    std::vector<bool> arrived;  // per rank
    int count = 0;              // of true in `arrived`
  };
  // Completions to run once mu_ is released: declared before the MutexLock in a scope, it runs them
  // after the lock's destructor has unlocked.
  class Completions {
   public:
    ~Completions() {
      for (Completion& c : ready_) c();
    }
    void Add(Completion c) { ready_.push_back(std::move(c)); }

   private:
    std::vector<Completion> ready_;
  };

  absl::Status CheckRank(int rank) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Rank in range, registered, and not of an older incarnation than the slot's.
  absl::Status CheckCaller(int rank, int64_t incarnation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status StaleError(int rank, int64_t incarnation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status StoppingError() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Register's steps: fill (or replace, or confirm) the slot; then a wait whose poll answers.
  absl::Status RecordRegistration(const RegisterRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::StatusOr<Assignment>> RegistrationResult(int rank, int64_t incarnation, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::Status> BarrierResult(const std::string& barrier_id, int rank, int64_t incarnation, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Assignment BuildAssignment(int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StopLocked(const std::string& reason, const std::string& origin) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Partitioned() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Admitted() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Several hosts: node in range, registered, not of an older incarnation.
  absl::Status CheckNode(int node, int64_t incarnation) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status RecordAgent(const RegisterAgentRequest& request, const std::string& peer_address)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<absl::StatusOr<RegisterAgentResponse>> AgentResult(int node, int64_t incarnation, bool expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool NodeDoneLocked(const NodeState& node) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Polls `wait` at once; keeps it if it is not over.
  void AddWaitLocked(Wait wait, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls every pending wait, again while a pass ends some (one ending may stop the job).
  void PollWaitsLocked(Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the waits on `topic`, or of `rank`; then every wait if one of them stopped the job.
  void PollTopicLocked(const std::string& topic, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollRankLocked(int rank, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PollSomeLocked(const std::vector<WaitId>& ids, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Polls the waits `ids` that are still pending; returns how many ended.
  int PollIdsLocked(const std::vector<WaitId>& ids, Completions& done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveWaitLocked(std::map<WaitId, Wait>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TimerLoop();

  JobSpec job_;  // written by SetWorld only (under mu_), before any worker exists
  const std::string job_id_;
  const std::string secret_;
  const std::function<absl::Time()> now_;
  PartitionFn partition_fn_;
  AdmissionFn admission_fn_;

  mutable absl::Mutex mu_;
  std::vector<WorkerState> workers_ ABSL_GUARDED_BY(mu_);
  int registered_count_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t min_incarnation_ ABSL_GUARDED_BY(mu_) = 0;  // after a Restart: older ones are stale
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, BarrierArrivals> barriers_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportStepRequest> steps_ ABSL_GUARDED_BY(mu_);
  int64_t checkpoint_and_stop_at_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<NodeSignal> node_signal_ ABSL_GUARDED_BY(mu_);                  // not yet taken
  bool node_signal_seen_ ABSL_GUARDED_BY(mu_) = false;                          // only the first is passed on
  std::set<std::tuple<int, int64_t, int64_t>> step_keys_ ABSL_GUARDED_BY(mu_);  // rank, inc., step
  std::optional<std::string> stop_reason_ ABSL_GUARDED_BY(mu_);
  std::string stop_origin_ ABSL_GUARDED_BY(mu_);
  std::optional<Partition> partition_ ABSL_GUARDED_BY(mu_);
  bool admitted_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<NodeState> nodes_ ABSL_GUARDED_BY(mu_);  // empty: a job of one host
  bool world_fixed_ ABSL_GUARDED_BY(mu_) = true;       // false between ExpectNodes(N > 1) and SetWorld
  std::map<int, RemoteExit> remote_exits_ ABSL_GUARDED_BY(mu_);
  int64_t attempt_ ABSL_GUARDED_BY(mu_) = 0;            // Restart()s so far
  int64_t announced_attempt_ ABSL_GUARDED_BY(mu_) = 0;  // StartAttempt's: what agents' waits answer
  std::string restart_cause_ ABSL_GUARDED_BY(mu_);      // Restart()'s cause, for the agents
  void RecordProgramStepLocked(const ReportStepRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string store_host_ ABSL_GUARDED_BY(mu_);  // a program job's c10d store (SetWorld)
  int store_port_ ABSL_GUARDED_BY(mu_) = 0;
  // What every rank's Assignment has in common (job, world, peers), built once per world: copying
  // it is cheaper than building N of them. Reset when a registration changes the world.
  std::optional<Assignment> common_assignment_ ABSL_GUARDED_BY(mu_);
  std::map<WaitId, Wait> waits_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<std::string, std::set<WaitId>> topic_waits_ ABSL_GUARDED_BY(mu_);
  std::unordered_map<int, std::set<WaitId>> rank_waits_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<absl::Time, WaitId>> deadlines_ ABSL_GUARDED_BY(mu_);
  WaitId next_wait_id_ ABSL_GUARDED_BY(mu_) = 0;
  // The deadline the timer sleeps until; a new wait with an earlier one wakes it through timer_cv_
  // (a CondVar, not an absl::Condition on mu_: that would be evaluated on every unlock of mu_).
  absl::Time timer_next_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::CondVar timer_cv_;
  bool stop_unpolled_ ABSL_GUARDED_BY(mu_) = false;  // stopped since the last poll of every wait
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  bool timer_exit_ ABSL_GUARDED_BY(mu_) = false;
  std::thread timer_;  // last: starts once the members above exist
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_COORDINATOR_H_
