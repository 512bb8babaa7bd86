// One launch from start to end (see launch.h).
#include "launcher/launch.h"

#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "google/protobuf/text_format.h"
#include "launcher/coordinator_service.h"
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








// report.json and trace.json; a summary line of what the run achieved and where the time went.
RunReport WriteReports(const CoordinatorState& state, const Supervisor& supervisor, const LaunchOptions& options,
                       const std::string& run_dir) {
  ReportInput in;
  in.job_id = state.job_id();
  in.job = state.job();
  in.exit_code = supervisor.exit_code();
  in.root_cause = supervisor.root_cause();
  in.steps = state.Steps();
  for (const WorkerState& w : state.Workers()) {
    in.hosts.push_back(w.host);
    in.devices.push_back(w.device.name().empty() ? "cpu" : w.device.name());
  }
  if (std::optional<Partition> p = state.partition()) {
    int first = 0;
    for (int n : p->layers_per_stage) {
      in.layers.push_back({first, first + n});
      first += n;
    }
  }
  in.layers.resize(in.hosts.size(), {0, 0});
  in.peak_tflops_per_device = options.peak_tflops_per_device;
  in.warmup_steps = std::min<int64_t>(3, std::max<int64_t>(0, state.job().steps() - 1));
  for (const RankLedger& l : supervisor.Ledger()) {
    if (l.first_step) in.launch_to_first_step_seconds = std::max(in.launch_to_first_step_seconds, absl::ToDoubleSeconds(*l.first_step));
  }
  RunReport report = BuildReport(in);
  if (absl::StatusOr<std::string> json = ReportJson(report); json.ok()) std::ofstream(run_dir + "/report.json") << *json;
  std::ofstream(run_dir + "/trace.json") << ChromeTrace(in.steps, state.job().workers());
  if (IsModelJob(state.job()) && report.step_seconds() > 0) {
    std::string line = absl::StrFormat("stagehand: %.4f s/step  %.0f tokens/s  %.1f TFLOP/s  MFU %.1f%%  bubble",
                                       report.step_seconds(), report.tokens_per_second(), report.tflops(),
                                       100 * report.mfu());
    for (const RankReport& r : report.ranks()) absl::StrAppend(&line, absl::StrFormat(" %.1f%%", 100 * r.bubble_fraction()));
    std::printf("%s (after %d warm-up steps)\n", line.c_str(), static_cast<int>(report.warmup_steps()));
  }
  return report;
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

// Runs the supervisor until every worker is gone, feeding it signals.
void Supervise(Supervisor& supervisor, const CoordinatorState& state, Progress& progress) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGCHLD);
  int interrupts = 0;
  while (!supervisor.Tick()) {
    progress.Update(state);
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&set, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      ++interrupts;
      progress.Done();
      std::fprintf(stdout, "stagehand: %s: %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM",
                   interrupts == 1 ? "stopping the workers (again to kill them at once)" : "killing the workers");
      std::fflush(stdout);
      supervisor.Interrupt(sig, interrupts > 1);
    }
  }
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

namespace {

// The run directory: --run_dir, else the job file's run_dir, else a new one under runs/.
std::string RunDirOf(const LaunchOptions& options, const JobSpec& spec, const std::string& job_id) {
  if (!options.run_dir.empty()) return UserPath(options.run_dir);
  if (!spec.run_dir().empty()) return spec.run_dir();  // resolved against the user's directory already
  return UserPath(absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-",
                               spec.name(), "-", job_id));
}

}  // namespace

