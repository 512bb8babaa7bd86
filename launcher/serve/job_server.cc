// The server's logic behind `launcher --serve` (see job_server.h).
#include "launcher/serve/job_server.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/input_file.h"
#include "launcher/run/launch.h"
#include "launcher/job/run_dir.h"
#include "launcher/job/worker_binary.h"

namespace stagehand {
namespace {

constexpr char kProtocol[] = "control protocol";
constexpr char kLauncherLog[] = "launcher.log";
constexpr int kControlProtocolVersion = 2;  // 2: commands (SubmitJobRequest.program)

// Why a command job is refused (at submit) or failed (queued when the server restarted) without
// --allow_commands.
constexpr char kNoCommands[] =
    "this server runs no commands (-- PROGRAM): a command runs as the server's user, so it would make "
    "every submit token a shell on the server; its admin may start it with --allow_commands, or run "
    "`launcher [flags] -- PROGRAM` on that host";

std::string RandomHex(int bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < raw.size()) {
    const ssize_t n = getrandom(raw.data() + got, raw.size() - got, 0);
    if (n > 0) got += n;
  }
  return absl::BytesToHexString(raw);
}

// A job's output as events: the launcher's lines (JobListener) and the workers' (the terminal writer
// that the job's spawner forwards them to).
// The launcher's lines go to the events and to <run_dir>/launcher.log (`client logs ID --launcher`);
// the lines that come before the run directory exists are kept until it does.
class EventListener : public JobListener {
 public:
  EventListener(JobEvents* events, std::string run_dir) : events_(events), run_dir_(std::move(run_dir)) {}
  void Text(absl::string_view text) override {
    events_->AddText(text);
    Log(text);
  }
  void Refusal(absl::string_view line) override {
    refusal_ = std::string(line);
    events_->AddLine(line);
    Log(absl::StrCat(line, "\n"));
  }
  void Step(const ReportStepRequest& step) override { events_->AddStep(step); }
  const std::string& refusal() const { return refusal_; }
  // Writes what waited for the run directory, now that it may exist.
  void Flush() { Log(""); }

 private:
  void Log(absl::string_view text) {
    absl::MutexLock lock(&mu_);
    if (!log_.valid()) {
      // Opened once the run directory exists; never through a link.
      log_.reset(::open(absl::StrCat(run_dir_, "/", kLauncherLog).c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644));
    }
    if (!log_.valid()) {
      if (pending_.size() < (1 << 20)) absl::StrAppend(&pending_, text);
      return;
    }
    std::string data = std::exchange(pending_, std::string());
    absl::StrAppend(&data, text);
    for (absl::string_view rest = data; !rest.empty();) {
      const ssize_t n = ::write(log_.get(), rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // a full disk: the events still have the lines
      rest.remove_prefix(static_cast<size_t>(n));
    }
  }

  JobEvents* const events_;
  const std::string run_dir_;
  std::string refusal_;
  absl::Mutex mu_;
  UniqueFd log_;
  std::string pending_;
};

class EventSink : public TerminalSink {
 public:
  explicit EventSink(JobEvents* events) : events_(events) {}
  bool Write(absl::string_view data) override {
    events_->AddText(data);
    return true;
  }
  void Cancel() override {}

