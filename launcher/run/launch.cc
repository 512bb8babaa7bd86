// One launch from start to end (see launch.h).
#include "launcher/run/launch.h"

#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/readahead.h"
#include "google/protobuf/text_format.h"
#include "launcher/coordinator/coordinator_service.h"
#include "launcher/plan/job_plan.h"
#include "launcher/multihost/node_agent.h"
#include "launcher/run/progress.h"
#include "launcher/run/report.h"
#include "launcher/job/run_dir.h"
#include "launcher/run/sweep_report.h"
#include "launcher/supervise/supervisor.h"
#include "launcher/job/worker_binary.h"
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

// SIGINT, SIGTERM and SIGHUP while the job is checked, before anything is created: main() blocks them
// in every thread (so that Supervise takes them with sigtimedwait once workers run), and a check can
// take seconds (a large token file scanned, a checkpoint's SHA-256). This thread takes them meanwhile
// and ends the launcher at once, 130 (SIGINT) or 143, nothing having been created. Stopped before
// anything is; a signal after that stays pending for Supervise. Does nothing where the
// signals are not blocked (a test calling Launch() in its own process).
class ValidationSignalWatcher {
 public:
  ValidationSignalWatcher() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    sigaddset(&set_, SIGHUP);
    sigset_t blocked;
    if (pthread_sigmask(SIG_BLOCK, nullptr, &blocked) != 0) return;
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      if (!sigismember(&blocked, sig)) return;
    }
    thread_ = std::thread([this] { Watch(); });
  }
  ~ValidationSignalWatcher() { Stop(); }
  ValidationSignalWatcher(const ValidationSignalWatcher&) = delete;
  ValidationSignalWatcher& operator=(const ValidationSignalWatcher&) = delete;

  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Watch() {
    while (!stop_) {
      timespec tick{0, 20 * 1000 * 1000};
      const int sig = sigtimedwait(&set_, nullptr, &tick);
      if (sig != SIGINT && sig != SIGTERM && sig != SIGHUP) continue;
      // Raw write and _exit: nothing to flush or unwind, and the other threads only read.
      const std::string line = absl::StrCat("stagehand: ",
                                            sig == SIGINT    ? "SIGINT"
                                            : sig == SIGTERM ? "SIGTERM"
                                                             : "SIGHUP",
                                            " while the job was being checked: stopped, nothing was started\n");
      ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
      (void)ignored;
      _exit(sig == SIGINT ? kExitInterrupted : 128 + SIGTERM);
    }
  }

  sigset_t set_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Tests only (tests/launcher_test.cc, tests/serve_test.cc): a check that takes this many milliseconds
// (at most 60000), to stop the launcher or the job server with a signal while a job is checked.
void TestOnlySlowValidation() {
  const char* ms = std::getenv("STAGEHAND_TEST_SLOW_VALIDATION_MS");
  if (ms != nullptr) absl::SleepFor(absl::Milliseconds(std::clamp(std::atoi(ms), 0, 60000)));
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

// A foreground run's output: stdout (the bounded terminal writer, once main captured it).
// Refusals before anything started go to stderr, as the checks' own.
class StdoutListener : public JobListener {
 public:
  void Text(absl::string_view text) override {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  }
  void Refusal(absl::string_view line) override {
    std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  }
};

// Runs the job until every worker is gone, feeding it signals. SIGHUP (the terminal went away) is
// handled as SIGTERM: a graceful stop whose results are written, exit 143; with checkpoints on, a
// checkpoint first (JobRun::CheckpointAndStop, exit 75). Returns the first signal taken, 0 for none.
int Supervise(JobRun& run, JobListener& out) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGCHLD);
  int interrupts = 0;
  int first_signal = 0;
  while (!run.Tick()) {
    timespec tick{0, 20 * 1000 * 1000};
    siginfo_t info;
    int sig = sigtimedwait(&set, &info, &tick);
    if (sig == SIGINT || sig == SIGTERM || sig == SIGHUP) {
      ++interrupts;
      if (first_signal == 0) first_signal = sig;
      // The first SIGTERM (a preemption, a kill) of a job with checkpoints asks for one first; SIGINT
      // (Ctrl-C) and a second signal stop as always.
      if (interrupts == 1 && sig != SIGINT && run.CheckpointAndStop(SIGTERM)) continue;
      out.Text(InterruptLine(sig, interrupts));
      run.Interrupt(sig == SIGINT ? SIGINT : SIGTERM, interrupts > 1);
    }
  }
  return first_signal;
}

