// One launch from start to end (see launch.h).
#include "launcher/launch.h"

#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "google/protobuf/text_format.h"
#include "launcher/coordinator_service.h"
#include "launcher/health_gate.h"
#include "launcher/job_plan.h"
#include "launcher/progress.h"
#include "launcher/report.h"
#include "launcher/run_dir.h"
#include "launcher/sweep_report.h"
#include "launcher/supervisor.h"
#include "launcher/worker_binary.h"
#include "models/model_description.h"

namespace stagehand {
namespace {


std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  ssize_t n = getrandom(raw.data(), raw.size(), 0);
  if (n != bytes) LOG(FATAL) << "getrandom failed: " << std::strerror(errno);
  return absl::BytesToHexString(raw);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

// The run directory: --run_dir, else the job file's run_dir, else a new one under runs/.
std::string RunDirOf(const LaunchOptions& options, const JobSpec& spec, const std::string& job_id) {
  if (!options.run_dir.empty()) return UserPath(options.run_dir);
  if (!spec.run_dir().empty()) return spec.run_dir();  // resolved against the user's directory already
  return UserPath(absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-",
                               spec.name(), "-", job_id));
}

// What a launch needs once everything that can refuse the job has said yes.
struct Checked {
  ResolvedJob job;
  std::string worker;
  std::string run_dir;
};

// Everything that can refuse the job without starting anything: the job, the worker binary, the
// model's fit, the run directory (new or empty unless --overwrite). Creates nothing, so a sweep can
// ask it of every point before the first runs.
absl::StatusOr<Checked> CheckLaunch(const LaunchOptions& options, const std::string& job_id) {
  absl::StatusOr<ValidatedLaunch> valid = ValidateLaunch(options, QueryDevices());
  if (!valid.ok()) return valid.status();
  const std::string run_dir = RunDirOf(options, valid->job.spec, job_id);
  if (absl::Status s = CheckRunDir(run_dir, options.overwrite); !s.ok()) return s;
  return Checked{std::move(valid->job), std::move(valid->worker_binary), run_dir};
}

// The first failed write of the run's results; later ones are printed but the first is the cause.
class WriteErrors {
 public:
  // Prints the line (naming the path and the error) and keeps the first.
  void Add(const absl::Status& s, const char* then = "") {
    if (s.ok()) return;
    std::fprintf(stdout, "stagehand: %s%s\n", Message(s).c_str(), then);
    std::fflush(stdout);
    if (first_.ok()) first_ = s;
  }
  bool any() const { return !first_.ok(); }
  const absl::Status& first() const { return first_; }

 private:
  absl::Status first_;
};

// The summary line: what the run achieved and where the time went. MFU only against a GPU's peak,
// the bubble only when the workers timed their actions.
void PrintSummary(const RunReport& report, const std::vector<ReportStepRequest>& steps, bool gpu) {
  std::string line = absl::StrFormat("stagehand: %.4f s/step  %.0f tokens/s  %.1f TFLOP/s", report.step_seconds(),
                                     report.tokens_per_second(), report.tflops());
  if (gpu) absl::StrAppend(&line, absl::StrFormat("  MFU %.1f%%", 100 * report.mfu()));
  if (HasActionTiming(steps)) {
    absl::StrAppend(&line, "  bubble");
    for (const RankReport& r : report.ranks()) absl::StrAppend(&line, absl::StrFormat(" %.1f%%", 100 * r.bubble_fraction()));
  }
  std::printf("%s (after %d warm-up steps)\n", line.c_str(), static_cast<int>(report.warmup_steps()));
}

RunReport BuildRunReport(const CoordinatorState& state, const Supervisor& supervisor, const LaunchOptions& options,
                         int exit_code, const std::string& root_cause) {
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
  in.layers.resize(in.hosts.size(), {0, 0});
  // A GPU's peak means nothing for CPU workers: no peak, so no MFU.
  in.peak_tflops_per_device = state.job().device() == "cuda" ? options.peak_tflops_per_device : 0;
  in.warmup_steps = std::min<int64_t>(3, std::max<int64_t>(0, state.job().steps() - 1));
  for (const RankLedger& l : supervisor.Ledger()) {
    if (l.first_step) in.launch_to_first_step_seconds = std::max(in.launch_to_first_step_seconds, absl::ToDoubleSeconds(*l.first_step));
  }
  return BuildReport(in);
}

// For each worker that failed at an action of its schedule: the rank-by-step grid of the whole
// schedule with that action marked (torch.distributed.pipelining prints the same on failure).
void PrintFailedActions(const CoordinatorState& state) {
  const std::optional<Partition> partition = state.partition();
  if (!partition) return;
  const std::vector<WorkerState> workers = state.Workers();
  for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
    if (workers[r].failed_action < 0) continue;
    absl::StatusOr<std::string> grid = FailureGrid(*partition, r, workers[r].failed_action);
    if (grid.ok()) std::printf("stagehand: rank %d failed at the marked action of its schedule:\n%s", r, grid->c_str());
  }
}