 private:
  JobEvents* const events_;
};

// `path` (relative, as a client names it) opened inside `run_dir`, or INVALID_ARGUMENT: no absolute
// path, no "..", no link anywhere on the way, nothing but a regular file. Each component is opened
// relative to the descriptor of the one before with O_NOFOLLOW, so that what is read is what was
// checked: a link swapped in after a check is never followed (there is no check apart from the open).
// O_NONBLOCK: a FIFO planted there opens at once, and fstat then refuses it.
absl::StatusOr<UniqueFd> OpenConfined(const std::string& run_dir, const std::string& path, absl::string_view verb) {
  auto refuse = [&path, verb](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(verb, " ", ClipInput(path), ": ", why,
                                                   "; name a file of the job's run directory, like steps.csv"));
  };
  if (path.empty()) return refuse("no file named");
  if (path[0] == '/') return refuse("an absolute path");
  std::vector<absl::string_view> parts;
  for (absl::string_view part : absl::StrSplit(path, '/')) {
    if (part == "..") return refuse("a path with ..");
    if (!part.empty() && part != ".") parts.push_back(part);
  }
  if (parts.empty()) return refuse("not a file");
  UniqueFd dir(::open(run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!dir.valid()) return absl::NotFoundError(absl::StrCat("the job's run directory is gone: ", run_dir));
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string name(parts[i]);
    const bool last = i + 1 == parts.size();
    const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (last ? 0 : O_DIRECTORY);
    UniqueFd next(::openat(dir.get(), name.c_str(), flags));
    if (!next.valid()) {
      const int err = errno;
      if (err == ENOENT) {
        return absl::NotFoundError(
            absl::StrCat(verb, " ", ClipInput(path), ": no such file in the job's run directory"));
      }
      if (err == ELOOP || err == ENOTDIR) return refuse("a link, or a path through one (links are not followed)");
      return absl::PermissionDeniedError(
          absl::StrCat(verb, " ", ClipInput(path), ": cannot open it: ", ErrnoText(err)));
    }
    dir = std::move(next);
  }
  struct stat st;
  if (::fstat(dir.get(), &st) != 0 || !S_ISREG(st.st_mode)) return refuse("not a regular file");
  return dir;
}

// Up to max_bytes of the open file `fd` (`name` for messages) from `offset`; the file's size.
absl::StatusOr<std::pair<std::string, int64_t>> ReadAt(int fd, absl::string_view name, int64_t offset,
                                                       int64_t max_bytes) {
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat("stat ", name, ": ", ErrnoText(errno)));
  const int64_t size = st.st_size;
  if (offset < 0 || offset > size) {
    return absl::OutOfRangeError(absl::StrCat("offset ", offset, " is outside ", name, " (", size, " bytes)"));
  }
  std::string data(static_cast<size_t>(std::min<int64_t>(max_bytes, size - offset)), '\0');
  size_t got = 0;
  while (got < data.size()) {
    const ssize_t n = pread(fd, data.data() + got, data.size() - got, offset + got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  data.resize(got);
  return std::make_pair(std::move(data), size);
}

// The steps a run did by its steps.csv (the first column, numbered from 0, one row per rank and step):
// the largest step + 1 among the rows of the file's last MiB, where the newest are; 0 without one.
int64_t StepsDoneFromCsv(const std::string& run_dir) {
  if (run_dir.empty()) return 0;
  absl::StatusOr<UniqueFd> fd = OpenConfined(run_dir, "steps.csv", "steps");
  if (!fd.ok()) return 0;
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return 0;
  constexpr int64_t kTail = 1 << 20;
  const int64_t from = std::max<int64_t>(0, st.st_size - kTail);
  absl::StatusOr<std::pair<std::string, int64_t>> read = ReadAt(fd->get(), "steps.csv", from, kTail);
  if (!read.ok()) return 0;
  int64_t done = 0;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(read->first, '\n')) {
    const bool partial = first && from > 0;  // the tail may start inside a row
    first = false;
    if (partial) continue;
    int64_t step = 0;
    if (absl::SimpleAtoi(line.substr(0, line.find(',')), &step) && step >= 0) done = std::max(done, step + 1);
  }
  return done;
}

// `path` (a job's input, `flag` naming it) must be a regular file (`dir`: a directory): opened
// without blocking (O_NONBLOCK: a FIFO's open returns at once) and fstat'd, so that the check that
// reads it next cannot hang on a pipe, a FIFO or a device. INVALID_ARGUMENT naming the flag.
absl::Status CheckInputPath(const std::string& path, absl::string_view flag, bool dir) {
  const std::string shown = absl::StrCat("--", flag, "=", ClipInput(path));
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (dir ? O_DIRECTORY : 0)));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT)
      return absl::InvalidArgumentError(
          absl::StrCat(shown, ": no such ", dir ? "directory" : "file", " on the server"));
    return absl::InvalidArgumentError(absl::StrCat(shown, ": the server cannot open it: ", ErrnoText(err)));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
    return absl::InvalidArgumentError(absl::StrCat(shown, ": not a ", dir ? "directory" : "regular file",
                                                   " (the server reads regular files only, no pipes or devices)"));
  }
  return absl::OkStatus();
}

// `path` (a job's, `flag` naming it) must lie under one of `roots` (each a real path), links resolved;
// a path that does not exist yet (an export directory) is judged by its parent. INVALID_ARGUMENT naming
// the flag and the roots, and nothing of what lies there (not even whether it exists outside them).
absl::Status CheckUnderRoots(const std::string& path, absl::string_view flag, const std::vector<std::string>& roots) {
  const std::string shown = absl::StrCat("--", flag, "=", ClipInput(path));
  auto outside = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat(shown, ": outside the directories this server reads and writes jobs' files in (--job_roots=",
                     absl::StrJoin(roots, ","), "); put the file there and pass its absolute path"));
  };
  if (path.empty() || path[0] != '/') return outside();
  std::string probe = path;
  std::string rest;
  char* real = nullptr;
  // Up to 64 missing parts (an export directory's): their parent must be inside.
  for (int i = 0; i < 64 && (real = ::realpath(probe.c_str(), nullptr)) == nullptr && errno == ENOENT; ++i) {
    const size_t slash = probe.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    const std::string part = probe.substr(slash + 1);
    if (part == ".." || part == ".") return outside();
    rest = absl::StrCat("/", part, rest);
    probe = probe.substr(0, slash);
  }
  if (real == nullptr) return outside();
  const std::string resolved = absl::StrCat(real, rest);
  ::free(real);
  for (const std::string& given : roots) {
    // Each root as a real path now (it may have been made since the start): a root that does not
    // exist holds nothing.
    char* real_root = ::realpath(given.c_str(), nullptr);
    if (real_root == nullptr) continue;
    const std::string root(real_root);
    ::free(real_root);
    if (resolved == root || absl::StartsWith(resolved, root == "/" ? root : root + "/")) return absl::OkStatus();
  }
  return outside();
}