// The first failed write of a sweep's files; later ones are printed but the first is the cause.
class WriteErrors {
 public:
  void Add(const absl::Status& s) {
    if (s.ok()) return;
    std::fprintf(stdout, "stagehand: %s\n", Message(s).c_str());
    std::fflush(stdout);
    if (first_.ok()) first_ = s;
  }
  bool any() const { return !first_.ok(); }

 private:
  absl::Status first_;
};

}  // namespace

// Everything a launch checks before it creates anything: the job (ResolveJob), the worker binary,
// the model's schedule and memory, the coordinator's address. INVALID_ARGUMENT is exit 2.
absl::StatusOr<ValidatedLaunch> ValidateLaunch(const LaunchOptions& options, const DeviceInventory& inventory) {
  TestOnlySlowValidation();
  const bool several = options.node.nodes > 1;
  JobRequest request = options.job;
  // Several hosts: the other nodes' counts come when they join, and the job is resolved again for the
  // whole world then (WorldResolver). Until then, the pipeline is checked at the stages asked for.
  if (several && options.job.flags.pipeline().has_stages())
    request.world_workers = options.job.flags.pipeline().stages();
  absl::StatusOr<ResolvedJob> job = ResolveJob(request, inventory);
  if (!job.ok()) return job.status();
  if (several) job->spec.set_workers(job->host_workers);  // node 0's part until the world is fixed
  absl::StatusOr<std::string> worker = FindWorker(options.worker_binary);
  if (!worker.ok()) return worker.status();
  if (IsModelJob(job->spec) && !several) {
    if (absl::Status s = CheckModelJob(job->spec, job->gpus, inventory.memory_bytes); !s.ok()) return s;
  }
  NodeOptions node = options.node;
  node.coordinator_address = options.coordinator_address;
  if (absl::Status s = CheckNodeOptions(node, options.tls, options.job_token_file); !s.ok()) return s;
  if (absl::StatusOr<std::string> a = ListenAddress(options.coordinator_address, options.tls.enabled()); !a.ok()) {
    return a.status();
  }
  return ValidatedLaunch{*std::move(job), *std::move(worker)};
}

namespace {

// Node 0 of several hosts: the job resolved again once every node has joined, for the world's
// workers (the pipeline's stages, micro-batches and partition), and the model checked against every
// node's GPUs. The CPU workers' memory was checked on each host for its own count.
std::function<absl::StatusOr<JobSpec>(int, const std::vector<NodeState>&)> WorldResolver(const LaunchOptions& options) {
  return [request = options.job](int world, const std::vector<NodeState>& nodes) -> absl::StatusOr<JobSpec> {
    JobRequest r = request;
    r.world_workers = world;
    absl::StatusOr<ResolvedJob> job = ResolveJob(r, QueryDevices());
    if (!job.ok()) return job.status();
    if (IsModelJob(job->spec)) {
      std::vector<GpuInfo> gpus = job->gpus;
      for (size_t k = 1; k < nodes.size(); ++k) {
        for (const NodeGpu& g : nodes[k].gpus) gpus.push_back(GpuInfo{0, g.uuid(), g.name(), g.memory_bytes()});
      }
      if (absl::Status s = CheckModelJob(job->spec, gpus, 0); !s.ok()) return s;
    }
    return job->spec;
  };
}

// The library readahead (common/readahead.h), started before anything else of the launch so that the
// workers' libraries are on their way into the page cache while the job is checked and the
// coordinator starts; unless --prefetch_libraries=false. A worker binary that cannot be found reads
// nothing (the launch's own check says so).
void StartPrefetch(const LaunchOptions& options, LibraryPrefetcher& prefetcher) {
  if (options.job.flags.has_prefetch_libraries() && !options.job.flags.prefetch_libraries()) return;
  absl::StatusOr<std::string> worker = FindWorker(options.worker_binary);
  if (worker.ok()) prefetcher.Start(DefaultReadaheadDir(), *worker);
}

// What the readahead did, for the end of the run ("" when there was no list to read).
std::string PrefetchLine(const ReadaheadStats& s) {
  if (s.files + s.skipped == 0) return "";
  return absl::StrFormat("stagehand: library readahead: %d files, %.1f MiB asked in %.2f s%s%s\n", s.files,
                         s.bytes / 1048576.0, s.seconds,
                         s.skipped > 0 ? absl::StrCat(", ", s.skipped, " skipped (changed since recorded)") : "",
                         s.cancelled ? ", cancelled" : "");
}

int LaunchAgent(const LaunchOptions& options) {
  LibraryPrefetcher prefetcher;  // an agent's workers are spawned when node 0's job arrives
  StartPrefetch(options, prefetcher);
  AgentLaunch a;
  a.node = options.node;
  a.node.coordinator_address = options.coordinator_address;
  a.tls = options.tls;
  a.job_token_file = options.job_token_file;
  a.run_dir = options.run_dir;
  a.overwrite = options.overwrite;
  a.worker_binary = options.worker_binary;
  const JobSpec& typed = options.job.flags;
  a.device = typed.device();
  a.gpus = options.job.gpus;
  if (typed.has_workers()) a.workers = typed.workers();
  if (typed.timeouts().has_register_ms()) a.register_timeout_ms = typed.timeouts().register_ms();
  a.launch = options.launch;
  a.program = options.job.program;
  if (absl::Status s = CheckNodeOptions(a.node, a.tls, a.job_token_file); !s.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(s).c_str());
    return kExitUsage;
  }
  return RunAgent(a);
}

