// CoordinatorState's part for jobs of several hosts (see coordinator.h, "Several hosts"): the agents'
// registration, heartbeats, worker exits and long polls. Kept apart from coordinator.cc so that the
// single-host paths do not carry them; it uses the same waits (a poll under mu_, completions outside).
#include <signal.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "launcher/coordinator/coordinator.h"

namespace stagehand {
namespace {

absl::Status ShuttingDownError() { return absl::UnavailableError("the coordinator is shutting down: the job is over"); }

// "-- python3 train.py" for a program, "no program (a job of ours)" for none.
std::string ProgramText(const std::vector<std::string>& program) {
  return program.empty() ? "no program (a job of ours)" : absl::StrCat("-- ", absl::StrJoin(program, " "));
}

// An agent's program against node 0's: each node runs its own command line's, so they must be the same.
absl::Status CheckProgram(int node, const std::vector<std::string>& agent, const std::vector<std::string>& node0) {
  if (agent == node0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("node ", node, " runs ", ProgramText(agent), " but node 0 runs ",
                                                 ProgramText(node0),
                                                 ": give every node the same -- PROGRAM ARGS (or none)"));
}

}  // namespace

int WorkersOnMachine(const std::vector<NodeState>& nodes, int node) {
  const NodeState& self = nodes[node];
  if (self.machine.empty()) return self.workers;
  int workers = 0;
  for (const NodeState& n : nodes) {
    if (n.registered && n.machine == self.machine) workers += n.workers;
  }
  return std::max(workers, self.workers);
}

void CoordinatorState::ExpectNodes(int nodes, NodeState node0) {
  absl::MutexLock lock(&mu_);
  if (nodes <= 1) return;
  nodes_.assign(nodes, NodeState());
  node0.registered = true;
  node0.first_rank = 0;
  nodes_[0] = std::move(node0);
  world_fixed_ = false;
  workers_.clear();  // sized by SetWorld, once every node has said how many workers it has
}

int CoordinatorState::nodes() const {
  absl::ReaderMutexLock lock(&mu_);
  return std::max<int>(1, nodes_.size());
}

std::vector<NodeState> CoordinatorState::Nodes() const {
  absl::ReaderMutexLock lock(&mu_);
  return nodes_;
}

bool CoordinatorState::AllNodesRegistered() const {
  absl::ReaderMutexLock lock(&mu_);
  return std::all_of(nodes_.begin(), nodes_.end(), [](const NodeState& n) { return n.registered; });
}

bool CoordinatorState::world_fixed() const {
  absl::ReaderMutexLock lock(&mu_);
  return world_fixed_;
}

void CoordinatorState::SetWorld(JobSpec job, const std::string& store_host, int store_port) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  store_host_ = store_host;
  store_port_ = store_port;
  int rank = 0;
  for (NodeState& n : nodes_) {
    n.first_rank = rank;
    rank += n.workers;
    n.last_heartbeat = now_();  // the agents' timeout counts from here, not from their registration
  }
  job.set_workers(rank);
  job_ = std::move(job);
  workers_.assign(rank, WorkerState());
  world_fixed_ = true;
  LOG(INFO) << "job " << job_id_ << ": " << rank << " workers on " << nodes_.size() << " nodes";
  PollWaitsLocked(completions);
}