// The server's paths a job names: each under the job roots (CheckUnderRoots), and the ones it reads
// checked by CheckInputPath, before the job is validated.
absl::Status CheckJobInputs(const JobSpec& spec, const std::vector<std::string>& roots) {
  auto check = [&roots](const std::string& path, absl::string_view flag, bool dir) {
    if (absl::Status s = CheckUnderRoots(path, flag, roots); !s.ok()) return s;
    return CheckInputPath(path, flag, dir);
  };
  if (!spec.data().empty() && spec.data() != "synthetic") {
    if (absl::Status s = check(UserPath(spec.data()), "data", false); !s.ok()) return s;
  }
  for (absl::string_view p : absl::StrSplit(spec.layout_profiles(), ',', absl::SkipWhitespace())) {
    if (absl::Status s = check(UserPath(std::string(absl::StripAsciiWhitespace(p))), "layout_profiles", false);
        !s.ok()) {
      return s;
    }
  }
  if (!spec.init_from().empty()) {
    const std::string dir = UserPath(spec.init_from());
    if (absl::Status s = check(dir, "init_from", true); !s.ok()) return s;
    if (::access((dir + "/config.json").c_str(), F_OK) == 0) {
      if (absl::Status s = check(dir + "/config.json", "init_from", false); !s.ok()) return s;
    }
  }
  if (!spec.resume().empty()) {
    if (absl::Status s = check(UserPath(spec.resume()), "resume", true); !s.ok()) return s;
  }
  // Written, not read: only where it would go.
  if (!spec.export_dir().empty()) {
    if (absl::Status s = CheckUnderRoots(UserPath(spec.export_dir()), "export_dir", roots); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

struct JobServer::Validations {
  struct One {
    bool done = false;
    absl::StatusOr<ResolvedJob> result = absl::UnknownError("not checked yet");
    pid_t tid = 0;  // the checking thread's, for setpriority once it is abandoned
  };
  absl::Mutex mu;
  int running ABSL_GUARDED_BY(mu) = 0;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  // By caller, submission id and digest: a client's retry joins the check of its first try.
  std::map<std::string, std::shared_ptr<One>> in_flight ABSL_GUARDED_BY(mu);
};

struct JobServer::Live {
  explicit Live(int64_t first_seq = 1) : events(first_seq) {}
  JobEvents events;
  // Guarded by the server's mu_.
  bool running = false;
  int cancels = 0;  // CancelJob calls while it runs: the second kills at once
  std::string cancelled_by;
  int64_t steps_done = 0;
  // The serve loop's thread only.
  std::unique_ptr<EventListener> listener;
  std::unique_ptr<TerminalWriter> terminal;
  std::unique_ptr<ProcessSpawner> spawner;
  std::unique_ptr<JobRun> run;
  bool interrupted = false;
  bool forced = false;
};

JobServer::JobServer(JobServerOptions options, std::unique_ptr<JobStore> store, std::unique_ptr<Access> access)
    : options_(std::move(options)),
      store_(std::move(store)),
      access_(std::move(access)),
      validations_(std::make_shared<Validations>()),
      queue_(static_cast<int>(options_.inventory.gpus.size()), options_.max_cpu_workers) {}

JobServer::~JobServer() = default;

namespace {

StartCreated WhatAStartWouldCreate(const std::string& state_dir) {
  auto exists = [](const std::string& path) {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
  };
  StartCreated c;
  // The directories, deepest first: runs/, the state directory, and its missing parents.
  for (std::string dir = state_dir + "/runs"; !dir.empty() && dir != "/" && !exists(dir);) {
    c.dirs.push_back(dir);
    const size_t slash = dir.rfind('/');
    if (slash == std::string::npos || slash == 0) break;
    dir = dir.substr(0, slash);
  }
  // The store's files only with a store this start made: an existing one keeps its -wal (and the
  // admin token minted into it keeps its file).
  if (!exists(state_dir + "/jobs.db")) {
    for (const char* name :
         {"jobs.db", "jobs.db-wal", "jobs.db-shm", "jobs.db-journal", "admin.token", ".admin.token.tmp"}) {
      if (!exists(absl::StrCat(state_dir, "/", name))) c.files.push_back(absl::StrCat(state_dir, "/", name));
    }
  }
  if (!exists(state_dir + "/jobs.lock")) c.files.push_back(state_dir + "/jobs.lock");
  return c;
}

}  // namespace

void RemoveCreated(const StartCreated& created) {
  for (const std::string& f : created.files) ::unlink(f.c_str());
  for (const std::string& d : created.dirs) ::rmdir(d.c_str());  // only when empty
}

absl::StatusOr<std::unique_ptr<JobServer>> JobServer::Open(JobServerOptions options, std::vector<std::string>& notes) {
  if (options.state_dir.empty())
    return absl::InvalidArgumentError("--serve needs --state_dir=DIR (the job store and run directories)");
  options.state_dir = UserPath(options.state_dir);
  StartCreated created = WhatAStartWouldCreate(options.state_dir);
  bool locked = false;
  absl::StatusOr<std::unique_ptr<JobServer>> server = OpenAt(std::move(options), notes, locked);
  if (!server.ok()) {
    // Files only when this start held the lock: another server starting beside it owns them.
    if (!locked) created.files.clear();
    RemoveCreated(created);  // OpenAt's store is closed by now
    return server;
  }
  (*server)->created_ = created;
  return server;
}

absl::StatusOr<std::unique_ptr<JobServer>> JobServer::OpenAt(JobServerOptions options, std::vector<std::string>& notes,
                                                             bool& locked) {
  if (options.max_cpu_workers <= 0) options.max_cpu_workers = std::max(1, options.inventory.cpu_cores);
  if (options.job_roots.empty()) options.job_roots = {options.state_dir + "/runs", options.state_dir + "/data"};
  // Before anything is opened: a planted link or a foreign file is refused, not followed.
  if (absl::Status s = CheckStateFiles(options.state_dir); !s.ok()) return s;
  if (absl::Status s = MakeDirs(options.state_dir + "/runs"); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--state_dir=", options.state_dir, ": ", s.message()));
  }
  for (const std::string& root : options.job_roots) {
    if (root.empty() || root[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat("--job_roots=", ClipInput(root), ": pass absolute directories"));
    }
  }
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(options.state_dir);
  if (!store.ok()) return store.status();
  locked = true;
  absl::StatusOr<std::vector<JobRecord>> lost =
      (*store)->MarkRunningLost(absl::Now(), "lost: the server ended while the job ran");
  if (!lost.ok()) return lost.status();
  for (const JobRecord& r : *lost) {
    // Its steps as far as its run directory got (the server that counted them is gone).
    const int64_t steps = StepsDoneFromCsv(r.run_dir);
    if (steps > 0) (void)(*store)->SetStepsDone(r.id, steps);
    notes.push_back(
        absl::StrCat("job ", r.id, " was running when the server ended: marked lost after ", steps, " steps"));
  }
  absl::StatusOr<std::string> admin = EnsureAdminToken(**store, options.state_dir, options.new_admin_token);
  if (!admin.ok()) return admin.status();
  if (!admin->empty()) notes.push_back(*admin);
  auto access = std::make_unique<Access>(store->get());
  if (absl::Status s = access->Load(); !s.ok()) return s;
  std::unique_ptr<JobServer> server(new JobServer(std::move(options), *std::move(store), std::move(access)));
  absl::StatusOr<std::vector<JobRecord>> queued = server->store_->Queued();
  if (!queued.ok()) return queued.status();
  for (const JobRecord& r : *queued) {
    auto live = std::make_shared<Live>();
    absl::MutexLock lock(&server->mu_);
    if (r.spec.program_size() > 0 && !server->options_.allow_commands) {
      (void)server->store_->MarkEnded(r.id, control::JOB_STATE_FAILED, absl::Now(), kExitUsage,
                                      "not run: a command, and the server restarted without --allow_commands "
                                      "(it runs none); submit it again to a server started with it",
                                      0);
      notes.push_back(
          absl::StrCat("job ", r.id, " is a command and this server runs none (no --allow_commands): failed"));
      continue;
    }
    if (absl::Status fit = server->queue_.CanEverFit(r.devices); !fit.ok()) {
      (void)server->store_->MarkEnded(r.id, control::JOB_STATE_FAILED, absl::Now(), kExitUsage,
                                      absl::StrCat("this host can no longer run it: ", fit.message()), 0);
      continue;
    }
    if (absl::Status s = server->queue_.Enqueue(r.id, r.devices); !s.ok()) return s;
    server->live_[r.id] = live;
    notes.push_back(absl::StrCat("job ", r.id, " is queued again"));
    live->events.AddState(server->Info(r), false);
  }
  return server;
}

control::GetServerInfoResponse JobServer::Info() {
  control::GetServerInfoResponse info;
  info.set_version(kVersion);
  info.set_protocol(kControlProtocolVersion);
  info.set_gpus(static_cast<int>(options_.inventory.gpus.size()));
  info.set_cpu_workers(options_.max_cpu_workers);
  info.set_tls(options_.tls);
  info.set_mutual_tls(options_.mutual_tls);
  info.set_allow_commands(options_.allow_commands);
  (void)kProtocol;
  return info;
}

absl::StatusOr<Caller> JobServer::Authenticate(absl::string_view token) { return access_->Authenticate(token); }

control::JobInfo JobServer::Info(const JobRecord& record) const {
  control::JobInfo info = ToJobInfo(record);
  info.set_command(CommandLine(record.spec, 200));  // as inputs are echoed: escaped, clipped
  if (record.state == control::JOB_STATE_QUEUED) info.set_queue_position(queue_.Position(record.id));
  if (auto it = live_.find(record.id); it != live_.end() && it->second->running) {
    info.set_steps_done(it->second->steps_done);
  }
  return info;
}

absl::StatusOr<JobRecord> JobServer::Record(const std::string& id) const {
  absl::StatusOr<std::optional<JobRecord>> r = store_->Get(id);
  if (!r.ok()) return r.status();
  if (!r->has_value())
    return absl::NotFoundError(absl::StrCat("no job ", ClipInput(id), " on this server; `client list` shows them"));
  return **r;
}

std::shared_ptr<JobServer::Live> JobServer::LiveJob(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = live_.find(id);
  return it == live_.end() ? nullptr : it->second;
}

// The submission as a foreground launch would take it: the same validation, against this host, on a
// thread of its own (see JobServerOptions::validate): the caller waits for it up to the deadline or
// the server's shutdown, whichever comes first, and then leaves it.
absl::StatusOr<ResolvedJob> JobServer::Resolve(const Caller& caller, const control::SubmitJobRequest& request) {
  if (absl::Status s = CheckJobInputs(request.job(), options_.job_roots); !s.ok()) return s;
  LaunchOptions lo;
  lo.job.spec = request.job();
  lo.job.spec->clear_run_dir();  // the server's: <state_dir>/runs/<job id>
  // A command job's PROGRAM ARGS, resolved as a foreground launch here would: this host's PATH, the
  // server's directory.
  lo.job.program.assign(request.program().begin(), request.program().end());
  // A resumed job's carried paths (its data, its export) are held to the roots as the sent ones are.
  lo.job.check_resumed = [roots = options_.job_roots](const JobSpec& spec) { return CheckJobInputs(spec, roots); };
  if (request.has_gpus()) lo.job.gpus = request.gpus();
  lo.job.custom_worker = !options_.worker_binary.empty();
  lo.worker_binary = options_.worker_binary;
  lo.coordinator_address = "127.0.0.1:0";
  const std::string key = absl::StrCat(caller.name, "/", request.submission_id(), "/", SubmissionDigest(request));
  const std::shared_ptr<Validations> v = validations_;
  std::shared_ptr<Validations::One> one;
  absl::MutexLock lock(&v->mu);
  if (v->stopping) return absl::UnavailableError("the server is shutting down; submit again once it is back");
  if (auto it = v->in_flight.find(key); it != v->in_flight.end()) {
    one = it->second;
  } else {
    if (v->running >= options_.max_validations) {
      return absl::ResourceExhaustedError(absl::StrCat(v->running, " submissions are being checked already (at most ",
                                                       options_.max_validations,
                                                       " at once); submit again in a few seconds"));
    }
    one = std::make_shared<Validations::One>();
    // The thread owns copies of all it uses: it may outlive this server (abandoned at shutdown).
    auto check = [v, one, key, lo = std::move(lo), inventory = options_.inventory, validate = options_.validate] {
      {
        absl::MutexLock l(&v->mu);
        one->tid = static_cast<pid_t>(::syscall(SYS_gettid));
      }
      absl::StatusOr<ValidatedLaunch> valid = validate(lo, inventory);
      absl::MutexLock l(&v->mu);
      one->result = valid.ok() ? absl::StatusOr<ResolvedJob>(std::move(valid->job)) : valid.status();
      one->done = true;
      --v->running;
      if (auto it = v->in_flight.find(key); it != v->in_flight.end() && it->second == one) v->in_flight.erase(it);
    };
    try {
      std::thread(std::move(check)).detach();
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot start a thread to check the job: ", e.what(), "; submit again in a few seconds"));
    }
    ++v->running;
    v->in_flight[key] = one;
    options_.log(absl::StrCat("checking a submission of ", caller.name));
  }
  auto ready = [&v, &one]() { return one->done || v->stopping; };
  v->mu.AwaitWithTimeout(absl::Condition(&ready), options_.validation_deadline);
  if (one->done) return one->result;
  if (v->stopping) return absl::UnavailableError("the server is shutting down; submit again once it is back");
  if (one->tid > 0) (void)::setpriority(PRIO_PROCESS, static_cast<id_t>(one->tid), 19);  // abandoned: it yields
  return absl::DeadlineExceededError(absl::StrCat(
      "checking the job took over ", absl::FormatDuration(options_.validation_deadline),
      " on the server, and was given up: make it smaller (micro-batches, layers, schedule) or check its input "
      "files"));
}

absl::StatusOr<control::JobInfo> JobServer::Submit(const Caller& caller, const control::SubmitJobRequest& request) {
  if (absl::Status s = Allow(caller, Verb::kSubmit); !s.ok()) return s;
  if (absl::Status s = ValidateName(request.submission_id(), "submission id"); !s.ok()) return s;
  if (request.program_size() > 0 && !options_.allow_commands) return absl::InvalidArgumentError(kNoCommands);
  if (const size_t bytes = request.ByteSizeLong(); bytes > kMaxSubmissionBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the job is ", bytes / 1024, " KiB serialized; this server takes at most ", kMaxSubmissionBytes / 1024,
        " KiB (a --schedule_file or job file that large is too): make it smaller"));
  }
  absl::StatusOr<ResolvedJob> job = Resolve(caller, request);
  if (!job.ok()) return job.status();
  JobRecord record;
  record.id = RandomHex(4);
  record.submission_id = request.submission_id();
  record.submitted_by = caller.name;
  record.state = control::JOB_STATE_QUEUED;
  record.spec = job->spec;
  if (record.spec.device() == "cuda") {
    record.devices.set_gpus(record.spec.workers());
  } else {
    record.devices.set_cpu_workers(record.spec.workers());
  }
  record.submitted = absl::Now();
  record.spec_digest = SubmissionDigest(request);
  absl::MutexLock lock(&mu_);
  if (absl::Status fit = queue_.CanEverFit(record.devices); !fit.ok()) return fit;
  absl::StatusOr<JobRecord> stored = store_->Insert(record);
  if (!stored.ok()) return stored.status();
  if (stored->id != record.id) return Info(*stored);  // a retried submission: the first one's job
  auto live = std::make_shared<Live>();
  live_[record.id] = live;
  if (absl::Status s = queue_.Enqueue(record.id, record.devices); !s.ok()) return s;
  control::JobInfo info = Info(*stored);
  live->events.AddState(info, false);
  options_.log(absl::StrCat("job ", record.id, " (",
                            record.spec.program_size() > 0 ? CommandLine(record.spec, 200) : record.spec.name(),
                            ") from ", caller.name, ": queued"));
  for (const std::string& note : job->notes) live->events.AddLine(absl::StrCat("stagehand: ", note));
  return info;
}

absl::StatusOr<control::JobInfo> JobServer::Get(const Caller& caller, const std::string& id) {
  if (absl::Status s = Allow(caller, Verb::kView); !s.ok()) return s;
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  absl::MutexLock lock(&mu_);
  return Info(*record);
}

absl::StatusOr<control::ListJobsResponse> JobServer::List(const Caller& caller,
                                                          const control::ListJobsRequest& request) {
  if (absl::Status s = Allow(caller, Verb::kView); !s.ok()) return s;
  std::vector<control::JobState> states;
  for (int s : request.states()) states.push_back(static_cast<control::JobState>(s));
  int64_t before_seq = 0;
  if (!request.page_token().empty() && (!absl::SimpleAtoi(request.page_token(), &before_seq) || before_seq <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("page_token '", ClipInput(request.page_token()),
                                                   "' is not one this server gave; list from the start"));
  }
  const int asked = request.page_size() > 0 ? request.page_size() : request.limit() > 0 ? request.limit() : 100;
  const int page = std::min(asked, 1000);
  // One more than the page: whether there is a next page.
  absl::StatusOr<std::vector<JobRecord>> records = store_->List(page + 1, states, before_seq);
  if (!records.ok()) return records.status();
  control::ListJobsResponse out;
  size_t bytes = 0;
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < records->size(); ++i) {
    const JobRecord& r = (*records)[i];
    control::JobInfo info = Info(r);
    const size_t size = info.ByteSizeLong();
    if (out.jobs_size() >= page || (out.jobs_size() > 0 && bytes + size > kMaxListReplyBytes)) {
      out.set_next_page_token(absl::StrCat((*records)[i - 1].seq));
      break;
    }
    bytes += size;
    *out.add_jobs() = std::move(info);
  }
  return out;
}