// The run as it goes: step reports appended to steps.csv as they arrive; a failed write stops the
// workers (the run cannot keep its results), as SIGTERM would.
struct RunFiles {
  StepsCsv steps;
  size_t written = 0;  // step reports appended so far
  WriteErrors errors;
  bool stopped_for_error = false;

  void AppendNew(const CoordinatorState& state, Supervisor& supervisor) {
    std::vector<ReportStepRequest> fresh = state.StepsSince(written);
    written += fresh.size();
    if (fresh.empty() || errors.any()) return;
    if (absl::Status s = steps.Append(fresh); !s.ok()) {
      errors.Add(s, "; stopping the run");
      stopped_for_error = true;
      supervisor.Interrupt(SIGTERM, /*force=*/false);
    }
  }
};

const char* SignalText(int sig) {
  return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP";
}

// Runs the supervisor until every worker is gone, feeding it signals and writing steps.csv as the
// reports arrive. SIGHUP (the terminal went away) is handled as SIGTERM: a graceful stop whose results
// are written, exit 143. Returns the first signal taken, 0 for none.
int Supervise(Supervisor& supervisor, const CoordinatorState& state, Progress& progress, RunFiles& files) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  int interrupts = 0;
  int first_signal = 0;
  while (!supervisor.Tick()) {
    progress.Update(state);
    files.AppendNew(state, supervisor);
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&set, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      ++interrupts;
      if (first_signal == 0) first_signal = sig;
      progress.Done();
      std::fprintf(stdout, "stagehand: %s: %s%s\n", SignalText(sig), sig == SIGHUP ? "as for SIGTERM, " : "",
                   interrupts == 1 ? "stopping the workers (again to kill them at once)" : "killing the workers");
      std::fflush(stdout);
      supervisor.Interrupt(sig == SIGINT ? SIGINT : SIGTERM, interrupts > 1);
    }
  }
  return first_signal;
}

// The run's verdict: a failed write of its results comes first (exit 5: the run directory is not
// what the run did), then the supervisor's.
std::pair<int, std::string> Verdict(const Supervisor& supervisor, const RunFiles& files, int first_signal) {
  std::string cause = supervisor.root_cause();
  if (first_signal == SIGHUP && supervisor.exit_code() == 128 + SIGTERM) cause = "interrupted by SIGHUP (handled as SIGTERM)";
  if (!files.errors.any()) return {supervisor.exit_code(), cause};
  std::string text = Message(files.errors.first());
  // The workers' own failure, if one came before ours stopped them, is worth keeping.
  if (supervisor.exit_code() != kExitSuccess && !(files.stopped_for_error && supervisor.exit_code() == 128 + SIGTERM)) {
    absl::StrAppend(&text, "; before that: ", cause);
  }
  return {kExitWriteFailed, text};
}

