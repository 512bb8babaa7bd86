// One job from its coordinator's start to its reports (see job_run.h).
#include "launcher/run/job_run.h"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "launcher/plan/health_gate.h"
#include "common/checkpoint.h"
#include "common/host.h"
#include "launcher/plan/job_plan.h"
#include "launcher/job/run_dir.h"
#include "launcher/job/worker_binary.h"
#include "models/model_description.h"

namespace stagehand {
namespace {

std::string Message(const absl::Status& s) { return std::string(s.message()); }

RunReport BuildRunReport(const CoordinatorState& state, const Supervisor& supervisor, double peak_tflops, int exit_code,
                         const std::string& root_cause) {
  ReportInput in;
  in.job_id = state.job_id();
  in.job = state.job();
  in.exit_code = exit_code;
  in.root_cause = root_cause;
  in.steps = state.Steps();
  for (const WorkerState& w : state.Workers()) {
    in.hosts.push_back(w.host);
    in.devices.push_back(w.device.name().empty() ? "cpu" : w.device.name());
    in.health.push_back(w.health);
  }
  if (std::optional<Partition> p = state.partition()) {
    int first = 0;
    for (int n : p->layers_per_stage) {
      in.layers.push_back({first, first + n});
      first += n;
    }
  }
  // Data parallelism: rank = replica x stages + stage, so a rank holds its stage's layers.
  const size_t stages = in.layers.size();
  for (size_t r = stages; stages > 0 && state.job().data_parallel() > 1 && r < in.hosts.size(); ++r) {
    in.layers.push_back(in.layers[r % stages]);
  }
  in.layers.resize(in.hosts.size(), {0, 0});
  // A GPU's peak means nothing for CPU workers: no peak, so no MFU.
  in.peak_tflops_per_device = state.job().device() == "cuda" ? peak_tflops : 0;
  in.warmup_steps = std::min<int64_t>(3, std::max<int64_t>(0, state.job().steps() - 1));
  for (const RankLedger& l : supervisor.Ledger()) {
    if (l.first_step)
      in.launch_to_first_step_seconds = std::max(in.launch_to_first_step_seconds, absl::ToDoubleSeconds(*l.first_step));
  }
  if (std::optional<Partition> p = state.partition()) {
    in.predicted_compute_ms = p->predicted_compute_ms;
    in.planned_sm_mhz = p->planned_sm_mhz;
  }
  RunReport report = BuildReport(in);
  if (std::optional<Partition> p = state.partition()) {
    report.set_predicted_step_seconds(p->predicted_step_ms / 1e3);
    report.set_predicted_from(p->predicted_from);
    for (int r = 0; r < report.ranks_size() && r < static_cast<int>(p->predicted_rank_bubble.size()); ++r) {
      report.mutable_ranks(r)->set_predicted_bubble_fraction(p->predicted_rank_bubble[r]);
    }
  }
  return report;
}

// For each worker that failed at an action of its schedule: the rank-by-step grid of the whole
// schedule with that action marked (torch.distributed.pipelining prints the same on failure).
std::string FailedActions(const CoordinatorState& state) {
  const std::optional<Partition> partition = state.partition();
  if (!partition) return "";
  std::string out;
  const std::vector<WorkerState> workers = state.Workers();
  for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
    if (workers[r].failed_action < 0) continue;
    absl::StatusOr<std::string> grid = FailureGrid(*partition, r, workers[r].failed_action);
    if (grid.ok())
      absl::StrAppend(&out, "stagehand: rank ", r, " failed at the marked action of its schedule:\n", *grid);
  }
  return out;
}

const char* SignalText(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

// A failed run's temporary export directories (<export_dir>.partial-<job id>-<incarnation>, flat, see
// worker/checkpoint.h): never left to look like an export. The final name is only ever a whole one.
void RemovePartialExports(const std::string& export_dir, const std::string& job_id) {
  const size_t slash = export_dir.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : export_dir.substr(0, slash);
  const std::string prefix =
      absl::StrCat(export_dir.substr(slash == std::string::npos ? 0 : slash + 1), ".partial-", job_id, "-");
  DIR* d = opendir(parent.c_str());
  if (d == nullptr) return;
  std::vector<std::string> partial;
  while (struct dirent* e = readdir(d)) {
    if (absl::StartsWith(e->d_name, prefix)) partial.push_back(parent + "/" + e->d_name);
  }
  closedir(d);
  for (const std::string& dir : partial) {
    if (DIR* p = opendir(dir.c_str())) {
      while (struct dirent* e = readdir(p)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") unlink((dir + "/" + name).c_str());
      }
      closedir(p);
    }
    rmdir(dir.c_str());
  }
}

}  // namespace

// The run's files as it goes: step reports appended to steps.csv as they arrive; the first failed
// write stops the workers (the run cannot keep its results), as SIGTERM would.
class JobRun::Files {
 public:
  explicit Files(JobListener* listener) : listener_(listener) {}