absl::StatusOr<std::string> JobServer::Delete(const Caller& caller, const std::string& id) {
  if (absl::Status s = Allow(caller, Verb::kDelete); !s.ok()) return s;
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  if (absl::Status s = store_->Delete(id); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  live_.erase(id);  // a watcher holding it reads on
  ended_.erase(std::remove(ended_.begin(), ended_.end(), id), ended_.end());
  options_.log(absl::StrCat("job ", id, ": deleted by ", caller.name,
                            record->run_dir.empty() ? "" : "; its run directory stays: ", record->run_dir));
  return record->run_dir;
}

absl::StatusOr<EventBatch> JobServer::Events(const Caller& caller, const std::string& id, int64_t after_seq, bool lines,
                                             absl::Duration wait) {
  if (absl::Status s = Allow(caller, Verb::kView); !s.ok()) return s;
  EventBatch batch;
  if (std::shared_ptr<Live> live = LiveJob(id)) {
    if (after_seq < 0 || after_seq > live->events.last_seq()) {
      return absl::OutOfRangeError(absl::StrCat("job ", id, " has ", live->events.last_seq(), " events, not ",
                                                after_seq, " (the server restarted?): watch again from 0"));
    }
    JobEvents::Read read = live->events.After(after_seq, lines, absl::Now() + wait);
    batch.events = std::move(read.events);
    batch.ended = read.ended;
    return batch;
  }
  // Ended before this server started (or lost with it): its events are gone, its final state is not.
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  control::JobEvent e;
  e.set_seq(after_seq + 1);
  e.set_time_ms(absl::ToUnixMillis(absl::Now()));
  {
    absl::MutexLock lock(&mu_);
    *e.mutable_state() = Info(*record);
  }
  batch.events.push_back(std::move(e));
  batch.ended = true;
  return batch;
}

absl::StatusOr<control::JobInfo> JobServer::Cancel(const Caller& caller, const std::string& id) {
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  if (absl::Status s = Allow(caller, Verb::kCancel, record->submitted_by); !s.ok()) return s;
  std::shared_ptr<Live> live = LiveJob(id);
  absl::MutexLock lock(&mu_);
  // The queue decides, not the record read above: the serve loop may have granted the job since.
  if (live != nullptr && queue_.Remove(id).ok()) {
    (void)store_->SetCancelledBy(id, caller.name);
    if (absl::Status s = store_->MarkEnded(id, control::JOB_STATE_CANCELLED, absl::Now(), 128 + SIGTERM,
                                           absl::StrCat("cancelled by ", caller.name, " before it started"), 0);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<JobRecord> ended = Record(id);
    if (!ended.ok()) return ended.status();
    control::JobInfo info = Info(*ended);
    live->events.AddState(info, true);
    RetireLocked(id);
    options_.log(absl::StrCat("job ", id, ": cancelled by ", caller.name, " before it started"));
    return info;
  }
  // Granted or running: the serve loop stops it (SIGTERM, then SIGKILL after the grace period; a
  // second cancel kills at once).
  if (live != nullptr && !live->events.ended()) {
    ++live->cancels;
    if (live->cancelled_by.empty()) {
      live->cancelled_by = caller.name;
      (void)store_->SetCancelledBy(id, caller.name);
    }
  }
  return Info(*record);
}

absl::StatusOr<LogRead> JobServer::ReadLog(const Caller& caller, const std::string& id, int rank, int64_t offset,
                                           int64_t max_bytes, absl::Duration wait) {
  if (absl::Status s = Allow(caller, Verb::kView); !s.ok()) return s;
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  if (record->run_dir.empty()) return absl::NotFoundError(absl::StrCat("job ", id, " has not started: no logs yet"));
  if (rank != kLauncherLogRank && (rank < 0 || rank >= record->spec.workers())) {
    return absl::NotFoundError(
        absl::StrCat("job ", id, " has ranks 0 to ", record->spec.workers() - 1, ", not ", rank));
  }
  const std::string name = rank == kLauncherLogRank ? std::string(kLauncherLog) : absl::StrCat("rank", rank, ".log");
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    std::shared_ptr<Live> live = LiveJob(id);
    bool running = false;
    if (live != nullptr) {
      absl::MutexLock lock(&mu_);
      running = live->running;
    }
    absl::StatusOr<UniqueFd> fd = OpenConfined(record->run_dir, name, "logs");
    absl::StatusOr<std::pair<std::string, int64_t>> read =
        fd.ok() ? ReadAt(fd->get(), name, offset, max_bytes)
                : absl::StatusOr<std::pair<std::string, int64_t>>(fd.status());
    if (!read.ok() && !(running && absl::IsNotFound(read.status()))) return read.status();
    LogRead out;
    out.offset = offset;
    if (read.ok()) out.data = std::move(read->first);
    out.ended = !running && read.ok() && offset + static_cast<int64_t>(out.data.size()) >= read->second;
    if (!out.data.empty() || out.ended || absl::Now() >= deadline) return out;
    absl::SleepFor(absl::Milliseconds(100));  // a log grows by lines; a tenth of a second is live enough
  }
}

absl::StatusOr<FileRead> JobServer::ReadFile(const Caller& caller, const std::string& id, const std::string& path,
                                             int64_t offset, int64_t max_bytes) {
  if (absl::Status s = Allow(caller, Verb::kView); !s.ok()) return s;
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return record.status();
  if (record->run_dir.empty()) return absl::NotFoundError(absl::StrCat("job ", id, " has not started: no files yet"));
  absl::StatusOr<UniqueFd> fd = OpenConfined(record->run_dir, path, "fetch");
  if (!fd.ok()) return fd.status();
  absl::StatusOr<std::pair<std::string, int64_t>> read = ReadAt(fd->get(), ClipInput(path), offset, max_bytes);
  if (!read.ok()) return read.status();
  FileRead out;
  out.total_bytes = read->second;
  out.eof = offset + static_cast<int64_t>(read->first.size()) >= read->second;
  out.data = std::move(read->first);
  return out;
}

absl::StatusOr<std::string> JobServer::MintToken(const Caller& caller, const std::string& name, control::Role role) {
  if (absl::Status s = Allow(caller, Verb::kMint); !s.ok()) return s;
  return access_->Mint(name, role);
}

absl::Status JobServer::RevokeToken(const Caller& caller, const std::string& name) {
  if (absl::Status s = Allow(caller, Verb::kMint); !s.ok()) return s;
  return access_->Revoke(name);
}

absl::StatusOr<std::vector<control::TokenInfo>> JobServer::ListTokens(const Caller& caller) {
  if (absl::Status s = Allow(caller, Verb::kMint); !s.ok()) return s;
  absl::StatusOr<std::vector<TokenRecord>> tokens = store_->FindTokens();
  if (!tokens.ok()) return tokens.status();
  std::vector<control::TokenInfo> out;
  for (const TokenRecord& t : *tokens) out.push_back(ToTokenInfo(t));
  return out;
}

// The serve loop.

void JobServer::Tick() {
  std::vector<Grant> grants;
  std::vector<std::pair<std::string, std::shared_ptr<Live>>> running;
  {
    absl::MutexLock lock(&mu_);
    if (!shutting_down_) grants = queue_.Schedule();
  }
  for (const Grant& g : grants) StartGranted(g);
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, live] : live_) {
      if (live->running) running.emplace_back(id, live);
    }
  }
  for (auto& [id, live] : running) Drive(id, *live);
}