// The files written once the workers are gone, each whole or absent: the ledger, trace.json, then
// report.json last, so that it records whether the others were written.
RunReport FinishRun(const CoordinatorState& state, Supervisor& supervisor, const LaunchOptions& options,
                    const std::string& run_dir, RunFiles& files, int first_signal, int& exit_code) {
  files.AppendNew(state, supervisor);  // the reports that came with the last exits
  if (!files.errors.any()) files.errors.Add(files.steps.Close());
  const bool gpu = state.job().device() == "cuda";
  files.errors.Add(WriteLedger(supervisor.Ledger(), supervisor.launch_time(), gpu, run_dir + "/startup_ledger.tsv"));
  files.errors.Add(WriteFileAtomically(run_dir + "/trace.json", ChromeTrace(state.Steps(), state.job().workers())));
  auto [code, cause] = Verdict(supervisor, files, first_signal);
  RunReport report = BuildRunReport(state, supervisor, options, code, cause);
  if (absl::StatusOr<std::string> json = ReportJson(report); json.ok()) {
    files.errors.Add(WriteFileAtomically(run_dir + "/report.json", *json));
  } else {
    files.errors.Add(json.status());
  }
  std::tie(code, cause) = Verdict(supervisor, files, first_signal);  // report.json itself may have failed
  report.set_exit_code(code);
  report.set_root_cause(cause);
  if (IsModelJob(state.job()) && report.step_seconds() > 0) PrintSummary(report, state.Steps(), gpu);
  if (const std::string line = GpuSummaryLine(report); !line.empty()) std::printf("stagehand: GPU: %s\n", line.c_str());
  exit_code = code;
  return report;
}

}  // namespace

// Everything a launch checks before it creates anything: the job (ResolveJob), the worker binary,
// the model's schedule and memory, the coordinator's address. INVALID_ARGUMENT is exit 2.
absl::StatusOr<ValidatedLaunch> ValidateLaunch(const LaunchOptions& options, const DeviceInventory& inventory) {
  absl::StatusOr<ResolvedJob> job = ResolveJob(options.job, inventory);
  if (!job.ok()) return job.status();
  absl::StatusOr<std::string> worker = FindWorker(options.worker_binary);
  if (!worker.ok()) return worker.status();
  if (IsModelJob(job->spec)) {
    if (absl::Status s = CheckModelJob(job->spec, job->gpus, inventory.memory_bytes); !s.ok()) return s;
  }
  if (absl::StatusOr<std::string> a = LoopbackListenAddress(options.coordinator_address); !a.ok()) return a.status();
  return ValidatedLaunch{*std::move(job), *std::move(worker)};
}