absl::Status CoordinatorState::CheckNode(int node, int64_t incarnation) const {
  const int nodes = static_cast<int>(nodes_.size());
  if (node < 1 || node >= nodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("node_rank ", node, " is out of range: job \"", job_id_, "\" has ", std::max(nodes, 1), " node",
                     nodes > 1 ? absl::StrCat("s (agents are node ranks 1 to ", nodes - 1, ")")
                               : " (it was not started with --nodes)"));
  }
  const NodeState& n = nodes_[node];
  if (!n.registered) {
    return absl::FailedPreconditionError(absl::StrCat("node ", node, " has not registered; RegisterAgent first"));
  }
  if (incarnation != n.incarnation) {
    return absl::AbortedError(absl::StrCat("node ", node, " incarnation ", incarnation, " is not the registered one (",
                                           n.incarnation, "): this agent was replaced; stop its workers and exit"));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::RecordAgent(const RegisterAgentRequest& request, const std::string& peer_address) {
  const int node = request.node_rank();
  const int nodes = static_cast<int>(nodes_.size());
  if (nodes <= 1) {
    return absl::FailedPreconditionError(
        "this coordinator runs a job of one host; start node 0 with --nodes=N for agents to join");
  }
  if (node < 1 || node >= nodes) {
    return absl::InvalidArgumentError(absl::StrCat("--node_rank=", node, " is out of range: the job has ", nodes,
                                                   " nodes; agents are --node_rank=1 to ", nodes - 1));
  }
  if (request.workers() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("node ", node, " offers no workers; pass --workers or --gpus"));
  }
  if (request.device() != job_.device()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "node ", node, " offers ", request.device() == "cuda" ? "GPU" : "CPU", " workers but the job runs on ",
        job_.device() == "cuda" ? "GPUs" : "CPU workers", " (node 0's choice); pass the same --device on every node"));
  }
  NodeState& n = nodes_[node];
  if (n.registered) {
    if (request.incarnation() < n.incarnation) {
      return absl::AbortedError(absl::StrCat("node ", node, " incarnation ", request.incarnation(),
                                             " is older than the registered ", n.incarnation, ": this agent is stale"));
    }
    if (request.incarnation() == n.incarnation) {
      if (request.pid() == n.pid && peer_address == n.address) return absl::OkStatus();  // a retry
      return absl::AlreadyExistsError(absl::StrCat("node ", node, " is already registered by pid ", n.pid, " at ",
                                                   n.address, "; is another agent running with --node_rank=", node,
                                                   "?"));
    }
  }
  if (world_fixed_) {
    return absl::FailedPreconditionError(
        absl::StrCat("node ", node, " joined after the job started; a restarted agent cannot rejoin a running job"));
  }
  if (stop_reason_) return StoppingError();
  const std::vector<std::string> program(request.program().begin(), request.program().end());
  if (absl::Status s = CheckProgram(node, program, nodes_[0].program); !s.ok()) {
    StopLocked(std::string(s.message()), absl::StrCat("node ", node));  // the job cannot run: every node stops
    return s;
  }
  n = NodeState();
  n.registered = true;
  n.incarnation = request.incarnation();
  n.host = request.host();
  n.address = peer_address;
  n.machine = request.machine();
  n.pid = request.pid();
  n.device = request.device();
  n.workers = request.workers();
  n.gpus.assign(request.gpus().begin(), request.gpus().end());
  n.program = program;
  n.last_heartbeat = now_();
  LOG(INFO) << "node " << node << " joined: " << n.workers << " " << n.device << " workers at " << peer_address
            << " (host " << n.host << ", pid " << n.pid << ")";
  return absl::OkStatus();
}

std::optional<absl::StatusOr<RegisterAgentResponse>> CoordinatorState::AgentResult(int node, int64_t incarnation,
                                                                                   bool expired) {
  const NodeState& n = nodes_[node];
  if (n.incarnation != incarnation) {
    return absl::AbortedError(absl::StrCat("node ", node, " was replaced by incarnation ", n.incarnation, "; exit"));
  }
  if (stop_reason_) {
    return absl::FailedPreconditionError(absl::StrCat("the job stopped before it started: ", *stop_reason_));
  }
  if (world_fixed_) {
    RegisterAgentResponse r;
    r.set_job_id(job_id_);
    *r.mutable_job() = job_;
    r.set_first_rank(n.first_rank);
    r.set_secret(secret_);
    r.set_address(n.address);
    r.set_workers_on_machine(WorkersOnMachine(nodes_, node));
    r.set_store_host(store_host_);
    r.set_store_port(store_port_);
    return r;
  }
  if (shut_down_) return ShuttingDownError();
  if (!expired) return std::nullopt;
  std::vector<int> missing;
  for (int i = 1; i < static_cast<int>(nodes_.size()); ++i) {
    if (!nodes_[i].registered) missing.push_back(i);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("not every node joined before the deadline; missing node ranks ", absl::StrJoin(missing, ", ")));
}