void JobServer::StartGranted(const Grant& grant) {
  std::shared_ptr<Live> live = LiveJob(grant.id);
  absl::StatusOr<JobRecord> record = Record(grant.id);
  if (live == nullptr || !record.ok()) {
    absl::MutexLock lock(&mu_);
    (void)queue_.Release(grant.id);
    return;
  }
  JobRunOptions ro;
  ro.job.spec = record->spec;
  for (int ordinal : grant.gpu_ordinals) ro.job.gpus.push_back(options_.inventory.gpus.at(ordinal));
  ro.job_id = record->id;
  ro.secret = RandomHex(32);
  absl::StatusOr<std::string> worker = FindWorker(options_.worker_binary);
  ro.worker_binary = worker.ok() ? *worker : options_.worker_binary;
  ro.run_dir = absl::StrCat(options_.state_dir, "/runs/", record->id);
  ro.coordinator_address = "127.0.0.1:0";
  ro.launch = absl::Now();
  ro.peak_tflops_per_device = options_.peak_tflops_per_device;
  live->listener = std::make_unique<EventListener>(&live->events, ro.run_dir);
  live->terminal = std::make_unique<TerminalWriter>(std::make_unique<EventSink>(&live->events));
  live->spawner = NewPosixProcessSpawner(live->terminal.get());
  int exit_code = 0;
  const std::string run_dir = ro.run_dir;
  live->run = JobRun::Start(std::move(ro), live->spawner.get(), live->listener.get(), exit_code);
  live->listener->Flush();
  if (live->run == nullptr) {
    End(grant.id, *live, control::JOB_STATE_FAILED, exit_code,
        absl::StrCat("could not start: ", live->listener->refusal()), 0);
    return;
  }
  control::Devices devices = record->devices;
  for (int ordinal : grant.gpu_ordinals) devices.add_gpu_ordinals(ordinal);
  if (absl::Status s = store_->MarkRunning(grant.id, ro.launch, devices, run_dir); !s.ok()) {
    live->events.AddLine(absl::StrCat("stagehand: ", s.message()));
  }
  {
    absl::MutexLock lock(&mu_);
    live->running = true;
  }
  options_.log(absl::StrCat("job ", grant.id, ": running, run directory ", run_dir));
  Publish(grant.id, *live, false);
}

