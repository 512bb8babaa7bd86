// The agent of a job across several hosts (see node_agent.h).
#include "launcher/multihost/node_agent.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/host.h"
#include "launcher/job/job.h"
#include "launcher/job/run_dir.h"
#include "launcher/job/worker_binary.h"

namespace stagehand {
namespace {

// A heartbeat or a report that cannot get through in this time counts as missed: Tick must go on.
constexpr absl::Duration kCallTimeout = kAgentCallTimeout;

std::string Message(const absl::Status& s) { return std::string(s.message()); }

}  // namespace

NodeAgent::NodeAgent(AgentClient* client, ProcessSpawner* spawner, NodeAgentOptions options,
                     std::function<absl::Time()> now)
    : client_(client), spawner_(spawner), options_(std::move(options)), now_(std::move(now)) {}

NodeAgent::~NodeAgent() { client_->CancelWaitForStop(); }

std::string NodeAgent::Name() const {
  return absl::StrCat("node ", options_.node.node_rank, joined_.address().empty() ? "" : " at ", joined_.address());
}

absl::Status NodeAgent::Join() {
  RegisterAgentRequest r;
  r.set_node_rank(options_.node.node_rank);
  r.set_incarnation(options_.incarnation);
  r.set_host(options_.host);
  r.set_pid(options_.pid);
  r.set_device(options_.device);
  r.set_workers(options_.workers);
  r.set_machine(options_.machine);
  for (const std::string& arg : options_.program) r.add_program(arg);
  for (const GpuInfo& g : options_.gpus) {
    NodeGpu* gpu = r.add_gpus();
    gpu->set_uuid(g.uuid);
    gpu->set_name(g.name);
    gpu->set_memory_bytes(g.total_bytes);
  }
  absl::StatusOr<RegisterAgentResponse> joined = client_->RegisterAgent(r, options_.register_timeout);
  if (!joined.ok()) return joined.status();
  // Node 0 compares the programs; one that did not (an older coordinator) is refused here.
  if ((joined->job().program_size() > 0) != !options_.program.empty() ||
      (!options_.program.empty() && joined->store_port() == 0)) {
    return absl::InvalidArgumentError(
        options_.program.empty() ? "node 0 runs a program: give every node the same -- PROGRAM ARGS"
                                 : "node 0 runs no program, or names no c10d store for one: give every node the "
                                   "same -- PROGRAM ARGS (or none)");
  }
  joined_ = *std::move(joined);
  client_->SetSecret(joined_.secret());
  return absl::OkStatus();
}

void NodeAgent::Start(const std::string& run_dir) {
  JobSpec job = joined_.job();
  if (!options_.program.empty()) {  // this host's own program, never the one node 0 named
    job.clear_program();
    for (const std::string& arg : options_.program_resolved) job.add_program(arg);
    job.set_program_cwd(options_.program_cwd);
  }
  view_ = std::make_unique<CoordinatorState>(job, joined_.job_id(), joined_.secret(), now_);
  SupervisorOptions so;
  so.worker_binary = options_.worker_binary;
  so.coordinator_address = options_.node.coordinator_address;
  so.run_dir = run_dir;
  // Other nodes' workers on this machine (loopback, network namespaces) share its cores with ours.
  so.env = WorkerEnvironment(std::max(options_.workers, joined_.workers_on_machine()), options_.cores);
  so.gpus = options_.gpus;
  so.launch = options_.launch;
  so.first_rank = joined_.first_rank();
  so.local_workers = options_.workers;
  so.worker_args = WorkerNodeArgs(options_.tls, joined_.address());
  so.worker_args.push_back("--run_dir=" + run_dir);  // node 0's run directory is on node 0's host
  so.node_rank = options_.node.node_rank;
  so.nodes = options_.node.nodes;
  run_dir_ = run_dir;
  if (!options_.program.empty()) {
    store_host_ = joined_.store_host();
    store_port_ = joined_.store_port();
    so.program_env = [this](int64_t) { return ProgramStoreEnv(store_host_, store_port_); };  // this attempt's
    steps_ = std::make_unique<ProgramStepsReader>(run_dir, joined_.first_rank(), options_.workers);
  }
  so.report_exit = [this, run_dir](int rank, const ProcessExit& e) {
    ReportWorkerExitRequest r;
    r.set_node_rank(options_.node.node_rank);
    r.set_incarnation(options_.incarnation);
    r.set_restart_count(restart_count_);
    r.set_rank(rank);
    r.set_pid(e.pid);
    r.set_exit_code(e.exit_code);
    r.set_signal(e.signal);
    // Why, in the worker's own words: its log is on this host, node 0 names the cause.
    if (e.signal != 0 || e.exit_code != 0)
      r.set_last_error(WorkerLastError(absl::StrCat(run_dir, "/rank", rank, ".log")));
    unreported_.push_back(r);
    exits_.push_back(r);
  };
  so.report_spawn_failure = [this](int rank, const std::string& why) {
    ReportWorkerExitRequest r;
    r.set_node_rank(options_.node.node_rank);
    r.set_incarnation(options_.incarnation);
    r.set_restart_count(restart_count_);
    r.set_rank(rank);
    r.set_spawn_error(why);
    unreported_.push_back(r);  // sent on the next Tick, at once
  };
  supervisor_ = std::make_unique<Supervisor>(view_.get(), spawner_, std::move(so), now_);
  last_answer_ = now_();
  StartWait(/*until_restart=*/false);
  // A spawn failure is reported for each rank that did not start (report_spawn_failure), and this
  // agent ends once the reports are through: node 0 names the cause and stops the job at once.
  (void)supervisor_->Start();
}

void NodeAgent::StartWait(bool until_restart) {
  WaitForStopRequest w;
  w.set_node_rank(options_.node.node_rank);
  w.set_incarnation(options_.incarnation);
  w.set_restart_count(restart_count_);
  w.set_until_restart(until_restart);
  client_->StartWaitForStop(w, [this](absl::StatusOr<WaitForStopResponse> r) {
    absl::MutexLock lock(&mu_);
    pushed_ = std::move(r);
  });
}

void NodeAgent::Print(const std::string& line) const {
  if (options_.out) return options_.out(line);
  std::fprintf(stdout, "%s\n", line.c_str());
  std::fflush(stdout);
}

void NodeAgent::OnStop(const std::string& reason) {
  if (!stop_reason_ && !lost_) stop_reason_ = reason;
  supervisor_->StopWorkers(reason);
}

void NodeAgent::Beat(absl::Time now) {
  const int forward = forward_signal_;  // a signal to pass on goes at once
  if (lost_ || (forward == 0 && now - last_beat_ < kAgentHeartbeatInterval)) return;
  last_beat_ = now;
  AgentHeartbeatRequest r;
  r.set_node_rank(options_.node.node_rank);
  r.set_incarnation(options_.incarnation);
  r.set_term_signal(forward);
  const size_t steps = std::min<size_t>(unsent_steps_.size(), kMaxStepsPerHeartbeat);
  for (size_t i = 0; i < steps; ++i) *r.add_steps() = unsent_steps_[i];
  absl::StatusOr<AgentHeartbeatResponse> answer = client_->Heartbeat(r, kCallTimeout);
  now = now_();
  if (answer.ok()) {
    last_answer_ = now;
    unsent_steps_.erase(unsent_steps_.begin(), unsent_steps_.begin() + steps);
    if (forward != 0) {
      forwarded_signal_ = forward;
      forward_signal_ = 0;
    }
    term_at_ = std::max(term_at_, answer->checkpoint_and_stop_at());
    // Once this host's workers are gone, node 0 stopping is the end of the wait, not a failure here.
    if (answer->stop() && workers_gone_) coordinator_gone_ = true;
    if (answer->stop() && !workers_gone_) OnStop(answer->stop_reason());
    return;
  }
  if (absl::IsAborted(answer.status())) return OnStop(Message(answer.status()));  // replaced: leave
  if (now - last_answer_ > kAgentTimeout && !workers_gone_) {
    lost_ = absl::StrCat("no answer from the coordinator at ", options_.node.coordinator_address, " for ",
                         absl::FormatDuration(absl::Trunc(now - last_answer_, absl::Milliseconds(1))), " (",
                         Message(answer.status()), ")");
    supervisor_->StopWorkers(*lost_);
  }
}

void NodeAgent::FlushExits() {
  // A worker that ends cleanly may have ended for node 0's checkpoint-and-stop: learn its step
  // before node 0 hears of the last exit (and may stop serving), for the exit code.
  const bool clean = std::any_of(unreported_.begin(), unreported_.end(), [](const ReportWorkerExitRequest& e) {
    return e.spawn_error().empty() && e.signal() == 0 && e.exit_code() == 0;
  });
  if (clean && term_at_ == 0 && WritesTermCheckpoints(joined_.job())) {
    last_beat_ = absl::InfinitePast();
    Beat(now_());
  }
  while (!unreported_.empty() && !lost_) {
    absl::Status s = client_->ReportWorkerExit(unreported_.front(), kCallTimeout);
    if (!s.ok() && !absl::IsAborted(s) && !absl::IsInvalidArgument(s)) return;  // again next tick
    unreported_.erase(unreported_.begin());
  }
}

void NodeAgent::ReadSteps() {
  if (steps_ == nullptr) return;  // a job of ours: its workers report their steps themselves
  for (ReportStepRequest& step : steps_->Read(supervisor_->incarnation())) {
    if (program_gpus_ != nullptr) {
      if (std::optional<StepTelemetry> t = program_gpus_->TakeStep(step.rank() - joined_.first_rank()))
        *step.mutable_telemetry() = *std::move(t);
    }
    unsent_steps_.push_back(std::move(step));
  }
  constexpr size_t kMaxUnsent = 64 * kMaxStepsPerHeartbeat;  // node 0 unreachable for long: keep the newest
  if (unsent_steps_.size() > kMaxUnsent) unsent_steps_.erase(unsent_steps_.begin(), unsent_steps_.end() - kMaxUnsent);
}

// Node 0 decides whether the job runs again: until it is done, an agent whose workers are gone (stopped
// with the job, failed, or done before another node's failed) may be asked to start them again.
bool NodeAgent::MayRestart() const {
  return !lost_ && interrupt_signal_ == 0 && term_at_ == 0 && forwarded_signal_ == 0 &&
         restart_count_ < joined_.job().max_restarts() && supervisor_->exit_code() != kExitLaunchFailed;
}

bool NodeAgent::AwaitRestart(std::optional<absl::StatusOr<WaitForStopResponse>> pushed) {
  if (interrupt_signal_ != 0) return true;
  if (pushed && pushed->ok() && (*pushed)->restart_count() > restart_count_) {
    Relaunch(**pushed);
    return false;
  }
  // A stop or a cancellation is the last wait's, answered late; any other error: node 0 is done with
  // the job (it shut down without another attempt) or gone.
  if (pushed && !pushed->ok() && !absl::IsCancelled(pushed->status())) return true;
  Beat(now_());
  ReadSteps();
  if (now_() - last_answer_ > kAgentTimeout) return true;  // node 0 went silent: no restart to wait for
  return false;
}

void NodeAgent::Relaunch(const WaitForStopResponse& restart) {
  restart_count_ = restart.restart_count();
  if (restart.store_port() != 0) {
    store_host_ = restart.store_host();
    store_port_ = restart.store_port();
  }
  awaiting_restart_ = false;
  stop_reason_.reset();
  exits_.clear();
  workers_gone_ = coordinator_gone_ = false;
  last_answer_ = now_();
  const int first = joined_.first_rank();
  const std::string ranks = options_.workers == 1 ? absl::StrCat("rank ", first)
                                                  : absl::StrCat("ranks ", first, "-", first + options_.workers - 1);
  Print(absl::StrCat("stagehand: ", Name(), ": restart ", restart_count_, " of ", joined_.job().max_restarts(), ": ",
                     restart.reason(), "; starting this node's ", ranks, " again",
                     options_.program.empty() ? " from the newest checkpoint"
                                              : absl::StrCat(" (TORCHELASTIC_RESTART_COUNT=", restart_count_,
                                                             "; c10d store ", store_host_, ":", store_port_, ")")));
  StartWait(/*until_restart=*/false);
  ReadSteps();  // the last attempt's last lines, as its steps, before its incarnation ends
  supervisor_->Relaunch(restart_count_);
}

bool NodeAgent::Tick() {
  std::optional<absl::StatusOr<WaitForStopResponse>> pushed;
  {
    absl::MutexLock lock(&mu_);
    pushed = std::exchange(pushed_, std::nullopt);
  }
  if (awaiting_restart_) return AwaitRestart(std::move(pushed));
  if (pushed && !absl::IsCancelled(pushed->status())) coordinator_gone_ = true;  // stopping, or gone
  if (pushed && workers_gone_) {
    // Waiting for rank 0's manifest (TermCheckpointSettled): node 0 is done with this host.
  } else if (pushed) {
    if (pushed->ok()) {
      OnStop((*pushed)->reason());
    } else if (!absl::IsCancelled(pushed->status()) && !workers_gone_) {
      // The long poll broke: node 0 went away (its server shut down, or its process died).
      if (!lost_ && !stop_reason_) lost_ = absl::StrCat("the coordinator went away (", Message(pushed->status()), ")");
      supervisor_->StopWorkers(lost_ ? *lost_ : *stop_reason_);
    }
  }
  Beat(now_());
  const bool gone = supervisor_->Tick();
  ReadSteps();
  if (!unsent_steps_.empty() && !unreported_.empty()) {
    last_beat_ = absl::InfinitePast();  // a rank's last steps reach node 0 before its exit does
    Beat(now_());
  }
  FlushExits();
  workers_gone_ = gone && unreported_.empty();
  if (workers_gone_ && !TermCheckpointSettled(now_())) return false;
  if (workers_gone_ && MayRestart()) {
    awaiting_restart_ = true;
    const auto failed = std::find_if(exits_.begin(), exits_.end(), [](const ReportWorkerExitRequest& e) {
      return e.signal() != 0 || e.exit_code() != 0;
    });
    const std::string why =
        stop_reason_ ? absl::StrCat("the job stopped: ", *stop_reason_, "; this node's workers are stopped")
        : failed != exits_.end()
            ? absl::StrCat("rank ", failed->rank(), " (pid ", failed->pid(), ") ",
                           failed->signal() != 0 ? absl::StrCat("was killed by signal ", failed->signal())
                                                 : absl::StrCat("exited with code ", failed->exit_code()))
            : "";
    if (!why.empty()) {
      Print(absl::StrCat("stagehand: ", Name(), ": ", why, "; waiting for node 0 to start the job again (restart ",
                         restart_count_ + 1, " of ", joined_.job().max_restarts(), ") or to end it"));
    }
    StartWait(/*until_restart=*/true);
    return false;
  }
  return gone && (unreported_.empty() || lost_);
}

bool NodeAgent::TermCheckpointSettled(absl::Time now) {
  if (term_at_ == 0 || term_step_ > 0 || term_final_ || lost_ || stop_reason_ || interrupt_signal_ != 0) return true;
  for (const ReportWorkerExitRequest& e : exits_) {
    if (!e.spawn_error().empty() || e.signal() != 0 || e.exit_code() != 0) return true;  // a failure: node 0 judges
  }
  // Rank 0 writes the manifest once every rank's shard is on disk, after this host's ranks ended.
  const JobSpec& job = joined_.job();
  if (const int64_t step = CheckpointAtOrPast(job.run_dir(), term_at_); step > 0) {
    if (step < job.steps()) {
      term_step_ = step;
    } else {
      term_final_ = true;  // the run reached its end: a checkpoint of the last step, no stop
    }
    return true;
  }
  if (term_wait_until_ == absl::InfiniteFuture())
    term_wait_until_ = now + std::min(TermCheckpointTimeout(job), absl::Minutes(1));
  return coordinator_gone_ || now > term_wait_until_;
}

bool NodeAgent::ForwardTerm(int signal) {
  if (supervisor_ == nullptr || forward_signal_ != 0 || forwarded_signal_ != 0 || lost_ || stop_reason_ ||
      interrupt_signal_ != 0 || workers_gone_ || !WritesTermCheckpoints(joined_.job())) {
    return false;
  }
  forward_signal_ = signal;
  Beat(now_());
  return true;
}

void NodeAgent::Interrupt(int signal, bool force) {
  if (interrupt_signal_ == 0) interrupt_signal_ = signal;
  supervisor_->Interrupt(signal, force);
}

int NodeAgent::exit_code() const {
  if (interrupt_signal_ != 0) return 128 + interrupt_signal_;
  if (supervisor_ != nullptr && supervisor_->exit_code() == kExitLaunchFailed) return kExitLaunchFailed;
  if (lost_ || stop_reason_) return kExitWorkerFailed;
  for (const ReportWorkerExitRequest& e : exits_) {
    if (e.signal() != 0 || e.exit_code() != 0) return kExitWorkerFailed;
  }
  if (term_step_ > 0) return kExitCheckpointedOnTerm;
  if (term_at_ > 0 && !term_final_) return 128 + SIGTERM;  // stopped for a checkpoint that is not whole
  return kExitSuccess;
}

std::string NodeAgent::verdict() const {
  const std::string ranks = options_.workers == 1 ? absl::StrCat("rank ", joined_.first_rank())
                                                  : absl::StrCat("ranks ", joined_.first_rank(), "-",
                                                                 joined_.first_rank() + options_.workers - 1);
  if (interrupt_signal_ != 0) {
    return absl::StrCat("stagehand: ", Name(), ": stopped by ", interrupt_signal_ == SIGINT ? "SIGINT" : "SIGTERM",
                        " (exit ", exit_code(), "); this node's workers (", ranks, ") are stopped");
  }
  if (supervisor_ != nullptr && supervisor_->exit_code() == kExitLaunchFailed) {
    return absl::StrCat("stagehand: ", Name(), ": ", supervisor_->root_cause());
  }
  if (lost_)
    return absl::StrCat("stagehand: ", Name(), ": lost the coordinator: ", *lost_, "; stopped this node's workers (",
                        ranks, ")");
  if (stop_reason_) return absl::StrCat("stagehand: ", Name(), ": the job stopped: ", *stop_reason_);
  for (const ReportWorkerExitRequest& e : exits_) {
    if (e.signal() != 0 || e.exit_code() != 0) {
      return absl::StrCat("stagehand: ", Name(), ": rank ", e.rank(), " (pid ", e.pid(), ") ",
                          e.signal() != 0 ? absl::StrCat("was killed by signal ", e.signal())
                                          : absl::StrCat("exited with code ", e.exit_code()),
                          "; node 0 names the job's root cause");
    }
  }
  const std::string by = forwarded_signal_ != 0
                             ? absl::StrCat("this node's ", forwarded_signal_ == SIGHUP ? "SIGHUP" : "SIGTERM")
                             : "a signal to another node";
  if (term_step_ > 0) {
    return absl::StrCat("stagehand: ", Name(), ": stopped by ", by, " after a checkpoint at step ", term_step_, " (",
                        ranks, ", exit ", kExitCheckpointedOnTerm, "); --resume=", joined_.job().run_dir(),
                        " on node 0 continues the job");
  }
  if (term_at_ > 0 && !term_final_) {
    return absl::StrCat("stagehand: ", Name(), ": stopped by ", by, " for a checkpoint after step ", term_at_,
                        ", but none is complete (", ranks, ", exit ", 128 + SIGTERM, "); node 0 names the cause");
  }
  return absl::StrCat("stagehand: ", Name(), ": done (", ranks, ")");
}

namespace {

// The agent's loop, fed the launcher's signals as a foreground launch is (launch.cc's Supervise).
void Drive(NodeAgent& agent) {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaddset(&set, sig);
  int interrupts = 0;
  while (!agent.Tick()) {
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t info;
    const int sig = sigtimedwait(&set, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      ++interrupts;
      // As on node 0 (launch.cc's Supervise): the first SIGTERM of a job with checkpoints (Slurm's
      // preemption signals every node) asks for one, through node 0; SIGINT and a second stop here.
      if (interrupts == 1 && sig != SIGINT && agent.ForwardTerm(sig)) {
        std::fprintf(stdout,
                     "stagehand: %s: %s: passed to node 0: every rank writes a checkpoint at the next step, "
                     "then the job stops (again to stop this node's workers at once)\n",
                     agent.name().c_str(), sig == SIGHUP ? "SIGHUP" : "SIGTERM");
        std::fflush(stdout);
        continue;
      }
      agent.Interrupt(sig == SIGINT ? SIGINT : SIGTERM, interrupts > 1);
    }
  }
}

void Line(const std::string& text) {
  std::fprintf(stdout, "%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace

int RunAgent(const AgentLaunch& launch) {
  JobRequest host;
  host.flags.set_device(launch.device);
  host.gpus = launch.gpus;
  if (launch.workers) host.flags.set_workers(*launch.workers);
  absl::StatusOr<ResolvedJob> devices = ResolveHostDevices(host, QueryDevices());
  absl::StatusOr<std::string> worker = FindWorker(launch.worker_binary);
  absl::StatusOr<std::string> token = launch.job_token_file.empty() ? "" : ReadJobToken(launch.job_token_file);
  JobSpec program;  // a program job: this host's own, resolved here as on node 0
  absl::Status resolved = absl::OkStatus();
  if (!launch.program.empty()) {
    JobRequest r;
    r.program = launch.program;
    resolved = ResolveProgram(r, program);
  }
  for (const absl::Status& s : {devices.status(), worker.status(), token.status(), resolved}) {
    if (!s.ok()) {
      std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
      return kExitUsage;
    }
  }
  if (!launch.run_dir.empty()) {
    if (absl::Status s = CheckRunDir(UserPath(launch.run_dir), launch.overwrite); !s.ok()) {
      std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
      return kExitUsage;
    }
  }
  absl::StatusOr<std::unique_ptr<AgentClient>> client =
      ConnectAgentClient(launch.node.coordinator_address, launch.tls.client(), *token);
  if (!client.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(client.status()).c_str());
    return kExitUsage;
  }
  NodeAgentOptions o;
  o.node = launch.node;
  o.device = devices->spec.device();
  o.workers = devices->spec.workers();
  o.gpus = devices->gpus;
  o.worker_binary = *worker;
  o.tls = launch.tls;
  o.incarnation = absl::ToUnixMicros(absl::Now());  // a restarted agent is a newer one
  o.host = HostName();
  o.machine = MachineId();
  o.pid = getpid();
  if (launch.register_timeout_ms) o.register_timeout = absl::Milliseconds(*launch.register_timeout_ms);
  o.launch = launch.launch;
  o.program = launch.program;
  o.program_resolved.assign(program.program().begin(), program.program().end());
  o.program_cwd = program.program_cwd();
  std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner();
  NodeAgent agent(client->get(), spawner.get(), o);
  Line(absl::StrFormat("stagehand: node %d of %d: %d %s worker%s here; joining the coordinator at %s",
                       launch.node.node_rank, launch.node.nodes, o.workers, o.device == "cuda" ? "GPU" : "CPU",
                       o.workers == 1 ? "" : "s", launch.node.coordinator_address));
  if (absl::Status s = agent.Join(); !s.ok()) {
    Line(absl::StrCat("stagehand: node ", launch.node.node_rank, ": could not join: ", Message(s)));
    return absl::IsInvalidArgument(s) ? kExitUsage : kExitLaunchFailed;
  }
  const RegisterAgentResponse& j = agent.joined();
  const std::string run_dir =
      UserPath(!launch.run_dir.empty()
                   ? launch.run_dir
                   : absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-",
                                  j.job().name(), "-", j.job_id(), "-node", launch.node.node_rank));
  if (!o.program.empty()) {
    // A program's ranks are not ours to instrument: this host's launcher reads their GPUs, as node
    // 0's reads its own. A refusal ends this node before its ranks start (node 0 names the node).
    absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus =
        ProgramGpus::Start(j.job(), o.gpus, [&](const std::string& line) {
          Line(absl::StrCat("stagehand: node ", launch.node.node_rank, ": health: ", line));
        });
    if (!gpus.ok()) {
      Line(absl::StrCat("stagehand: node ", launch.node.node_rank, ": health: ", Message(gpus.status())));
      return kExitLaunchFailed;
    }
    agent.SetProgramGpus(*std::move(gpus));
  }
  if (absl::Status s = PrepareRunDir(run_dir, launch.overwrite); !s.ok()) {
    Line(absl::StrCat("stagehand: ", Message(s)));
    return kExitLaunchFailed;  // node 0 sees this node's ranks never register
  }
  Line(absl::StrFormat("stagehand: job %s: node %d at %s runs %s of %d; run directory %s", j.job_id(),
                       launch.node.node_rank, j.address(),
                       o.workers == 1 ? absl::StrCat("rank ", j.first_rank())
                                      : absl::StrCat("ranks ", j.first_rank(), "-", j.first_rank() + o.workers - 1),
                       j.job().workers(), run_dir));
  agent.Start(run_dir);
  Drive(agent);
  Line(agent.verdict());
  return agent.exit_code();
}

}  // namespace stagehand