LaunchResult Launch(const LaunchOptions& options) {
  LaunchResult result;
  result.exit_code = kExitUsage;
  const std::string job_id = RandomHex(4);
  absl::StatusOr<Checked> checked = CheckLaunch(options, job_id);
  if (!checked.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(checked.status()).c_str());
    return result;
  }
  ResolvedJob& job = checked->job;
  const std::string& run_dir = checked->run_dir;
  std::string text;
  google::protobuf::TextFormat::PrintToString(job.spec, &text);

  job.spec.set_run_dir(run_dir);
  CoordinatorState state(job.spec, job_id, RandomHex(32));
  if (IsModelJob(job.spec)) state.SetPartitioner(Partitioner(job.spec));
  state.SetAdmission(HealthAdmission(job.spec));  // the GPU health gate (--health)
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options.coordinator_address, &state);
  if (!server.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(server.status()).c_str());
    result.exit_code = server.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitLaunchFailed;
    return result;
  }
  // Created only now, after everything that can refuse the job, so a refusal leaves nothing behind.
  if (absl::Status s = PrepareRunDir(run_dir, options.overwrite); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
    return result;
  }
  result.run_dir = run_dir;
  // Printed once nothing can refuse the job any more, so a refusal is one line.
  for (const std::string& note : job.notes) std::printf("stagehand: %s\n", note.c_str());
  RunFiles files;
  files.errors.Add(WriteFileAtomically(run_dir + "/job.textproto", text));
  if (!files.errors.any()) {
    files.errors.Add(files.steps.Open(run_dir + "/steps.csv", job.spec.device() == "cuda" && job.spec.telemetry()));
  }
  if (files.errors.any()) {
    result.exit_code = kExitWriteFailed;
    return result;
  }
  std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner();
  SupervisorOptions so{checked->worker, (*server)->address(), run_dir, WorkerEnvironment(job.spec.workers()), job.gpus,
                       options.launch};
  Supervisor supervisor(&state, spawner.get(), so);
  std::printf("stagehand: job %s: %d %s worker%s, %lld steps of %s; coordinator %s; run directory %s\n", job_id.c_str(),
              job.spec.workers(), job.spec.device() == "cuda" ? "GPU" : "CPU",
              job.spec.workers() == 1 ? "" : "s", static_cast<long long>(job.spec.steps()), job.spec.model().c_str(),
              (*server)->address().c_str(), run_dir.c_str());
  std::fflush(stdout);
  result.started = true;
  (void)supervisor.Start();
  Progress progress(options.progress_bar);
  const int first_signal = Supervise(supervisor, state, progress, files);
  progress.Update(state);
  progress.Done();
  const absl::Duration elapsed = absl::Now() - supervisor.launch_time();
  (*server)->Stop();
  result.report = FinishRun(state, supervisor, options, run_dir, files, first_signal, result.exit_code);
  if (result.exit_code == kExitSuccess) {
    std::printf("stagehand: done: %d workers, %lld steps in %.2f s; run directory %s\n", job.spec.workers(),
                static_cast<long long>(job.spec.steps()), absl::ToDoubleSeconds(elapsed), run_dir.c_str());
  } else {
    PrintFailedActions(state);
    std::printf("stagehand: FAILED (exit %d): %s; %lld of %lld steps done; run directory %s\n", result.exit_code,
                result.report.root_cause().c_str(), static_cast<long long>(result.report.steps_done()),
                static_cast<long long>(job.spec.steps()), run_dir.c_str());
  }
  std::fflush(stdout);
  return result;
}

}  // namespace stagehand