void JobServer::Drive(const std::string& id, Live& live) {
  bool stop = false, force = false, by_server = false;
  {
    absl::MutexLock lock(&mu_);
    stop = live.cancels > 0 || shutting_down_;
    force = live.cancels > 1 || force_;
    by_server = live.cancels == 0 && shutting_down_;
  }
  if (stop && !live.interrupted) {
    live.interrupted = true;
    live.run->Interrupt(SIGTERM, false);
  }
  if (force && !live.forced) {
    live.forced = true;
    live.run->Interrupt(SIGTERM, true);
  }
  if (!live.run->Tick()) {
    absl::MutexLock lock(&mu_);
    live.steps_done = live.run->steps_done();
    return;
  }
  JobRunEnd end = live.run->Finish(0);
  live.terminal->Flush(absl::Seconds(1));  // the workers' last lines come before the final state
  std::string cause = end.report.root_cause();
  control::JobState state = end.exit_code == kExitSuccess ? control::JOB_STATE_SUCCEEDED : control::JOB_STATE_FAILED;
  if (live.interrupted) {
    state = control::JOB_STATE_CANCELLED;
    std::string by;
    {
      absl::MutexLock lock(&mu_);
      by = by_server ? "the server (stopping)" : live.cancelled_by;
    }
    if (by_server) (void)store_->SetCancelledBy(id, by);
    cause = absl::StrCat("cancelled by ", by);
  }
  End(id, live, state, end.exit_code, cause, end.report.steps_done());
}