void CoordinatorState::RegisterAgentAsync(const RegisterAgentRequest& request, const std::string& peer_address,
                                          absl::Time deadline, AgentCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = RecordAgent(request, peer_address); !s.ok()) {
    completions.Add([done, s] { done(s); });
    PollWaitsLocked(completions);  // a refusal may have stopped the job: the other agents' waits end
    return;
  }
  const int node = request.node_rank();
  const int64_t incarnation = request.incarnation();
  AddWaitLocked({deadline, "", -1,  // an agent's wait: Stop, SetWorld and agents' registrations poll all
                 [this, node, incarnation, done](bool expired) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> Completion {
                   std::optional<absl::StatusOr<RegisterAgentResponse>> r = AgentResult(node, incarnation, expired);
                   if (!r) return nullptr;
                   return [done, r = *std::move(r)]() mutable { done(std::move(r)); };
                 }},
                completions);
  PollWaitsLocked(completions);  // a replaced incarnation's wait ends now
}

absl::StatusOr<AgentHeartbeatResponse> CoordinatorState::AgentHeartbeat(const AgentHeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNode(request.node_rank(), request.incarnation()); !s.ok()) return s;
  nodes_[request.node_rank()].last_heartbeat = now_();
  const int sig = request.term_signal();
  if ((sig == SIGTERM || sig == SIGHUP) && !node_signal_seen_) {
    node_signal_seen_ = true;
    node_signal_ = NodeSignal{sig, request.node_rank()};
    LOG(INFO) << "node " << request.node_rank() << " got signal " << sig;
  }
  // A program job's steps of this node's ranks, from their steps files on the agent's host.
  const NodeState& n = nodes_[request.node_rank()];
  for (const ReportStepRequest& step : request.steps()) {
    if (world_fixed_ && step.rank() >= n.first_rank && step.rank() < n.first_rank + n.workers)
      RecordProgramStepLocked(step);
  }
  AgentHeartbeatResponse response;
  response.set_stop(stop_reason_.has_value());
  if (stop_reason_) response.set_stop_reason(*stop_reason_);
  response.set_checkpoint_and_stop_at(checkpoint_and_stop_at_);
  return response;
}

std::optional<CoordinatorState::NodeSignal> CoordinatorState::TakeNodeSignal() {
  absl::MutexLock lock(&mu_);
  return std::exchange(node_signal_, std::nullopt);
}

absl::Status CoordinatorState::ReportWorkerExit(const ReportWorkerExitRequest& request) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNode(request.node_rank(), request.incarnation()); !s.ok()) return s;
  NodeState& n = nodes_[request.node_rank()];
  if (!world_fixed_ || request.rank() < n.first_rank || request.rank() >= n.first_rank + n.workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " is not one of node ", request.node_rank(), "'s ranks"));
  }
  n.last_heartbeat = now_();                                        // a report is a sign of life too
  if (request.restart_count() < attempt_) return absl::OkStatus();  // of an attempt that was restarted since
  RemoteExit e;
  e.pid = request.pid();
  e.exit_code = request.exit_code();
  e.signal = request.signal();
  e.spawn_error = request.spawn_error();
  e.last_error = request.last_error().substr(0, 1024);  // one line is what the agent sends; bounded here too
  if (remote_exits_.emplace(request.rank(), e).second) {
    LOG(INFO) << "rank " << request.rank() << " (node " << request.node_rank() << ", pid " << e.pid << ") ended: "
              << (!e.spawn_error.empty() ? absl::StrCat("could not be started: ", e.spawn_error)
                  : e.signal != 0        ? absl::StrCat("signal ", e.signal)
                                         : absl::StrCat("exit code ", e.exit_code));
  }
  return absl::OkStatus();
}

