// Supervision of one run (see supervisor.h).
#include "launcher/supervise/supervisor.h"

#include <signal.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

namespace stagehand {
namespace {

// launcher/coordinator/liveness.h's, for this job's heartbeat interval.
absl::Duration StopNotice(const Timeouts& t) { return stagehand::StopNotice(t.heartbeat_interval_ms()); }

// "1 step", "3 steps".
std::string Steps(int64_t n) { return absl::StrCat(n, n == 1 ? " step" : " steps"); }

std::string SignalName(int sig) {
  const char* d = strsignal(sig);
  return absl::StrCat(sig, " (", d ? d : "?", ")");
}

// A line of stagehand's logger at severity E or F: "E12:34:56.789 ...] message" -> "message".
std::optional<absl::string_view> LoggedError(absl::string_view line) {
  if (line.size() < 14 || (line[0] != 'E' && line[0] != 'F') || !absl::ascii_isdigit(line[1]) || line[3] != ':' ||
      line[6] != ':' || line[9] != '.') {
    return std::nullopt;
  }
  const size_t end = line.find("] ");
  if (end == absl::string_view::npos) return std::nullopt;
  return line.substr(end + 2);
}

bool LoggedLine(absl::string_view line) {
  return line.size() >= 14 && (line[0] == 'I' || line[0] == 'W' || line[0] == 'E' || line[0] == 'F') &&
         absl::ascii_isdigit(line[1]) && line[3] == ':' && line[6] == ':' && line[9] == '.';
}

// Printable, one line, at most kLastErrorChars (not cutting a UTF-8 character).
std::string OneLine(absl::string_view text) {
  std::string out;
  for (char c : absl::StripAsciiWhitespace(text)) {
    const unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  if (out.size() > kLastErrorChars) {
    size_t cut = kLastErrorChars - 3;
    while (cut > 0 && (static_cast<unsigned char>(out[cut]) & 0xC0) == 0x80) --cut;
    out = absl::StrCat(out.substr(0, cut), "...");
  }
  return out;
}

}  // namespace

std::string LastErrorLine(absl::string_view log_tail) {
  std::vector<absl::string_view> lines = absl::StrSplit(log_tail, '\n', absl::SkipWhitespace());
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (std::optional<absl::string_view> error = LoggedError(*it)) return OneLine(*error);
  }
  if (std::string python = PythonException(log_tail); !python.empty()) return OneLine(python);
  for (auto it = lines.rbegin(); it != lines.rend(); ++it) {
    if (LoggedLine(*it)) continue;  // stagehand's own info and warnings are no error
    const std::string lower = absl::AsciiStrToLower(*it);
    if (absl::StrContains(lower, "error") || absl::StrContains(lower, "exception") ||
        absl::StrContains(lower, "terminate called")) {
      return OneLine(*it);
    }
  }
  return "";
}

std::string PythonException(absl::string_view log_tail) {
  const size_t tb = log_tail.rfind("Traceback (most recent call last):");
  if (tb == absl::string_view::npos) return "";
  std::vector<absl::string_view> lines = absl::StrSplit(log_tail.substr(tb), '\n', absl::SkipWhitespace());
  std::string where;
  for (size_t i = 1; i < lines.size(); ++i) {
    absl::string_view line = lines[i];
    // torch.distributed prefixes a rank's lines with "[rank1]: ".
    if (absl::StartsWith(line, "[rank")) {
      const size_t close = line.find("]: ");
      if (close != absl::string_view::npos) line.remove_prefix(close + 3);
    }
    absl::string_view frame = absl::StripLeadingAsciiWhitespace(line);
    if (absl::ConsumePrefix(&frame, "File \"")) {  // File "/path/train.py", line 42, in main
      const size_t q = frame.find('"');
      absl::string_view file = frame.substr(0, q);
      absl::string_view rest = q == absl::string_view::npos ? "" : frame.substr(q + 1);
      int line_no = 0;
      if (absl::ConsumePrefix(&rest, ", line ") && absl::SimpleAtoi(rest.substr(0, rest.find(',')), &line_no)) {
        where = absl::StrCat(file.substr(file.rfind('/') + 1), ":", line_no);
      }
      continue;
    }
    // The exception: the first line after the frames that is not indented (a frame's source line
    // is), "Type: message" or a bare "Type".
    if (line.empty() || line[0] == ' ' || line[0] == '\t' || line[0] == '^' || line[0] == '~') continue;
    return where.empty() ? std::string(line) : absl::StrCat(line, " (", where, ")");
  }
  return "";
}

std::string ProgramStepsFile(const std::string& run_dir, int rank) {
  return absl::StrCat(run_dir, "/rank", rank, ".steps");
}

std::optional<ReportStepRequest> ParseProgramStep(absl::string_view line, int rank, int64_t incarnation) {
  ReportStepRequest r;
  r.set_rank(rank);
  r.set_incarnation(incarnation);
  bool has_step = false;
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const size_t eq = field.find('=');
    if (eq == absl::string_view::npos) return std::nullopt;
    const absl::string_view key = field.substr(0, eq), value = field.substr(eq + 1);
    int64_t n = 0;
    double x = 0;
    if (key == "step" && absl::SimpleAtoi(value, &n) && n >= 0) {
      r.set_step(n);
      has_step = true;
    } else if (key == "seconds" && absl::SimpleAtod(value, &x) && x >= 0) {
      r.set_step_seconds(x);
    } else if (key == "loss" && absl::SimpleAtod(value, &x)) {
      r.set_has_loss(true);
      r.set_loss(x);
    } else if (key == "tokens" && absl::SimpleAtoi(value, &n) && n >= 0) {
      r.set_tokens(n);
    } else if (key == "samples" && absl::SimpleAtoi(value, &n) && n >= 0) {
      r.set_samples(n);
    } else if (key == "flops" && absl::SimpleAtod(value, &x) && std::isfinite(x) && x >= 0) {
      r.set_flops(x);
    } else {
      return std::nullopt;  // a key we do not know, or a value that is not one
    }
  }
  if (!has_step) return std::nullopt;
  return r;
}