void JobServer::End(const std::string& id, Live& live, control::JobState state, int exit_code, const std::string& cause,
                    int64_t steps_done) {
  options_.log(absl::StrCat("job ", id, ": ",
                            absl::AsciiStrToLower(absl::StripPrefix(control::JobState_Name(state), "JOB_STATE_")),
                            " (exit ", exit_code, ")", cause.empty() ? "" : ": ", cause));
  if (absl::Status s = store_->MarkEnded(id, state, absl::Now(), exit_code, cause, steps_done); !s.ok()) {
    live.events.AddLine(absl::StrCat("stagehand: ", s.message()));
  }
  live.run.reset();
  live.spawner.reset();
  live.terminal.reset();
  {
    absl::MutexLock lock(&mu_);
    (void)queue_.Release(id);
    live.running = false;
  }
  Publish(id, live, true);
  absl::MutexLock lock(&mu_);
  RetireLocked(id);
}

void JobServer::RetireLocked(const std::string& id) {
  ended_.push_back(id);
  while (ended_.size() > options_.ended_jobs_with_events) {
    live_.erase(ended_.front());  // a watcher holding it reads on; later ones get the final state
    ended_.pop_front();
  }
}

void JobServer::Publish(const std::string& id, Live& live, bool final) {
  absl::StatusOr<JobRecord> record = Record(id);
  if (!record.ok()) return;
  control::JobInfo info;
  {
    absl::MutexLock lock(&mu_);
    info = Info(*record);
  }
  live.events.AddState(info, final);
}

void JobServer::Shutdown(bool force) {
  {
    absl::MutexLock lock(&validations_->mu);
    validations_->stopping = true;  // their waiters return now
  }
  absl::MutexLock lock(&mu_);
  shutting_down_ = true;
  force_ = force_ || force;
}

int JobServer::ValidationsRunning() const {
  absl::MutexLock lock(&validations_->mu);
  return validations_->running;
}

int JobServer::Running() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, live] : live_) n += live->running ? 1 : 0;
  return n;
}

}  // namespace stagehand