namespace stagehand {

namespace {

// The runs of a sweep: one LaunchOptions per count that can run here, and the points skipped.
struct SweepPlan {
  std::vector<SweepPoint> points;         // in the order asked, skipped ones with their note
  std::vector<LaunchOptions> runs;        // per point; run only where points[i].note is empty
  bool cpu = false;
};

SweepPlan PlanSweep(const LaunchOptions& options, const std::vector<int>& counts, const std::string& base) {
  SweepPlan plan;
  const DeviceInventory inventory = QueryDevices();
  plan.cpu = options.job.device == "cpu" || (options.job.device != "cuda" && inventory.gpus.empty());
  for (int n : counts) {
    SweepPoint p;
    p.workers = p.stages = n;
    if (!plan.cpu && n > static_cast<int>(inventory.gpus.size())) {
      p.note = absl::StrCat(n, " GPUs asked, ", inventory.gpus.size(), " visible");
    }
    LaunchOptions o = options;
    o.run_dir = absl::StrCat(base, "/workers_", n);
    if (plan.cpu) o.job.workers = n; else o.job.gpus = n;
    o.job.pipeline_stages = n;
    plan.points.push_back(p);
    plan.runs.push_back(o);
  }
  return plan;
}

}  // namespace

int Sweep(const LaunchOptions& options, const std::vector<int>& counts) {
  const std::string base = UserPath(options.run_dir.empty()
                                        ? absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                                                                 absl::LocalTimeZone()), "-sweep")
                                        : options.run_dir);
  SweepPlan plan = PlanSweep(options, counts, base);
  // Every point is checked before the first runs, so that a count the job cannot take is refused with
  // nothing started (exit 2) rather than after the others ran.
  if (absl::Status s = CheckRunDir(base, options.overwrite); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
    return kExitUsage;
  }
  for (size_t i = 0; i < plan.points.size(); ++i) {
    if (!plan.points[i].note.empty()) continue;
    // The per-count directories are cleared with the base under --overwrite, so only the base's
    // state matters here.
    LaunchOptions o = plan.runs[i];
    o.overwrite = true;
    if (absl::StatusOr<Checked> c = CheckLaunch(o, "check"); !c.ok()) {
      std::fprintf(stderr, "stagehand: sweep: %d workers: %s\n", plan.points[i].workers, Message(c.status()).c_str());
      return kExitUsage;
    }
  }
  struct stat st;
  const bool base_existed = stat(base.c_str(), &st) == 0;
  if (absl::Status s = PrepareRunDir(base, options.overwrite); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
    return kExitUsage;
  }
  int exit_code = kExitSuccess;
  bool any_started = false;
  std::string results_model;  // the model the runs ran (the default when none was asked for)
  for (size_t i = 0; i < plan.points.size(); ++i) {
    SweepPoint& p = plan.points[i];
    if (!p.note.empty()) {
      std::printf("stagehand: sweep: skipping %d workers: %s\n", p.workers, p.note.c_str());
      continue;
    }
    LaunchOptions o = plan.runs[i];
    o.launch = absl::Now();  // each run's ledger counts from its own start
    std::printf("stagehand: sweep: %d worker%s\n", p.workers, p.workers == 1 ? "" : "s");
    std::fflush(stdout);
    LaunchResult r = Launch(o);
    // 2 says "nothing started"; once a run of the sweep has, a refused point is a run that could not
    // be started.
    if (r.exit_code == kExitUsage && any_started) r.exit_code = kExitLaunchFailed;
    any_started = any_started || r.started;
    p.ok = r.exit_code == kExitSuccess;
    if (!p.ok) {
      p.note = absl::StrCat("exit ", r.exit_code, r.report.root_cause().empty() ? "" : ": ", r.report.root_cause());
      if (exit_code == kExitSuccess) exit_code = r.exit_code;
    }
    p.run_dir = r.run_dir;
    if (!r.report.job().model().empty()) results_model = r.report.job().model();
    p.step_seconds = r.report.step_seconds();
    p.tokens_per_second = r.report.tokens_per_second();
    p.micro_batches = r.report.job().pipeline().micro_batches();
    for (const RankReport& rank : r.report.ranks()) p.peak_memory_bytes.push_back(rank.peak_memory_bytes());
    if (!r.started) break;  // the job itself is refused: every count would be
  }
  if (!any_started && exit_code == kExitUsage) {
    if (!base_existed) rmdir(base.c_str());  // nothing started: leave nothing behind
    return exit_code;
  }
  const std::string model = !results_model.empty() ? results_model : options.job.model;
  const std::string title = absl::StrCat("stagehand sweep: ", model, plan.cpu ? " on CPU workers" : " on GPUs");
  WriteErrors errors;
  errors.Add(WriteFileAtomically(base + "/sweep.csv", SweepCsv(plan.points)));
  errors.Add(WriteFileAtomically(base + "/sweep.md", SweepMarkdown(plan.points, title)));
  errors.Add(WriteFileAtomically(base + "/sweep.svg", SweepSvg(plan.points, title)));
  std::printf("%s\n", SweepMarkdown(plan.points, title).c_str());
  if (!errors.any()) std::printf("stagehand: sweep written to %s (sweep.csv, sweep.md, sweep.svg)\n", base.c_str());
  return errors.any() ? kExitWriteFailed : exit_code;
}

}  // namespace stagehand