// One launch; `watch_signals`: a signal while the job is checked ends the launcher at once
// (ValidationSignalWatcher); a sweep's later runs leave it pending for their supervision instead.
LaunchResult LaunchOne(const LaunchOptions& options, bool watch_signals) {
  LaunchResult result;
  result.exit_code = kExitUsage;
  if (options.node.node_rank > 0) {
    result.exit_code = LaunchAgent(options);
    result.started = result.exit_code != kExitUsage;
    return result;
  }
  std::optional<ValidationSignalWatcher> watcher;
  if (watch_signals) watcher.emplace();
  LibraryPrefetcher prefetcher;
  StartPrefetch(options, prefetcher);
  const std::string job_id = RandomHex(4);
  absl::StatusOr<Checked> checked = CheckLaunch(options, job_id);
  if (!checked.ok()) {
    std::fprintf(stderr, "stagehand: %s\n", Message(checked.status()).c_str());
    return result;
  }
  if (!checked->job.spec.prefetch_libraries()) prefetcher.Cancel();  // the job file said false
  JobRunOptions ro;
  ro.job = std::move(checked->job);
  ro.job_id = job_id;
  ro.secret = RandomHex(32);
  ro.worker_binary = checked->worker;
  ro.run_dir = checked->run_dir;
  ro.overwrite = options.overwrite;
  ro.coordinator_address = options.coordinator_address;
  ro.launch = options.launch;
  ro.peak_tflops_per_device = options.peak_tflops_per_device;
  ro.progress_bar = options.progress_bar;
  ro.nodes = options.node.nodes;
  if (ro.nodes > 1) ro.program = options.job.program;
  ro.tls = options.tls;
  if (options.node.nodes > 1) ro.resolve_world = WorldResolver(options);
  if (!options.job_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadJobToken(options.job_token_file);  // checked: it reads
    if (token.ok()) ro.secret = *token;
  }
  StdoutListener out;
  std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner();
  const std::string run_dir = ro.run_dir;
  if (watcher) watcher->Stop();  // from here on things are created: Supervise takes the signals
  std::unique_ptr<JobRun> run = JobRun::Start(std::move(ro), spawner.get(), &out, result.exit_code);
  if (run == nullptr) {
    if (result.exit_code == kExitWriteFailed) result.run_dir = run_dir;
    return result;
  }
  result.run_dir = run->run_dir();
  result.started = true;
  const int first_signal = Supervise(*run, out);
  prefetcher.Cancel();  // the job is over: what is left of the readahead (nothing, normally) is moot
  // Before the run's closing lines: the last line printed is the verdict (the root cause of a failure).
  JobRunEnd end = run->Finish(first_signal, PrefetchLine(prefetcher.Join()));
  result.exit_code = end.exit_code;
  result.report = std::move(end.report);
  return result;
}

}  // namespace