void CoordinatorState::AgentWaitForStopAsync(int node, int64_t incarnation, int64_t restart_count, bool until_restart,
                                             absl::Time deadline, StopCallback done) {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckNode(node, incarnation); !s.ok()) {
    completions.Add([done, s] { done(s); });
    return;
  }
  auto poll = [this, node, incarnation, restart_count, until_restart](bool expired)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> std::optional<absl::StatusOr<WaitForStopResponse>> {
    if (nodes_[node].incarnation != incarnation) return absl::AbortedError("this agent was replaced; exit");
    if (announced_attempt_ > restart_count) {  // node 0 runs a later attempt: this node's ranks join it
      WaitForStopResponse response;
      response.set_restart_count(announced_attempt_);
      response.set_reason(restart_cause_);
      response.set_origin("the coordinator");
      response.set_store_host(store_host_);
      response.set_store_port(store_port_);
      return response;
    }
    if (stop_reason_ && !until_restart) {
      WaitForStopResponse response;
      response.set_reason(*stop_reason_);
      response.set_origin(stop_origin_);
      return response;
    }
    if (shut_down_) return ShuttingDownError();
    if (!expired) return std::nullopt;
    return absl::DeadlineExceededError("the job did not stop before this call's deadline; call WaitForStop again");
  };
  AddWaitLocked({deadline, "", -1,  // an agent's wait: Stop, SetWorld and agents' registrations poll all
                 [poll, done](bool expired) -> Completion {
                   auto r = poll(expired);
                   if (!r) return nullptr;
                   return [done, r = *std::move(r)]() mutable { done(std::move(r)); };
                 }},
                completions);
}

bool CoordinatorState::NodeDoneLocked(const NodeState& node) const {
  if (!world_fixed_) return false;
  for (int r = node.first_rank; r < node.first_rank + node.workers; ++r) {
    if (!remote_exits_.count(r)) return false;
  }
  return true;
}

void CoordinatorState::AgentDisconnected(int node, int64_t incarnation, int64_t restart_count, bool until_restart) {
  absl::MutexLock lock(&mu_);
  if (node < 1 || node >= static_cast<int>(nodes_.size())) return;
  if (!until_restart && restart_count < attempt_) return;
  NodeState& n = nodes_[node];
  if (!n.registered || n.incarnation != incarnation || n.lost || NodeDoneLocked(n)) return;
  n.lost = true;
  n.lost_reason = "its agent's connection to the coordinator closed (the agent died, or its host did)";
  LOG(INFO) << "node " << node << " at " << n.address << ": " << n.lost_reason;
}

int64_t CoordinatorState::StartAttempt() {
  Completions completions;  // before the lock: runs once it is released
  absl::MutexLock lock(&mu_);
  if (announced_attempt_ == attempt_) return attempt_;
  announced_attempt_ = attempt_;
  if (nodes_.empty()) return attempt_;  // one host: no agent waits for it
  for (NodeState& n : nodes_) n.last_heartbeat = std::max(n.last_heartbeat, now_());
  LOG(INFO) << "job " << job_id_ << ": attempt " << attempt_ << " starts on every node";
  PollWaitsLocked(completions);
  return attempt_;
}

int64_t CoordinatorState::attempt() const {
  absl::ReaderMutexLock lock(&mu_);
  return attempt_;
}

void CoordinatorState::SetProgramStore(const std::string& host, int port) {
  absl::MutexLock lock(&mu_);
  store_host_ = host;
  store_port_ = port;
}

std::map<int, RemoteExit> CoordinatorState::RemoteExits() const {
  absl::ReaderMutexLock lock(&mu_);
  return remote_exits_;
}

int CoordinatorState::NodeOfRank(int rank) const {
  absl::ReaderMutexLock lock(&mu_);
  for (int i = static_cast<int>(nodes_.size()) - 1; i >= 0; --i) {
    if (rank >= nodes_[i].first_rank && nodes_[i].workers > 0) return i;
  }
  return 0;
}

}  // namespace stagehand