std::vector<std::string> ProgramEnvironment(const std::vector<std::string>& base, const std::vector<std::string>& extra,
                                            const ProgramRank& r) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", absl::StrCat(r.rank)},
      {"LOCAL_RANK", absl::StrCat(r.local_rank)},
      {"WORLD_SIZE", absl::StrCat(r.world_size)},
      {"LOCAL_WORLD_SIZE", absl::StrCat(r.local_world_size)},
      {"GROUP_RANK", absl::StrCat(r.node)},
      {"GROUP_WORLD_SIZE", absl::StrCat(r.nodes)},
      {"ROLE_RANK", absl::StrCat(r.rank)},
      {"ROLE_WORLD_SIZE", absl::StrCat(r.world_size)},
      {"ROLE_NAME", "default"},
      {"TORCHELASTIC_RESTART_COUNT", absl::StrCat(r.restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", absl::StrCat(r.max_restarts)},
      {"TORCHELASTIC_RUN_ID", r.run_id},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_ERROR_FILE", r.error_file},
      {"STAGEHAND_STEPS_FILE", r.steps_file},
  };
  std::vector<std::string> env;
  auto named = [](const std::string& e, absl::string_view name) {
    return absl::StartsWith(e, name) && e.size() > name.size() && e[name.size()] == '=';
  };
  auto is_set_here = [&](const std::string& e) {
    for (const auto& [name, value] : set) {
      if (named(e, name)) return true;
    }
    return false;
  };
  auto name_of = [](const std::string& e) { return e.substr(0, e.find('=')); };
  for (const std::string& e : base) {
    const bool overridden =
        std::any_of(extra.begin(), extra.end(), [&](const std::string& x) { return named(x, name_of(e)); });
    if (!is_set_here(e) && !overridden) env.push_back(e);
  }
  for (const std::string& e : extra) {
    if (!is_set_here(e)) env.push_back(e);
  }
  for (const auto& [name, fallback] : std::vector<std::pair<std::string, std::string>>{
           {"OMP_NUM_THREADS", "1"}, {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"}, {"PYTHONUNBUFFERED", "1"}}) {
    if (std::none_of(base.begin(), base.end(), [&](const std::string& e) { return named(e, name); })) {
      env.push_back(absl::StrCat(name, "=", fallback));
    }
  }
  for (const auto& [name, value] : set) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

ProgramStepsReader::ProgramStepsReader(std::string run_dir, int first_rank, int ranks)
    : run_dir_(std::move(run_dir)), first_rank_(first_rank), read_(ranks, 0), partial_(ranks) {}

std::vector<ReportStepRequest> ProgramStepsReader::Read(int64_t incarnation) {
  std::vector<ReportStepRequest> steps;
  for (int i = 0; i < static_cast<int>(read_.size()); ++i) {
    const int rank = first_rank_ + i;
    const int fd = open(ProgramStepsFile(run_dir_, rank).c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    char buf[1 << 16];
    for (int reads = 0; reads < 16; ++reads) {  // bounded per call: a flood waits for the next
      const ssize_t n = pread(fd, buf, sizeof buf, read_[i]);
      if (n <= 0) break;
      read_[i] += n;
      partial_[i].append(buf, static_cast<size_t>(n));
    }
    close(fd);
    std::string& pending = partial_[i];
    size_t start = 0;
    for (size_t nl; (nl = pending.find('\n', start)) != std::string::npos; start = nl + 1) {
      if (std::optional<ReportStepRequest> step =
              ParseProgramStep(absl::string_view(pending).substr(start, nl - start), rank, incarnation)) {
        steps.push_back(*std::move(step));
      }
    }
    pending.erase(0, start);
    if (pending.size() > 4096) pending.clear();  // no line is this long: not ours
  }
  return steps;
}

std::string WorkerLastError(const std::string& log_path) {
  const int fd = open(log_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  constexpr off_t kTail = 64 << 10;
  const off_t size = lseek(fd, 0, SEEK_END);
  std::string tail(static_cast<size_t>(std::clamp<off_t>(size, 0, kTail)), '\0');
  const ssize_t n = size > 0 ? pread(fd, tail.data(), tail.size(), size - static_cast<off_t>(tail.size())) : 0;
  close(fd);
  tail.resize(n > 0 ? static_cast<size_t>(n) : 0);
  if (static_cast<off_t>(tail.size()) == kTail) {  // the first line may be cut: drop it
    const size_t newline = tail.find('\n');
    tail.erase(0, newline == std::string::npos ? tail.size() : newline + 1);
  }
  return LastErrorLine(tail);
}

Supervisor::Supervisor(CoordinatorState* state, ProcessSpawner* spawner, SupervisorOptions options,
                       std::function<absl::Time()> now)
    : state_(state),
      spawner_(spawner),
      options_(std::move(options)),
      now_(std::move(now)),
      launch_(options_.launch == absl::InfinitePast() ? now_() : options_.launch),
      slots_(state->job().workers()),
      reported_(state->job().workers(), false),
      non_finite_(state->job().workers(), 0),
      first_non_finite_(state->job().workers(), 0),
      finite_(state->job().workers(), 0),
      attempt_start_(launch_) {
  // An agent watches only its own ranks: the others are not its to wait for.
  for (int r = 0; r < static_cast<int>(slots_.size()); ++r) slots_[r].exited = agent() && !IsLocal(r);
}

bool Supervisor::IsLocal(int rank) const {
  return options_.local_workers < 0 ||
         (rank >= options_.first_rank && rank < options_.first_rank + options_.local_workers);
}

ProcessSpec Supervisor::SpecFor(int index) const {
  const JobSpec& job = state_->job();
  ProcessSpec spec;
  if (program()) {
    // Every GPU of this host's ranks, in rank order: a script indexes them by LOCAL_RANK
    // (torch.cuda.set_device(local_rank)), as under torchrun.
    std::vector<std::string> base, uuids;
    for (const std::string& e : options_.env) {
      if (e.rfind("CUDA_VISIBLE_DEVICES=", 0) != 0 && e.rfind("OMP_NUM_THREADS=", 0) != 0) base.push_back(e);
    }
    if (const char* omp = std::getenv("OMP_NUM_THREADS")) base.push_back(absl::StrCat("OMP_NUM_THREADS=", omp));
    for (const GpuInfo& g : options_.gpus) uuids.push_back(g.uuid);
    base.push_back(absl::StrCat("CUDA_VISIBLE_DEVICES=", job.device() == "cuda" ? absl::StrJoin(uuids, ",") : ""));
    const int local = options_.local_workers < 0 ? static_cast<int>(slots_.size()) : options_.local_workers;
    ProgramRank r;
    r.rank = index;
    r.local_rank = index - options_.first_rank;
    r.world_size = static_cast<int>(slots_.size());
    r.local_world_size = local;
    r.node = options_.node_rank;
    r.nodes = options_.nodes;
    r.restart_count = static_cast<int>(incarnation_ - 1);
    r.max_restarts = job.max_restarts();
    r.run_id = state_->job_id();
    r.error_file = absl::StrCat(options_.run_dir, "/rank", index, ".error.json");
    r.steps_file = ProgramStepsFile(options_.run_dir, index);
    spec.argv.assign(job.program().begin(), job.program().end());
    spec.env = ProgramEnvironment(
        base, options_.program_env ? options_.program_env(incarnation_) : std::vector<std::string>{}, r);
    spec.cwd = job.program_cwd();
    spec.guard = true;  // the program's own children die with the launcher, even by SIGKILL
    spec.output_prefix = absl::StrCat("[rank ", index, "] ");
    spec.log_path = absl::StrCat(options_.run_dir, "/rank", index, ".log");
    return spec;
  }
  spec.argv = {options_.worker_binary, absl::StrCat("--coordinator=", options_.coordinator_address),
               absl::StrCat("--job_id=", state_->job_id()), absl::StrCat("--worker_index=", index),
               absl::StrCat("--incarnation=", incarnation_)};
  spec.argv.insert(spec.argv.end(), options_.worker_args.begin(), options_.worker_args.end());
  for (const std::string& e : options_.env) {
    if (e.rfind("CUDA_VISIBLE_DEVICES=", 0) != 0) spec.env.push_back(e);  // set below, once
  }
  // Pinned by UUID, which names the same GPU whatever the launcher's own CUDA_VISIBLE_DEVICES said;
  // CPU workers see no GPU at all.
  std::string visible = job.device() == "cuda" ? options_.gpus[index - options_.first_rank].uuid : "";
  spec.env.push_back("CUDA_VISIBLE_DEVICES=" + visible);
  spec.env.push_back(absl::StrCat("STAGEHAND_WORKER_INDEX=", index));
  spec.output_prefix = absl::StrCat("[rank ", index, "] ");
  spec.log_path = absl::StrCat(options_.run_dir, "/rank", index, ".log");
  spec.secret = state_->secret();
  return spec;
}

absl::Status Supervisor::Start() {
  const int local = options_.local_workers < 0 ? static_cast<int>(slots_.size()) : options_.local_workers;
  // Ranks from `first` on never start; an agent tells node 0 at once, which judges the job.
  auto never_started = [&](int first, const std::string& why) {
    for (int j = first; j < static_cast<int>(slots_.size()); ++j) {
      if (!IsLocal(j)) continue;
      slots_[j].exited = true;
      if (options_.report_spawn_failure) options_.report_spawn_failure(j, why);
    }
  };
  if (state_->job().device() == "cuda" && static_cast<int>(options_.gpus.size()) < local) {
    const std::string why = absl::StrCat(local, " GPU workers but ", options_.gpus.size(), " GPUs given");
    never_started(0, why);
    for (Slot& s : slots_) s.exited = true;
    Record(Kind::kLaunch, kExitLaunchFailed, why);
    return absl::InvalidArgumentError(root_cause());
  }
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (!IsLocal(i)) continue;
    absl::StatusOr<int> pid = spawner_->Spawn(SpecFor(i));
    if (!pid.ok()) {
      never_started(i, std::string(pid.status().message()));
      Record(Kind::kLaunch, kExitLaunchFailed,
             absl::StrCat("could not start worker ", i, ": ", pid.status().message()));
      return pid.status();
    }
    slots_[i].pid = *pid;
    slots_[i].spawned = now_();
  }
  return absl::OkStatus();
}

std::string Supervisor::Describe(int rank) const {
  std::vector<WorkerState> workers = state_->Workers();
  const WorkerState& w = workers[rank];
  const Slot& s = slots_[rank];
  std::string where =
      w.registered ? absl::StrCat(" (host ", w.host, ", pid ", s.pid, ")") : absl::StrCat(" (pid ", s.pid, ")");
  if (state_->nodes() > 1) {
    const int node = state_->NodeOfRank(rank);
    const NodeState n = state_->Nodes()[node];
    const int pid = s.pid > 0 ? s.pid : w.pid;
    where = absl::StrCat(" (node ", node, " at ", n.address, ", host ", w.registered ? w.host : n.host,
                         pid > 0 ? absl::StrCat(", pid ", pid) : "", ")");
  }
  return absl::StrCat("rank ", rank, where);
}

// Every live rank that has not registered, named as Describe() does ("rank 0 (pid 12)", "ranks 0
// (pid 12), 2 (pid 14)"), so that the hang names each worker that did not arrive, not only the first.
std::string Supervisor::Unregistered(const std::vector<WorkerState>& workers) const {
  std::vector<std::string> names;
  for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
    if (slots_[r].exited || workers[r].registered) continue;
    names.push_back(slots_[r].pid > 0 ? absl::StrCat(r, " (pid ", slots_[r].pid, ")")
                                      : absl::StrCat(r, " (node ", state_->NodeOfRank(r), ")"));
  }
  if (names.empty()) return "";
  return absl::StrCat(names.size() == 1 ? "rank " : "ranks ", absl::StrJoin(names, ", "));
}

void Supervisor::Record(Kind kind, int exit_code, std::string text) {
  if (interrupt_signal_ != 0 || sent_term_) return;  // what happens while we stop the run is not a cause
  incidents_.push_back({kind, now_(), exit_code, std::move(text)});
  BeginStop(incidents_.front().text);
}

const Supervisor::Incident* Supervisor::RootIncident() const {
  const Incident* best = nullptr;
  for (const Incident& i : incidents_) {
    if (best == nullptr || i.kind < best->kind) best = &i;  // ties: the earlier one, already in `best`
  }
  return best;
}

int Supervisor::exit_code() const {
  if (const Incident* i = RootIncident()) return i->exit_code;
  return interrupt_signal_ != 0 ? 128 + interrupt_signal_ : kExitSuccess;
}

std::string Supervisor::root_cause() const {
  if (const Incident* i = RootIncident()) {
    if (restarts_ == 0 || waiting_restart_) return i->text;
    return absl::StrCat(i->text, " (after ", restarts_, restarts_ == 1 ? " restart" : " restarts",
                        ", --max_restarts=", state_->job().max_restarts(), ")");
  }
  if (interrupt_signal_ == 0) return "";
  return absl::StrCat("interrupted by ", interrupt_signal_ == SIGINT    ? "SIGINT"
                                         : interrupt_signal_ == SIGTERM ? "SIGTERM"
                                                                        : SignalName(interrupt_signal_));
}

void Supervisor::OnExit(const ProcessExit& e) {
  int rank = -1;
  for (int i = 0; i < static_cast<int>(slots_.size()); ++i) {
    if (slots_[i].pid == e.pid && !slots_[i].exited) rank = i;
  }
  if (rank < 0) return;
  Slot& s = slots_[rank];
  s.exited = true;
  s.exit_code = e.exit_code;
  s.signal = e.signal;
  spawner_->DrainOutput(e.pid, absl::Milliseconds(200));  // its last words come before ours
  if (agent()) return options_.report_exit(rank, e);      // node 0 judges it
  Judge(rank, e.exit_code, e.signal);
}

// Node 0 of several hosts: the exits the agents reported, judged as a local one would be, and the
// agents themselves: one whose connection closed, or that stopped heartbeating, takes its ranks with it.
void Supervisor::CheckRemote() {
  if (state_->nodes() <= 1) return;
  for (const auto& [rank, x] : state_->RemoteExits()) {
    if (rank >= static_cast<int>(slots_.size()) || slots_[rank].exited) continue;
    Slot& s = slots_[rank];
    s.pid = x.pid;
    s.exited = true;
    s.exit_code = x.exit_code;
    s.signal = x.signal;
    if (!x.spawn_error.empty()) {
      Record(Kind::kLaunch, kExitLaunchFailed, absl::StrCat(Describe(rank), " could not be started: ", x.spawn_error));
      continue;
    }
    Judge(rank, x.exit_code, x.signal, &x.last_error);
  }
  const std::vector<NodeState> nodes = state_->Nodes();
  const absl::Time now = now_();
  for (int k = 1; k < static_cast<int>(nodes.size()); ++k) {
    const NodeState& n = nodes[k];
    std::vector<int> live;
    for (int r = n.first_rank; r < n.first_rank + n.workers && r < static_cast<int>(slots_.size()); ++r) {
      if (!slots_[r].exited) live.push_back(r);
    }
    const bool silent = now - n.last_heartbeat > kAgentTimeout;
    if (live.empty() || (!n.lost && !silent)) continue;
    node_lost_ = true;                           // no restart brings its ranks back
    for (int r : live) slots_[r].exited = true;  // its agent stops them, or they died with it
    const std::string what =
        n.lost ? n.lost_reason
               : absl::StrCat("its agent stopped heartbeating (none for ",
                              absl::FormatDuration(absl::Trunc(now - n.last_heartbeat, absl::Milliseconds(1))),
                              "): the host or its network is down, or the agent hangs");
    Record(n.lost ? Kind::kCrash : Kind::kHang, n.lost ? kExitWorkerFailed : kExitWorkerHung,
           absl::StrCat("node ", k, " at ", n.address, " (host ", n.host, ", agent pid ", n.pid, ", ",
                        n.workers == 1 ? absl::StrCat("rank ", n.first_rank)
                                       : absl::StrCat("ranks ", n.first_rank, "-", n.first_rank + n.workers - 1),
                        ") was lost: ", what));
  }
}

void Supervisor::Judge(int rank, int exit_code, int signal, const std::string* remote_error) {
  CheckReports();  // a failure it reported before exiting is the better description
  // The coordinator stopped the job by itself (the health gate refused a GPU, the model could not be
  // partitioned) and refused this worker's registration: that stop is the cause, though this exit may
  // be reaped before the tick that would notice it.
  if (std::optional<std::string> reason = state_->stop_reason(); reason && !stopping_) {
    Record(Kind::kLaunch, kExitLaunchFailed, *reason);
  }
  const WorkerState w = state_->Workers()[rank];
  if (signal == 0 && exit_code == 0 && w.finished && w.ok) return;
  if (program() && signal == 0 && exit_code == 0) return;                   // a program's success is its exit code
  if (signal == 0 && exit_code == kWorkerExitStopped && stopping_) return;  // it did as told
  // A remote rank's agent signals it the stop notice after the stop reached it: then not a crash (as a
  // local rank's exit after our SIGTERM is none). Before that, a kill is the cause that set it off.
  if (stopping_ && !IsLocal(rank) && (signal == SIGTERM || signal == SIGKILL) &&
      now_() - stop_began_ >= StopNotice(state_->job().timeouts())) {
    return;
  }
  if (signal == 0 && w.finished && !w.ok) return;  // it reported why (an incident if it came first)
  // Once stopping, the coordinator refuses new registrations and a worker that never registered
  // leaves with an error: a consequence of the stop (a missed registration deadline, most often),
  // which must not displace its cause. A signal is still a crash: nothing we sent yet kills.
  if (signal == 0 && stopping_ && !w.registered) return;
  std::string how = signal != 0 ? absl::StrCat("was killed by signal ", SignalName(signal))
                                : absl::StrCat("exited with code ", exit_code);
  // Its own last error line says why, which is otherwise only in its log.
  const std::string error = remote_error != nullptr
                                ? OneLine(*remote_error)
                                : WorkerLastError(absl::StrCat(options_.run_dir, "/rank", rank, ".log"));
  Record(Kind::kCrash, kExitWorkerFailed,
         absl::StrCat(Describe(rank), " ", how, program() ? "" : absl::StrCat(" after ", Steps(w.steps_done)),
                      error.empty() ? "" : ": ", error));
}

void Supervisor::CheckReports() {
  std::vector<WorkerState> workers = state_->Workers();
  for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
    // A failure reported once the job was stopping is most likely a consequence of the stop.
    if (reported_[r] || !workers[r].failed_before_stop) continue;
    reported_[r] = true;
    Record(Kind::kReportedFailure, kExitWorkerFailed,
           absl::StrCat(Describe(r), " failed after ", Steps(workers[r].steps_done), ": ", workers[r].error));
  }
}

// A training run whose loss is NaN or infinite step after step is going nowhere: it stops (exit 1)
// after kNonFiniteLossSteps of them in a row on a rank, and also when it ended with every loss of a
// rank non-finite (`at_end`, a run shorter than that), with one line that says what to change.
void Supervisor::CheckLoss(bool at_end) {
  const JobSpec& job = state_->job();
  if (job.pipeline().inference()) return;  // not training: nothing the learning rate could change
  const std::vector<ReportStepRequest> fresh = state_->StepsSince(steps_seen_);
  steps_seen_ += fresh.size();
  int diverged = -1;
  for (const ReportStepRequest& r : fresh) {
    const int rank = r.rank();
    if (!r.has_loss() || rank < 0 || rank >= static_cast<int>(non_finite_.size())) continue;
    if (std::isfinite(r.loss())) {
      non_finite_[rank] = 0;
      ++finite_[rank];
      continue;
    }
    if (non_finite_[rank]++ == 0) first_non_finite_[rank] = r.step();
    last_loss_ = r.loss();
    if (non_finite_[rank] >= kNonFiniteLossSteps) {
      diverged = rank;  // the line names the first kNonFiniteLossSteps, however many came in this batch
      break;
    }
  }
  for (int rank = 0; at_end && diverged < 0 && rank < static_cast<int>(non_finite_.size()); ++rank) {
    if (non_finite_[rank] > 0 && finite_[rank] == 0) diverged = rank;
  }
  if (diverged < 0) return;
  const int64_t first = first_non_finite_[diverged] + 1, n = non_finite_[diverged];  // steps 1-based, as printed
  Record(Kind::kReportedFailure, kExitWorkerFailed,
         absl::StrCat("the loss was ", std::isnan(last_loss_) ? "NaN" : "infinite", " at ",
                      n == 1 ? absl::StrCat("step ", first)
                             : absl::StrCat(n, " steps in a row (", first, "-", first + n - 1, ")"),
                      " on rank ", diverged, ": the training diverged; pass a lower --lr (this run's: ",
                      absl::StrFormat("%g", job.lr()), ")"));
}

void Supervisor::CheckDeadlines() {
  CheckReports();
  CheckLoss(/*at_end=*/false);
  // The coordinator stopped the job by itself (it could not partition the model, say).
  if (std::optional<std::string> reason = state_->stop_reason(); reason && !stopping_) {
    return Record(Kind::kLaunch, kExitLaunchFailed, *reason);
  }
  if (stopping_) return;  // once stopping, a silent worker is a consequence
  const Timeouts& t = state_->job().timeouts();
  const absl::Time now = now_();
  std::vector<WorkerState> workers = state_->Workers();
  if (program()) {
    // A program never registers nor heartbeats; one that reports its steps (the `stagehand` module)
    // is hung when it stops reporting them. Ranks in one collective stop together: every one that
    // is past the timeout is named, with where each stopped.
    const absl::Duration timeout = absl::Milliseconds(t.progress_timeout_ms());
    bool past = false;
    for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
      past = past || (!slots_[r].exited && workers[r].steps_done > 0 && now - workers[r].last_progress > timeout);
    }
    // Once one rank is past the timeout, every rank silent for half of it is named: the ranks of one
    // collective stopped together, a few milliseconds apart, and none of them is the one to blame.
    std::vector<std::string> stuck;
    for (int r = 0; past && r < static_cast<int>(workers.size()); ++r) {
      const WorkerState& w = workers[r];
      if (slots_[r].exited || w.steps_done == 0 || now - w.last_progress <= timeout / 2) continue;
      stuck.push_back(absl::StrCat(Describe(r), " after ", Steps(w.steps_done)));
    }
    if (!stuck.empty()) {
      Record(Kind::kHang, kExitWorkerHung,
             absl::StrCat("no step reported for ", absl::FormatDuration(absl::Milliseconds(t.progress_timeout_ms())),
                          " by ", absl::StrJoin(stuck, ", ")));
    }
    return;
  }
  if (now - attempt_start_ > absl::Milliseconds(t.register_ms())) {
    if (std::string missing = Unregistered(workers); !missing.empty()) {
      return Record(Kind::kHang, kExitWorkerHung,
                    absl::StrCat(missing, " did not register within ",
                                 absl::FormatDuration(absl::Milliseconds(t.register_ms()))));
    }
  }
  for (int r = 0; r < static_cast<int>(workers.size()); ++r) {
    const WorkerState& w = workers[r];
    if (slots_[r].exited || w.finished || !w.registered) continue;
    if (w.assigned && now - w.last_heartbeat > absl::Milliseconds(t.heartbeat_timeout_ms())) {
      return Record(Kind::kHang, kExitWorkerHung,
                    absl::StrCat(Describe(r), " stopped heartbeating (none for ",
                                 absl::FormatDuration(absl::Trunc(now - w.last_heartbeat, absl::Milliseconds(1))),
                                 ") after ", Steps(w.steps_done)));
    }
    if (now - w.last_progress > absl::Milliseconds(t.progress_timeout_ms())) {
      return Record(Kind::kHang, kExitWorkerHung,
                    absl::StrCat(Describe(r), " made no progress for ",
                                 absl::FormatDuration(absl::Milliseconds(t.progress_timeout_ms())), " (stuck after ",
                                 Steps(w.steps_done), ")"));
    }
  }
}

void Supervisor::BeginStop(const std::string& cause) {
  if (stopping_) return;
  stopping_ = true;
  stop_began_ = now_();
  state_->Stop(cause);
}

void Supervisor::Escalate() {
  const Timeouts& t = state_->job().timeouts();
  const absl::Duration since = now_() - stop_began_;
  auto signal_all = [&](int sig) {
    for (const Slot& s : slots_) {
      if (!s.exited && s.pid > 0) spawner_->SignalGroup(s.pid, sig);
    }
  };
  // A program hears of no stop but our signals: SIGTERM at once.
  const absl::Duration notice = program() ? absl::ZeroDuration() : StopNotice(t);
  if (!sent_term_ && since >= notice) {
    sent_term_ = true;
    signal_all(SIGTERM);
    signal_all(SIGCONT);  // a stopped (SIGSTOP) worker only acts on SIGTERM once it runs again
  }
  if (!sent_kill_ && since >= notice + absl::Milliseconds(t.grace_ms())) {
    sent_kill_ = true;
    signal_all(SIGKILL);
  }
}

// A failure of the workers (not of the launch, which would fail again, nor an interrupt) while
// restarts are left.
bool Supervisor::ShouldRestart() const {
  const Incident* i = RootIncident();
  return interrupt_signal_ == 0 && !restarts_prevented_ && !node_lost_ && i != nullptr && i->kind != Kind::kLaunch &&
         restarts_ < state_->job().max_restarts();
}

// Every worker is gone after a failure: the next incarnation starts after a backoff (1 s, doubling,
// at most 30 s), its workers resuming from the run's newest complete checkpoint (worker/pipeline.h).
void Supervisor::BeginRestart() {
  const std::string cause = root_cause();
  ++restarts_;
  const absl::Duration backoff = std::min(absl::Seconds(30), absl::Seconds(1) * (1 << std::min(restarts_ - 1, 5)));
  // A program resumes from whatever snapshot it keeps; it learns the attempt from TORCHELASTIC_RESTART_COUNT.
  const std::string every = state_->nodes() > 1 ? "every worker on every node" : "every worker";
  const std::string how = program() ? absl::StrCat(every, " again (TORCHELASTIC_RESTART_COUNT=", restarts_, ")")
                                    : absl::StrCat(every, " from the newest checkpoint");
  std::printf("stagehand: restart %d of %d: %s; restarting %s in %s\n", restarts_, state_->job().max_restarts(),
              cause.c_str(), how.c_str(), absl::FormatDuration(backoff).c_str());
  std::fflush(stdout);
  if (absl::Status s = state_->Restart(cause); !s.ok()) LOG(ERROR) << s.message();
  incidents_.clear();
  reported_.assign(reported_.size(), false);
  std::fill(non_finite_.begin(), non_finite_.end(), 0);
  std::fill(finite_.begin(), finite_.end(), 0);
  stopping_ = sent_term_ = sent_kill_ = false;
  for (Slot& s : slots_) s = Slot{0, absl::InfinitePast(), /*exited=*/true, -1, 0};
  ++incarnation_;
  restart_at_ = now_() + backoff;
  waiting_restart_ = true;
}

bool Supervisor::Tick() {
  for (const ProcessExit& e : spawner_->Reap()) OnExit(e);
  if (waiting_restart_) {
    if (interrupt_signal_ != 0) return true;  // stopped during the backoff: nothing runs
    if (now_() < restart_at_) return false;
    waiting_restart_ = false;
    attempt_start_ = now_();
    for (Slot& s : slots_) s = Slot();
    // A failure to spawn is an incident, and the end of the run: the agents are not asked to start.
    if (Start().ok() && !stopping_) state_->StartAttempt();  // several hosts: this attempt's store is up
    return false;
  }
  if (!agent()) {
    CheckRemote();
    CheckDeadlines();
  }
  bool all_gone = true;
  for (const Slot& s : slots_) all_gone = all_gone && s.exited;
  if (all_gone && !agent()) CheckLoss(/*at_end=*/true);
  if (all_gone && ShouldRestart()) {
    BeginRestart();
    return false;
  }
  if (all_gone) return true;
  if (stopping_) Escalate();
  return false;
}

void Supervisor::Fail(int exit_code, const std::string& why) {
  for (Slot& s : slots_) s.exited = true;
  Record(Kind::kLaunch, exit_code, why);
}

void Supervisor::StopWorkers(const std::string& reason) {
  if (!stopping_) BeginStop(reason);
}

void Supervisor::Relaunch(int64_t restart_count) {
  if (state_->stopping()) (void)state_->Restart();  // the agent's own view of the job
  restarts_ = static_cast<int>(restart_count);
  incarnation_ = restart_count + 1;
  incidents_.clear();
  stopping_ = sent_term_ = sent_kill_ = false;
  waiting_restart_ = false;
  attempt_start_ = now_();
  for (int r = 0; r < static_cast<int>(slots_.size()); ++r) {
    slots_[r] = Slot();
    slots_[r].exited = agent() && !IsLocal(r);
  }
  (void)Start();
}

void Supervisor::Interrupt(int signal, bool force) {
  restarts_prevented_ = true;  // a signal ends the run, whatever stopped it first
  // A failure an agent reported before the signal came is its cause: srun --kill-on-bad-exit=1 sends
  // node 0 SIGTERM as soon as the agent of a failed rank exits, maybe before the tick that judges it.
  if (!stopping_) CheckRemote();
  if (!stopping_) {
    interrupt_signal_ = signal;
    BeginStop(root_cause());
  }
  if (!force) return;
  sent_term_ = sent_kill_ = true;
  for (const Slot& s : slots_) {
    if (!s.exited && s.pid > 0) spawner_->SignalGroup(s.pid, SIGKILL);
  }
}

std::vector<RankLedger> Supervisor::Ledger() const {
  std::vector<RankLedger> out;
  std::vector<WorkerState> workers = state_->Workers();
  for (int r = 0; r < static_cast<int>(slots_.size()); ++r) {
    RankLedger l;
    l.rank = r;
    const WorkerState& w = workers[r];
    if (slots_[r].pid > 0 && slots_[r].spawned != absl::InfinitePast()) l.spawned = slots_[r].spawned - launch_;
    if (w.registered) l.registered = w.registered_at - launch_;
    auto milestone = [&](Milestone m) -> std::optional<absl::Duration> {
      auto it = w.milestones.find(m);
      if (it == w.milestones.end()) return std::nullopt;
      return it->second - launch_;  // worker clock: same host, same clock
    };
    l.cuda_ready = milestone(MILESTONE_CUDA_READY);
    l.nccl_ready = milestone(MILESTONE_NCCL_READY);
    l.first_step = milestone(MILESTONE_FIRST_STEP);
    out.push_back(l);
  }
  return out;
}

}  // namespace stagehand