LaunchResult Launch(const LaunchOptions& options) { return LaunchOne(options, /*watch_signals=*/true); }

}  // namespace stagehand

namespace stagehand {

namespace {

// The runs of a sweep: one LaunchOptions per count that can run here, and the points skipped.
struct SweepPlan {
  std::vector<SweepPoint> points;   // in the order asked, skipped ones with their note
  std::vector<LaunchOptions> runs;  // per point; run only where points[i].note is empty
  bool cpu = false;
};

SweepPlan PlanSweep(const LaunchOptions& options, const std::vector<int>& counts, const std::string& base) {
  SweepPlan plan;
  const DeviceInventory inventory = QueryDevices();
  plan.cpu = options.job.flags.device() == "cpu" || (options.job.flags.device() != "cuda" && inventory.gpus.empty());
  const bool program = !options.job.program.empty();
  for (int n : counts) {
    SweepPoint p;
    p.workers = n;
    p.stages = program ? 0 : n;  // a program is no pipeline of ours: no bubble bound
    if (!plan.cpu && n > static_cast<int>(inventory.gpus.size())) {
      p.note = absl::StrCat(n, " GPUs asked, ", inventory.gpus.size(), " visible");
    }
    LaunchOptions o = options;
    o.run_dir = absl::StrCat(base, "/workers_", n);
    if (plan.cpu)
      o.job.flags.set_workers(n);
    else
      o.job.gpus = n;
    if (!program) o.job.flags.mutable_pipeline()->set_stages(n);
    plan.points.push_back(p);
    plan.runs.push_back(o);
  }
  return plan;
}

}  // namespace

int Sweep(const LaunchOptions& options, const std::vector<int>& counts) {
  const std::string base = UserPath(
      options.run_dir.empty()
          ? absl::StrCat("runs/", absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone()), "-sweep")
          : options.run_dir);
  std::optional<ValidationSignalWatcher> watcher(std::in_place);  // until the base directory is made
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
      std::fprintf(stderr, "stagehand: sweep: %d worker%s: %s\n", plan.points[i].workers,
                   plan.points[i].workers == 1 ? "" : "s", Message(c.status()).c_str());
      return kExitUsage;
    }
  }
  struct stat st;
  const bool base_existed = stat(base.c_str(), &st) == 0;
  watcher.reset();
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
      std::printf("stagehand: sweep: skipping %d worker%s: %s\n", p.workers, p.workers == 1 ? "" : "s", p.note.c_str());
      continue;
    }
    LaunchOptions o = plan.runs[i];
    o.launch = absl::Now();  // each run's ledger counts from its own start
    std::printf("stagehand: sweep: %d worker%s\n", p.workers, p.workers == 1 ? "" : "s");
    std::fflush(stdout);
    LaunchResult r = LaunchOne(o, /*watch_signals=*/false);
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
    p.samples_per_second = r.report.samples_per_second();
    p.micro_batches = r.report.job().pipeline().micro_batches();
    for (const RankReport& rank : r.report.ranks()) p.peak_memory_bytes.push_back(rank.peak_memory_bytes());
    if (!r.started) break;  // the job itself is refused: every count would be
  }
  if (!any_started && exit_code == kExitUsage) {
    if (!base_existed) rmdir(base.c_str());  // nothing started: leave nothing behind
    return exit_code;
  }
  const std::string what = !options.job.program.empty() ? absl::StrJoin(options.job.program, " ")
                           : !results_model.empty()     ? results_model
                                                        : options.job.flags.model();
  const std::string title = absl::StrCat("stagehand sweep: ", what, plan.cpu ? " on CPU workers" : " on GPUs");
  WriteErrors errors;
  errors.Add(WriteFileAtomically(base + "/sweep.csv", SweepCsv(plan.points)));
  errors.Add(WriteFileAtomically(base + "/sweep.md", SweepMarkdown(plan.points, title)));
  errors.Add(WriteFileAtomically(base + "/sweep.svg", SweepSvg(plan.points, title)));
  std::printf("%s\n", SweepMarkdown(plan.points, title).c_str());
  if (!errors.any()) std::printf("stagehand: sweep written to %s (sweep.csv, sweep.md, sweep.svg)\n", base.c_str());
  return errors.any() ? kExitWriteFailed : exit_code;
}

}  // namespace stagehand