LaunchResult Launch(const LaunchOptions& options) {
  LaunchResult result;
  result.exit_code = kExitUsage;
  absl::StatusOr<ValidatedLaunch> valid = ValidateLaunch(options, QueryDevices());
  if (!valid.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(valid.status().message()).c_str());
    return result;
  }
  ResolvedJob* job = &valid->job;
  const std::string* worker = &valid->worker_binary;
  for (const std::string& note : job->notes) std::printf("stagehand: %s\n", note.c_str());
  const std::string job_id = RandomHex(4);
  const std::string run_dir = RunDirOf(options, job->spec, job_id);
  if (absl::Status s = MakeDirs(run_dir); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(s.message()).c_str());
    return result;
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(job->spec, &text);
  std::ofstream(run_dir + "/job.textproto") << text;

  job->spec.set_run_dir(run_dir);
  CoordinatorState state(job->spec, job_id, RandomHex(32));
  if (IsModelJob(job->spec)) state.SetPartitioner(Partitioner(job->spec));
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start(options.coordinator_address, &state);
  if (!server.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(server.status().message()).c_str());
    result.exit_code = server.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitLaunchFailed;
    return result;
  }
  std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner();
  SupervisorOptions so{*worker, (*server)->address(), run_dir, WorkerEnvironment(job->spec.workers()), job->gpus, options.launch};
  Supervisor supervisor(&state, spawner.get(), so);
  std::printf("stagehand: job %s: %d %s worker%s, %lld steps of %s; coordinator %s; run directory %s\n", job_id.c_str(),
              job->spec.workers(), job->spec.device() == "cuda" ? "GPU" : "CPU",
              job->spec.workers() == 1 ? "" : "s", static_cast<long long>(job->spec.steps()), job->spec.model().c_str(),
              (*server)->address().c_str(), run_dir.c_str());
  std::fflush(stdout);
  result.started = true;
  result.run_dir = run_dir;
  (void)supervisor.Start();
  Progress progress(options.progress_bar, absl::Now());
  Supervise(supervisor, state, progress);
  progress.Update(state);
  progress.Done();
  const absl::Duration elapsed = absl::Now() - supervisor.launch_time();
  (*server)->Stop();
  WriteLedger(supervisor.Ledger(), supervisor.launch_time(), run_dir + "/startup_ledger.tsv");
  WriteSteps(state.Steps(), run_dir + "/steps.csv");
  result.report = WriteReports(state, supervisor, options, run_dir);
  if (supervisor.exit_code() == kExitSuccess) {
    std::printf("stagehand: done: %d workers, %lld steps in %.2f s; run directory %s\n", job->spec.workers(),
                static_cast<long long>(job->spec.steps()), absl::ToDoubleSeconds(elapsed), run_dir.c_str());
  } else {
    PrintFailedActions(state);
    std::printf("stagehand: FAILED (exit %d): %s; run directory %s\n", supervisor.exit_code(),
                supervisor.root_cause().c_str(), run_dir.c_str());
  }
  std::fflush(stdout);
  result.exit_code = supervisor.exit_code();
  return result;
}

}  // namespace stagehand

namespace stagehand {

// The options of one sweep point: `n` workers (CPU) or GPUs, in <base>/workers_<n>.
LaunchOptions PointOptions(const LaunchOptions& options, const std::string& base, bool cpu, int n) {
  LaunchOptions o = options;
  o.run_dir = absl::StrCat(base, "/workers_", n);
  if (cpu) o.job.workers = n; else o.job.gpus = n;
  o.job.pipeline_stages = n;
  return o;
}

int Sweep(const LaunchOptions& options, const std::vector<int>& counts) {
  const std::string base = UserPath(options.run_dir.empty()
                                        ? absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(),
                                                                                 absl::LocalTimeZone()), "-sweep")
                                        : options.run_dir);
  const DeviceInventory inventory = QueryDevices();
  const bool cpu = options.job.device == "cpu" || (options.job.device != "cuda" && inventory.gpus.empty());
  // Every point is checked before the first runs: a sweep whose later point is impossible starts nothing.
  for (int n : counts) {
    if (!cpu && n > static_cast<int>(inventory.gpus.size())) continue;  // skipped with a note below
    absl::StatusOr<ValidatedLaunch> v = ValidateLaunch(PointOptions(options, base, cpu, n), inventory);
    if (!v.ok()) {
      std::fprintf(stderr, "stagehand: --sweep point %d: %s\n", n, std::string(v.status().message()).c_str());
      return kExitUsage;
    }
  }
  if (absl::Status s = MakeDirs(base); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", std::string(s.message()).c_str());
    return kExitUsage;
  }
  std::vector<SweepPoint> points;
  int exit_code = kExitSuccess;
  std::string results_model;  // the model the runs ran (the default when none was asked for)
  for (int n : counts) {
    SweepPoint p;
    p.workers = p.stages = n;
    if (!cpu && n > static_cast<int>(inventory.gpus.size())) {
      p.note = absl::StrCat(n, " GPUs asked, ", inventory.gpus.size(), " visible");
      std::printf("stagehand: sweep: skipping %d workers: %s\n", n, p.note.c_str());
      points.push_back(p);
      continue;
    }
    LaunchOptions o = PointOptions(options, base, cpu, n);
    o.launch = absl::Now();  // each run's ledger counts from its own start
    std::printf("stagehand: sweep: %d worker%s\n", n, n == 1 ? "" : "s");
    std::fflush(stdout);
    LaunchResult r = Launch(o);
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
    points.push_back(p);
    if (!r.started) break;  // the job itself is refused: every count would be
  }
  const std::string model = !results_model.empty() ? results_model : options.job.model;
  const std::string title = absl::StrCat("stagehand sweep: ", model, cpu ? " on CPU workers" : " on GPUs");
  std::ofstream(base + "/sweep.csv") << SweepCsv(points);
  std::ofstream(base + "/sweep.md") << SweepMarkdown(points, title);
  std::ofstream(base + "/sweep.svg") << SweepSvg(points, title);
  std::printf("%s\nstagehand: sweep written to %s (sweep.csv, sweep.md, sweep.svg)\n", SweepMarkdown(points, title).c_str(),
              base.c_str());
  return exit_code;
}

}  // namespace stagehand