  // Prints the line (naming the path and the error) and keeps the first.
  void Error(const absl::Status& s, const char* then = "") {
    if (s.ok()) return;
    listener_->Text(absl::StrCat("stagehand: ", Message(s), then, "\n"));
    if (first_.ok()) first_ = s;
  }
  bool any_error() const { return !first_.ok(); }
  const absl::Status& first_error() const { return first_; }
  bool stopped_for_error() const { return stopped_for_error_; }
  StepsCsv& steps() { return steps_; }

  void AppendNew(const CoordinatorState& state, Supervisor& supervisor) {
    std::vector<ReportStepRequest> fresh = state.StepsSince(written_);
    written_ += fresh.size();
    if (fresh.empty() || any_error()) return;
    if (absl::Status s = steps_.Append(fresh); !s.ok()) {
      Error(s, "; stopping the run");
      stopped_for_error_ = true;
      supervisor.Interrupt(SIGTERM, /*force=*/false);
      return;
    }
    for (const ReportStepRequest& step : fresh) listener_->Step(step);
  }

 private:
  JobListener* const listener_;
  StepsCsv steps_;
  size_t written_ = 0;  // step reports appended so far
  absl::Status first_;
  bool stopped_for_error_ = false;
};

JobRun::JobRun(JobRunOptions options, ProcessSpawner* spawner, JobListener* listener)
    : options_(std::move(options)),
      spawner_(spawner),
      listener_(listener),
      state_(options_.job.spec, options_.job_id, options_.secret),
      files_(std::make_unique<Files>(listener)),
      progress_(options_.progress_bar, [listener](absl::string_view text) { listener->Text(text); }) {}

JobRun::~JobRun() {
  if (server_ != nullptr) server_->Stop();
  if (store_ != nullptr) store_->Stop();
}

std::unique_ptr<JobRun> JobRun::Start(JobRunOptions options, ProcessSpawner* spawner, JobListener* listener,
                                      int& exit_code) {
  exit_code = kExitUsage;
  std::string text;
  google::protobuf::TextFormat::PrintToString(options.job.spec, &text);
  options.job.spec.set_run_dir(options.run_dir);
  std::unique_ptr<JobRun> run(new JobRun(std::move(options), spawner, listener));
  const JobRunOptions& o = run->options_;
  const JobSpec& spec = o.job.spec;
  if (IsModelJob(spec) && o.nodes <= 1) run->state_.SetPartitioner(Partitioner(spec));
  run->state_.SetAdmission(HealthAdmission(  // the GPU health gate (--health)
      spec, [listener](const std::string& line) { listener->Text(absl::StrCat("stagehand: health: ", line, "\n")); }));
  if (o.nodes > 1) {
    NodeState node0;
    node0.host = HostName();
    node0.machine = MachineId();
    absl::StatusOr<std::string> bind = ListenAddress(o.coordinator_address, o.tls.enabled());
    node0.address = bind.ok() ? HostOf(*bind) : "";
    node0.pid = getpid();
    node0.device = spec.device();
    node0.workers = spec.workers();
    node0.program = o.program;
    run->state_.ExpectNodes(o.nodes, node0);  // before serving: an agent may call at once
  }
  CoordinatorServerOptions server_options;
  server_options.address = o.coordinator_address;
  server_options.tls = o.tls.server();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server =
      o.tls.enabled() ? CoordinatorServer::Start(server_options, &run->state_)
                      : CoordinatorServer::Start(o.coordinator_address, &run->state_);
  if (!server.ok()) {
    listener->Refusal(absl::StrCat("stagehand: ", Message(server.status())));
    exit_code = server.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitLaunchFailed;
    return nullptr;
  }
  run->server_ = *std::move(server);
  if (spec.program_size() > 0 && o.nodes <= 1) {
    // On this host's loopback: the ranks of a program job run here (several hosts: once every node
    // has joined, StartWorld, when the nodes' addresses are known).
    if (absl::Status s = run->StartStore(); !s.ok()) {
      listener->Refusal(absl::StrCat("stagehand: the c10d store for the program's ranks: ", Message(s)));
      exit_code = kExitLaunchFailed;
      return nullptr;
    }
  }
  if (spec.program_size() > 0) {
    // A program's ranks are not ours to instrument: the launcher reads their GPUs (program_gpus.h).
    absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus = ProgramGpus::Start(
        spec, o.job.gpus,
        [listener](const std::string& line) { listener->Text(absl::StrCat("stagehand: health: ", line, "\n")); });
    if (!gpus.ok()) {
      listener->Refusal(absl::StrCat("stagehand: health: ", Message(gpus.status())));
      exit_code = kExitLaunchFailed;
      return nullptr;
    }
    run->program_gpus_ = *std::move(gpus);
  }
  // Created only now, after everything that can refuse the job, so a refusal leaves nothing behind.
  if (absl::Status s = PrepareRunDir(o.run_dir, o.overwrite); !s.ok()) {
    listener->Refusal(absl::StrCat("stagehand: ", Message(s)));
    return nullptr;
  }
  // Printed once nothing can refuse the job any more, so a refusal is one line.
  for (const std::string& note : o.job.notes) listener->Text(absl::StrCat("stagehand: ", note, "\n"));
  Files& files = *run->files_;
  files.Error(WriteFileAtomically(o.run_dir + "/job.textproto", text));
  if (!files.any_error()) {
    files.Error(files.steps().Open(o.run_dir + "/steps.csv", spec.device() == "cuda" && spec.telemetry(),
                                   spec.val_fraction() > 0, spec.max_restarts() > 0));
  }
  if (files.any_error()) {
    exit_code = kExitWriteFailed;
    return nullptr;
  }
  if (o.nodes > 1) {
    listener->Text(absl::StrFormat(
        "stagehand: job %s: node 0 of %d, %d %s worker%s here; coordinator %s%s; waiting for "
        "the agents of nodes 1-%d; run directory %s\n",
        o.job_id, o.nodes, spec.workers(), spec.device() == "cuda" ? "GPU" : "CPU", spec.workers() == 1 ? "" : "s",
        run->server_->address(), o.tls.enabled() ? " (mutual TLS)" : "", o.nodes - 1, o.run_dir));
    exit_code = kExitSuccess;
    return run;  // the workers start once every node has joined (StartWorld)
  }
  run->supervisor_ = std::make_unique<Supervisor>(&run->state_, spawner, run->WorkerOptions());
  if (spec.program_size() > 0) {
    listener->Text(
        absl::StrFormat("stagehand: job %s: %d %s worker%s of %s; c10d store 127.0.0.1:%d (MASTER_ADDR, "
                        "MASTER_PORT); run directory %s\n",
                        o.job_id, spec.workers(), spec.device() == "cuda" ? "GPU" : "CPU",
                        spec.workers() == 1 ? "" : "s", CommandLine(spec), run->store_->port(), o.run_dir));
    (void)run->supervisor_->Start();
    exit_code = kExitSuccess;
    return run;
  }
  listener->Text(
      absl::StrFormat("stagehand: job %s: %d %s worker%s, %d step%s of %s; coordinator %s; run directory %s\n",
                      o.job_id, spec.workers(), spec.device() == "cuda" ? "GPU" : "CPU", spec.workers() == 1 ? "" : "s",
                      spec.steps(), spec.steps() == 1 ? "" : "s", spec.model(), run->server_->address(), o.run_dir));
  (void)run->supervisor_->Start();  // a spawn failure is an incident: the ticks stop the job
  exit_code = kExitSuccess;
  return run;
}

// A program job's c10d store on store_host_, open to store_peers_ (all when empty), on a port it picks.
absl::Status JobRun::StartStore() {
  if (store_ != nullptr) store_->Stop();
  C10dStoreOptions so;
  so.allowed_peers = store_peers_;
  store_ = std::make_unique<C10dStoreServer>(so);
  return store_->Start(store_host_, 0).status();
}

// A program job's attempt: its c10d store (a new one from the second attempt on, so that no rank
// reads the last attempt's keys) and the `stagehand` module ahead of the launcher's PYTHONPATH.
std::vector<std::string> JobRun::ProgramEnv(int64_t incarnation) {
  if (incarnation != store_incarnation_) {
    store_incarnation_ = incarnation;
    if (absl::Status s = StartStore(); !s.ok()) {
      listener_->Text(absl::StrCat("stagehand: the c10d store for attempt ", incarnation, ": ", Message(s), "\n"));
    }
    state_.SetProgramStore(store_host_, store_->port());  // several hosts: the agents' ranks join it
  }
  return ProgramStoreEnv(store_host_, store_->port());
}

SupervisorOptions JobRun::WorkerOptions() {
  const JobRunOptions& o = options_;
  // Several nodes on one machine (loopback, network namespaces) share its cores: count them all.
  const int on_machine = o.nodes > 1 ? WorkersOnMachine(state_.Nodes(), 0) : o.job.spec.workers();
  SupervisorOptions so{o.worker_binary, server_->address(), o.run_dir, WorkerEnvironment(on_machine), o.job.gpus,
                       o.launch};
  if (store_ != nullptr) so.program_env = [this](int64_t incarnation) { return ProgramEnv(incarnation); };
  if (o.nodes > 1 || o.tls.enabled()) {
    const std::string host = HostOf(server_->address());
    so.worker_args = WorkerNodeArgs(o.tls, host);
    so.local_workers = o.job.spec.workers();  // ranks 0.. are node 0's (node-major)
  }
  so.nodes = o.nodes;
  return so;
}

void JobRun::FailBeforeWorld(int exit_code, const std::string& why) {
  state_.Stop(why, "the coordinator");
  state_.SetWorld(state_.job());  // the nodes that joined, so that the reports have their slots
  supervisor_ = std::make_unique<Supervisor>(&state_, spawner_, WorkerOptions());
  supervisor_->Fail(exit_code, why);
}

bool JobRun::StartWorld() {
  if (std::optional<std::string> why = state_.stop_reason()) {  // an agent's refusal: another program
    listener_->Text(absl::StrCat("stagehand: ", *why, "\n"));
    FailBeforeWorld(kExitUsage, *why);
    return true;
  }
  const std::vector<NodeState> nodes = state_.Nodes();
  std::vector<int> missing;
  int world = 0;
  for (int k = 0; k < static_cast<int>(nodes.size()); ++k) {
    if (!nodes[k].registered) missing.push_back(k);
    world += nodes[k].workers;
  }
  if (!missing.empty()) {
    const absl::Duration wait = absl::Milliseconds(options_.job.spec.timeouts().register_ms());
    if (absl::Now() - options_.launch < wait) return false;
    FailBeforeWorld(
        kExitWorkerHung,
        absl::StrCat(missing.size() == 1 ? "node " : "nodes ", absl::StrJoin(missing, ", "), " did not join within ",
                     absl::FormatDuration(wait), " (is its launcher running with --nodes=", nodes.size(),
                     " --node_rank=", missing[0], " --coordinator_address=", server_->address(), "?)"));
    return true;
  }
  absl::StatusOr<JobSpec> spec = options_.resolve_world(world, nodes);
  if (!spec.ok()) {
    listener_->Text(absl::StrCat("stagehand: the job cannot run on the ", nodes.size(), " nodes' ", world,
                                 " workers: ", Message(spec.status()), "\n"));
    FailBeforeWorld(kExitUsage, Message(spec.status()));
    return true;
  }
  spec->set_run_dir(options_.run_dir);
  if (IsModelJob(*spec)) {
    std::vector<NodeState> placed = nodes;  // the ranks SetWorld gives them: node-major
    for (size_t k = 1; k < placed.size(); ++k) placed[k].first_rank = placed[k - 1].first_rank + placed[k - 1].workers;
    // Before SetWorld, whose lock publishes it to the registering workers' threads.
    state_.SetPartitioner(WithCrossHostLinks(Partitioner(*spec), placed));
  }
  // Before any worker can start: the job's id in its run directory, by which every other host's
  // workers check that they see this directory (worker/pipeline.cc, CheckNodeZeroPaths), for the
  // checkpoints and the export they write into it and beside it.
  files_->Error(WriteFileAtomically(options_.run_dir + "/job_id", options_.job_id + "\n"));
  if (spec->program_size() > 0) {
    // Every node's ranks rendezvous here: on the coordinator's host, open to the nodes' addresses
    // only (loopback: to this host's own).
    store_host_ = HostOf(server_->address());
    if (!IsLoopbackAddress(server_->address())) {
      for (const NodeState& n : nodes) store_peers_.push_back(n.address);
    }
    if (absl::Status s = StartStore(); !s.ok()) {
      const std::string why = absl::StrCat("the c10d store for the program's ranks: ", Message(s));
      listener_->Text(absl::StrCat("stagehand: ", why, "\n"));
      FailBeforeWorld(kExitLaunchFailed, why);
      return true;
    }
  }
  state_.SetWorld(*spec, store_ != nullptr ? store_host_ : "", store_ != nullptr ? store_->port() : 0);
  std::string text;
  google::protobuf::TextFormat::PrintToString(state_.job(), &text);
  files_->Error(WriteFileAtomically(options_.run_dir + "/job.textproto", text));  // the whole job, not node 0's part
  supervisor_ = std::make_unique<Supervisor>(&state_, spawner_, WorkerOptions());
  if (store_ != nullptr) {
    listener_->Text(
        absl::StrFormat("stagehand: all %d nodes joined: %d workers of %s; c10d store %s:%d (MASTER_ADDR, "
                        "MASTER_PORT): %s\n",
                        nodes.size(), world, absl::StrJoin(spec->program(), " "), store_host_, store_->port(),
                        DescribeNodes(state_.Nodes())));
  } else {
    listener_->Text(absl::StrFormat("stagehand: all %d nodes joined: %d workers, %d step%s of %s: %s\n", nodes.size(),
                                    world, spec->steps(), spec->steps() == 1 ? "" : "s", spec->model(),
                                    DescribeNodes(state_.Nodes())));
  }
  (void)supervisor_->Start();
  return true;
}

// The step of the checkpoint a SIGTERM asked for, once complete (its manifest written): the run's
// newest, at or past the step asked for and short of the end (0: none).
int64_t JobRun::TermCheckpointStep() const {
  if (term_at_ == 0) return 0;
  const int64_t step = CheckpointAtOrPast(options_.run_dir, term_at_);
  return step < state_.job().steps() ? step : 0;
}

const std::string& JobRun::coordinator_address() const {
  static const std::string* none = new std::string;
  return server_ != nullptr ? server_->address() : *none;
}

// From the workers' own counts, not the step reports: the server asks on every tick, and copying a
// long run's reports each time would cost more than the run.
int64_t JobRun::steps_done() const {
  int64_t done = 0;
  for (const WorkerState& w : state_.Workers()) done = std::max<int64_t>(done, w.steps_done);
  return done;
}

bool JobRun::CheckpointAndStop(int signal, int node) {
  const JobSpec& job = state_.job();
  if (term_at_ > 0) {  // another node's signal, or ours, asked already: one checkpoint serves both
    listener_->Text(
        absl::StrFormat("stagehand: %s%s: the checkpoint after step %d is under way (again to stop at "
                        "once)\n",
                        node > 0 ? absl::StrCat("node ", node, ": ") : "", SignalText(signal), term_at_));
    return true;
  }
  if (supervisor_ == nullptr || !supervisor_->running() || !WritesTermCheckpoints(job)) return false;
  supervisor_->PreventRestarts();
  term_signal_ = signal;
  term_node_ = node;
  term_at_ = state_.RequestCheckpointAndStop();
  term_deadline_ = absl::Now() + TermCheckpointTimeout(job);
  listener_->Text(
      absl::StrFormat("stagehand: %s%s: every rank writes a checkpoint after step %d, then the run stops "
                      "(waiting up to %s; again to stop at once)\n",
                      node > 0 ? absl::StrCat("node ", node, " got ") : "", SignalText(signal), term_at_,
                      absl::FormatDuration(TermCheckpointTimeout(job))));
  return true;
}

// A program job's steps, as its ranks' `stagehand.step()` calls appended them since the last tick:
// this host's ranks' (0.. on node 0, node-major), as steps of `incarnation`; the agents send theirs
// with their heartbeats.
void JobRun::ReadProgramSteps(int64_t incarnation) {
  if (steps_reader_ == nullptr) {
    const int workers = options_.nodes > 1 ? options_.job.spec.workers() : state_.job().workers();
    steps_reader_ = std::make_unique<ProgramStepsReader>(options_.run_dir, 0, workers);
  }
  for (ReportStepRequest& step : steps_reader_->Read(incarnation)) {
    if (program_gpus_ != nullptr) {
      if (std::optional<StepTelemetry> t = program_gpus_->TakeStep(step.rank()))
        *step.mutable_telemetry() = *std::move(t);
    }
    state_.RecordProgramStep(step);
  }
}

bool JobRun::Tick() {
  if (supervisor_ == nullptr && !StartWorld()) return false;  // several hosts: the agents are joining
  if (std::optional<CoordinatorState::NodeSignal> ns = state_.TakeNodeSignal()) {
    // An agent forwards its SIGTERM only for a job that writes checkpoints (NodeAgent); should this
    // one not (its run is ending), the job stops as for our own signal.
    if (!CheckpointAndStop(ns->signal, ns->node)) {
      listener_->Text(
          absl::StrCat("stagehand: node ", ns->node, " got ", SignalText(ns->signal), ": stopping the workers\n"));
      supervisor_->Interrupt(SIGTERM, /*force=*/false);
    }
  }
  if (term_at_ > 0 && !term_timed_out_ && absl::Now() > term_deadline_) {
    term_timed_out_ = true;
    listener_->Text(
        absl::StrFormat("stagehand: %s: no checkpoint after step %d within the timeout "
                        "(--term_checkpoint_timeout_ms); stopping the workers\n",
                        SignalText(term_signal_), term_at_));
    supervisor_->Interrupt(term_signal_, /*force=*/false);
  }
  // The incarnation before the tick: a tick that begins a restart (every rank gone) has their last
  // lines still to read, and the next attempt's ranks start only after the backoff, in a later tick.
  const int64_t incarnation = supervisor_->incarnation();
  const bool over = supervisor_->Tick();
  if (state_.job().program_size() > 0) ReadProgramSteps(incarnation);
  progress_.Update(state_);
  files_->AppendNew(state_, *supervisor_);
  return over;
}

void JobRun::Interrupt(int signal, bool force) {
  if (supervisor_ == nullptr) {
    return FailBeforeWorld(128 + signal,
                           absl::StrCat("interrupted by ", SignalText(signal), " before every node joined"));
  }
  supervisor_->Interrupt(signal, force);
}

JobRunEnd JobRun::Finish(int first_signal, absl::string_view note) {
  if (state_.job().program_size() > 0) ReadProgramSteps(supervisor_->incarnation());  // the last steps before the exits
  progress_.Update(state_);
  progress_.Done();
  if (!note.empty()) listener_->Text(note);
  const absl::Duration elapsed = absl::Now() - supervisor_->launch_time();
  server_->Stop();
  Files& files = *files_;
  files.AppendNew(state_, *supervisor_);  // the reports that came with the last exits
  if (!files.any_error()) files.Error(files.steps().Close());
  const bool gpu = state_.job().device() == "cuda";
  files.Error(WriteLedger(supervisor_->Ledger(), supervisor_->launch_time(), gpu, state_.job().program_size() > 0,
                          run_dir() + "/startup_ledger.tsv"));
  files.Error(WriteFileAtomically(run_dir() + "/trace.json", ChromeTrace(state_.Steps(), state_.job().workers())));
  // The verdict: a failed write of the results comes first (exit 5: the run directory is not what
  // the run did), then the supervisor's.
  const int64_t term_step = TermCheckpointStep();
  auto verdict = [&]() -> std::pair<int, std::string> {
    std::string cause = supervisor_->root_cause();
    int code = supervisor_->exit_code();
    if (first_signal == SIGHUP && code == 128 + SIGTERM) cause = "interrupted by SIGHUP (handled as SIGTERM)";
    // The signal that asked for the checkpoint: ours (the first taken), or another node's.
    const std::string by = absl::StrCat(term_node_ > 0 ? absl::StrCat("node ", term_node_, "'s ") : "",
                                        SignalText(term_node_ > 0 || first_signal == 0 ? term_signal_ : first_signal));
    if (term_at_ > 0 && (code == kExitSuccess || code == 128 + term_signal_) && term_step > 0) {
      code = kExitCheckpointedOnTerm;
      cause = absl::StrCat("stopped by ", by, " after a checkpoint at step ", term_step);
    } else if (term_at_ > 0 && code == kExitSuccess && steps_done() < state_.job().steps()) {
      code = 128 + term_signal_;  // the workers ended early but no checkpoint is whole
      cause = absl::StrCat("interrupted by ", by, "; no complete checkpoint after step ", term_at_);
    }
    if (!files.any_error()) return {code, cause};
    std::string text = Message(files.first_error());
    // The workers' own failure, if one came before ours stopped them, is worth keeping.
    if (supervisor_->exit_code() != kExitSuccess &&
        !(files.stopped_for_error() && supervisor_->exit_code() == 128 + SIGTERM)) {
      absl::StrAppend(&text, "; before that: ", cause);
    }
    return {kExitWriteFailed, text};
  };
  auto [code, cause] = verdict();
  JobRunEnd end;
  end.report = BuildRunReport(state_, *supervisor_, options_.peak_tflops_per_device, code, cause);
  if (code == kExitCheckpointedOnTerm) end.report.set_term_checkpoint_step(term_step);
  // report.json last, so that it records whether the others were written.
  if (absl::StatusOr<std::string> json = ReportJson(end.report); json.ok()) {
    files.Error(WriteFileAtomically(run_dir() + "/report.json", *json));
  } else {
    files.Error(json.status());
  }
  std::tie(code, cause) = verdict();  // report.json itself may have failed
  end.report.set_exit_code(code);
  end.report.set_root_cause(cause);
  end.exit_code = code;
  const JobSpec& spec = state_.job();  // several hosts: the whole job's
  if (IsModelJob(state_.job()) && end.report.step_seconds() > 0) {
    listener_->Text(SummaryLines(end.report, HasActionTiming(state_.Steps())));
  }
  if (const std::string line = GpuSummaryLine(end.report); !line.empty())
    listener_->Text(absl::StrCat("stagehand: GPU: ", line, "\n"));
  for (const std::string& line : PredictedVsMeasuredLines(end.report))
    listener_->Text(absl::StrCat("stagehand: GPU: ", line, "\n"));
  if (!spec.export_dir().empty()) {
    // Also after a success: an earlier incarnation's partial export (a restart) is never left behind.
    RemovePartialExports(spec.export_dir(), state_.job_id());
    if (code == kExitSuccess) listener_->Text(absl::StrCat("stagehand: weights exported to ", spec.export_dir(), "\n"));
  }
  // A stop by a signal is no failure: no schedule diagram, and the line says what stopped it.
  if (code != kExitSuccess && code != kExitCheckpointedOnTerm && !StoppedBySignal(code)) {
    if (std::string grids = FailedActions(state_); !grids.empty()) listener_->Text(grids);
  }
  if (store_ != nullptr) store_->Stop();
  listener_->Text(EndLine({code, end.report.root_cause(), end.report.steps_done(), spec.steps(), spec.workers(),
                           absl::ToDoubleSeconds(elapsed), run_dir(), CommandLine(spec)}));
  return end;
}

// The line a signal's arrival prints (launch.cc and serve.cc share it).
std::string InterruptLine(int sig, int interrupts) {
  return absl::StrCat("stagehand: ", SignalText(sig), ": ", sig == SIGHUP ? "as for SIGTERM, " : "",
                      interrupts == 1 ? "stopping the workers (again to kill them at once)" : "killing the workers",
                      "\n");
}

}  // namespace stagehand
