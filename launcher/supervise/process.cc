// The real ProcessSpawner (fork/exec, process groups, PR_SET_PDEATHSIG, the secret pipe, one thread per
// child forwarding its output line by line to its log and the terminal writer) and BecomeSubreaper().
#include "launcher/supervise/process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/logging.h"
#include "common/worker_contract.h"

namespace stagehand {
namespace {

// The child's fds: 0 stdin, 1 and 2 the output pipe, 3 the secret, 4 the exec status pipe (CLOEXEC).
constexpr int kSecretFd = 3;
constexpr int kStatusFd = 4;
constexpr int kFirstFreeFd = 5;
// A pipe holds at least one page, so writing the secret before fork never blocks.
constexpr size_t kMaxSecretBytes = 4096;
// A child that never writes a newline must not grow our memory without bound: its line is cut here.
constexpr size_t kMaxLineBytes = 64 * 1024;
// How long the destructor waits for output still in flight before it stops the forwarding threads.
constexpr absl::Duration kDestructorDrain = absl::Seconds(1);
// The exit code of a child that could not exec (as a shell's "command not found").
constexpr int kExecFailedExit = 127;

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

// CLOEXEC, so that children spawned concurrently by other threads do not inherit the ends.
absl::StatusOr<Pipe> MakePipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    data.remove_prefix(n);
  }
  return true;
}

// ---- The child, between fork and execve: async-signal-safe calls only, no allocation. ----

struct ChildFds {
  int stdin_fd;
  int output_fd;
  int secret_fd;
  int status_fd;
  int max_fd;  // for the close loop, where close_range is missing
};

// Handlers do not survive exec but ignored signals and the mask do; the launcher ignores or blocks
// some (SIGPIPE, SIGCHLD, SIGINT/SIGTERM for its own shutdown), and a worker must get the defaults.
void ResetSignals() {
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; ++sig) {
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, nullptr);  // fails harmlessly for some
  }
}

// Puts the fds in their places and closes every other one (gRPC's sockets, other children's pipes).
// The sources are first lifted above the targets, so that no dup2 overwrites a source not yet moved.
bool ArrangeFds(ChildFds* fds) {
  int* sources[] = {&fds->stdin_fd, &fds->output_fd, &fds->secret_fd, &fds->status_fd};
  for (int* fd : sources) {
    const int lifted = fcntl(*fd, F_DUPFD, kFirstFreeFd);
    if (lifted < 0) return false;
    *fd = lifted;
  }
  if (dup2(fds->stdin_fd, 0) < 0 || dup2(fds->output_fd, 1) < 0 || dup2(fds->output_fd, 2) < 0 ||
      dup2(fds->secret_fd, kSecretFd) < 0 || dup2(fds->status_fd, kStatusFd) < 0 ||
      fcntl(kStatusFd, F_SETFD, FD_CLOEXEC) < 0) {
    return false;
  }
  fds->status_fd = kStatusFd;
  if (close_range(kFirstFreeFd, ~0U, 0) != 0) {
    for (int fd = kFirstFreeFd; fd < fds->max_fd; ++fd) close(fd);
  }
  return true;
}

// `arranged`: the guard (GuardChild) put the fds in place already, and the group exists.
[[noreturn]] void ExecChild(ChildFds fds, pid_t parent_pid, char* const* argv, char* const* envp, const char* cwd,
                            bool arranged = false) {
  if (!arranged) setpgid(0, 0);
  // The getppid() check covers a parent that died before the prctl took effect.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent_pid) _exit(kExecFailedExit);
  ResetSignals();
  int err = 0;
  if ((arranged || ArrangeFds(&fds)) && (cwd[0] == '\0' || chdir(cwd) == 0)) {
    execve(argv[0], argv, envp);
  }
  err = errno;
  static const char kMessage[] = "stagehand: cannot execute ";
  WriteAll(2, absl::string_view(kMessage, sizeof kMessage - 1));
  WriteAll(2, absl::string_view(argv[0], strlen(argv[0])));
  WriteAll(2, "\n");
  // The parent reads errno from here; on a successful exec it reads EOF instead (CLOEXEC).
  WriteAll(fds.status_fd, absl::string_view(reinterpret_cast<const char*>(&err), sizeof err));
  _exit(kExecFailedExit);
}

// A program's guard (ProcessSpec::guard), between fork and its end: async-signal-safe calls only.
// It leads the rank's process group, runs the program as its child in that group, and mirrors the
// program's end. Signals the launcher sends the group reach the program directly; the guard takes
// them from its blocked set and waits on. When the launcher is gone (PR_SET_PDEATHSIG, or its pid
// no longer our parent), the guard kills the group, itself included.
[[noreturn]] void GuardChild(ChildFds fds, pid_t parent_pid, char* const* argv, char* const* envp, const char* cwd) {
  setpgid(0, 0);
  prctl(PR_SET_NAME, "stagehand-guard");  // what ps and pstree show for it
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);  // before the prctl: its signal waits for sigtimedwait
  if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || getppid() != parent_pid) _exit(kExecFailedExit);
  if (!ArrangeFds(&fds)) _exit(kExecFailedExit);
  const pid_t guard = getpid();
  const pid_t program = fork();
  if (program == 0) ExecChild(fds, guard, argv, envp, cwd, /*arranged=*/true);
  if (program < 0) _exit(kExecFailedExit);
  // The program holds the output, the secret and the exec-status pipe; the guard needs none of them
  // (the launcher reads EOF on the status pipe once the program's exec closed its copy).
  for (int fd : {0, 1, 2, kSecretFd, kStatusFd}) close(fd);
  const struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);  // mirroring a SIGSEGV or SIGABRT must not dump the guard's core
  sigset_t wake;
  sigemptyset(&wake);
  for (int sig : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaddset(&wake, sig);
  for (;;) {
    const struct timespec tick = {0, 200 * 1000 * 1000};
    siginfo_t info;
    sigtimedwait(&wake, &info, &tick);              // a signal, or 200 ms: either way, look again
    if (getppid() != parent_pid) kill(0, SIGKILL);  // the launcher is gone: the whole group with it
    int status = 0;
    if (waitpid(program, &status, WNOHANG) != program) continue;
    if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
    const int sig = WTERMSIG(status);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, nullptr);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    kill(guard, sig);  // ends the guard as the program ended (SIGKILL and SIGSTOP need no unblocking)
    _exit(128 + sig);
  }
}

// ---- The parent. ----

// The child's argv and envp as the char* arrays execve wants, built before fork: the child of a
// multi-threaded process may not allocate.
class ExecArgs {
 public:
  explicit ExecArgs(const ProcessSpec& spec) : argv_strings_(spec.argv), cwd_(spec.cwd), guard_(spec.guard) {
    const std::string secret_prefix = absl::StrCat(kSecretFdEnv, "=");
    for (const std::string& e : spec.env) {
      if (!absl::StartsWith(e, secret_prefix)) env_strings_.push_back(e);
    }
    env_strings_.push_back(absl::StrCat(secret_prefix, kSecretFd));
    for (std::string& s : argv_strings_) argv_.push_back(s.data());
    argv_.push_back(nullptr);
    for (std::string& s : env_strings_) envp_.push_back(s.data());
    envp_.push_back(nullptr);
  }
  char* const* argv() const { return argv_.data(); }
  char* const* envp() const { return envp_.data(); }
  const char* cwd() const { return cwd_.c_str(); }  // "": stay where the launcher is
  bool guard() const { return guard_; }

 private:
  std::vector<std::string> argv_strings_;
  std::vector<std::string> env_strings_;
  std::vector<char*> argv_;
  std::vector<char*> envp_;
  std::string cwd_;
  bool guard_ = false;
};

// Everything Spawn opens before fork, so that a failure is a Status and not a dead child.
struct SpawnFds {
  UniqueFd dev_null;     // the child's stdin
  Pipe output;           // the child's stdout and stderr
  UniqueFd secret_read;  // the secret is already in the pipe and its write end closed: EOF follows
  Pipe status;           // errno of a failed exec, or EOF
  UniqueFd log;          // -1 when the spec has no log_path
};

absl::StatusOr<SpawnFds> OpenSpawnFds(const ProcessSpec& spec) {
  SpawnFds fds;
  fds.dev_null.reset(open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (fds.dev_null.get() < 0) return absl::ErrnoToStatus(errno, "cannot open /dev/null");
  absl::StatusOr<Pipe> output = MakePipe(), secret = MakePipe(), status = MakePipe();
  if (!output.ok()) return output.status();
  if (!secret.ok()) return secret.status();
  if (!status.ok()) return status.status();
  if (!WriteAll(secret->write.get(), spec.secret)) {
    return absl::ErrnoToStatus(errno, "cannot write the secret to its pipe");
  }
  fds.output = *std::move(output);
  fds.secret_read = std::move(secret->read);
  fds.status = *std::move(status);
  if (!spec.log_path.empty()) {
    fds.log.reset(open(spec.log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    if (fds.log.get() < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open log file ", spec.log_path));
    }
  }
  return fds;
}

absl::Status CheckSpec(const ProcessSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return absl::InvalidArgumentError("ProcessSpec.argv is empty: argv[0] must be the executable");
  }
  if (spec.secret.size() > kMaxSecretBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the secret has ", spec.secret.size(), " bytes; at most ", kMaxSecretBytes, " fit"));
  }
  if (access(spec.argv[0].c_str(), X_OK) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot execute ", spec.argv[0]));
  }
  return absl::OkStatus();
}

// The errno a child reported from a failed exec, or 0 when the status pipe reached EOF (exec done).
int ReadExecErrno(int status_fd) {
  int err = 0;
  size_t got = 0;
  while (got < sizeof err) {
    const ssize_t n = read(status_fd, reinterpret_cast<char*>(&err) + got, sizeof err - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got += n;
  }
  return got == sizeof err ? err : 0;
}

ProcessExit ToProcessExit(int pid, int wait_status) {
  ProcessExit exit;
  exit.pid = pid;
  if (WIFEXITED(wait_status)) exit.exit_code = WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) exit.signal = WTERMSIG(wait_status);
  return exit;
}

// Forwards one child's output pipe, line by line, to its log file and (with a prefix) to the
// terminal writer. The log is written first and in full; the writer never blocks, so a terminal that
// does not read neither stalls the child nor costs the log a line.
class OutputForwarder {
 public:
  // stop_fd becoming readable ends the thread before EOF (a grandchild may hold the pipe open).
  OutputForwarder(UniqueFd pipe, UniqueFd log, std::string log_path, std::string prefix, TerminalWriter* terminal,
                  int stop_fd)
      : pipe_(std::move(pipe)),
        log_(std::move(log)),
        log_path_(std::move(log_path)),
        prefix_(std::move(prefix)),
        terminal_(terminal),
        stop_fd_(stop_fd),
        thread_([this] { Run(); }) {}
  ~OutputForwarder() { Join(); }

  bool WaitUntilDone(absl::Time deadline) { return done_.WaitForNotificationWithDeadline(deadline); }
  bool done() const { return done_.HasBeenNotified(); }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run();
  void Consume(absl::string_view chunk);
  void Emit(absl::string_view line);

  UniqueFd pipe_;
  UniqueFd log_;
  const std::string log_path_;
  const std::string prefix_;
  TerminalWriter* const terminal_;
  const int stop_fd_;
  std::string partial_;  // the line read so far, without its newline
  absl::Notification done_;
  std::thread thread_;  // last: starts after the members above are initialised
};

void OutputForwarder::Run() {
  char buf[4096];
  while (true) {
    pollfd fds[2] = {{pipe_.get(), POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "poll on a child's output pipe: " << ErrnoText(errno);
      break;
    }
    if (fds[1].revents != 0) break;
    const ssize_t n = read(pipe_.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: every process holding the write end has ended or closed it
    Consume(absl::string_view(buf, n));
  }
  if (!partial_.empty()) Emit(partial_);
  partial_.clear();
  pipe_.reset();
  log_.reset();
  done_.Notify();
}

void OutputForwarder::Consume(absl::string_view chunk) {
  while (!chunk.empty()) {
    const size_t newline = chunk.find('\n');
    if (newline == absl::string_view::npos) {
      partial_.append(chunk.data(), chunk.size());
      break;
    }
    partial_.append(chunk.data(), newline);
    Emit(partial_);
    partial_.clear();
    chunk.remove_prefix(newline + 1);
  }
  if (partial_.size() >= kMaxLineBytes) {
    Emit(partial_);
    partial_.clear();
  }
}

void OutputForwarder::Emit(absl::string_view line) {
  const std::string out = absl::StrCat(prefix_, line, "\n");
  if (log_.get() >= 0) WriteAll(log_.get(), absl::string_view(out).substr(prefix_.size()));
  terminal_->Submit(out, log_path_);
}

class PosixProcessSpawner;

// One reaper for the whole process. waitpid(-1) takes any child's exit (it must: as a subreaper we
// also inherit orphaned grandchildren, which only waitpid(-1) reaps), so with two spawners in one
// process (two jobs of one server) each exit is handed to the spawner that forked that pid. Lock
// order: this mutex, then a spawner's.
struct ChildRegistry {
  absl::Mutex mu;
  absl::flat_hash_map<int, PosixProcessSpawner*> owners ABSL_GUARDED_BY(mu);
};

ChildRegistry& Children() {
  static ChildRegistry* registry = new ChildRegistry;  // never destroyed: forwarders may outlive main
  return *registry;
}

class PosixProcessSpawner : public ProcessSpawner {
 public:
  explicit PosixProcessSpawner(TerminalWriter* terminal) : terminal_(terminal), stop_fd_(eventfd(0, EFD_CLOEXEC)) {
    CHECK(stop_fd_.get() >= 0) << "eventfd: " << ErrnoText(errno);
    rlimit limit;
    max_fd_ = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                  ? static_cast<int>(std::min<rlim_t>(limit.rlim_cur, 1 << 20))
                  : 1 << 16;
  }
  ~PosixProcessSpawner() override;

  absl::StatusOr<int> Spawn(const ProcessSpec& spec) override;
  void SignalGroup(int pid, int signal) override;
  std::vector<ProcessExit> Reap() override;
  void DrainOutput(int pid, absl::Duration timeout) override;

 private:
  absl::StatusOr<int> Fork(const SpawnFds& fds, const ExecArgs& args);
  void Abandon(int pid);
  void Started(int pid, std::shared_ptr<OutputForwarder> output);
  void JoinFinishedForwarders() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every exit waiting in the process, each handed to its spawner's Deliver.
  static void ReapAll() ABSL_EXCLUSIVE_LOCKS_REQUIRED(Children().mu);
  void Deliver(const ProcessExit& exit) ABSL_EXCLUSIVE_LOCKS_REQUIRED(Children().mu);

  TerminalWriter* const terminal_;
  UniqueFd stop_fd_;  // an eventfd written once, by the destructor
  int max_fd_ = 0;
  absl::Mutex mu_;
  // Forked, exec not yet confirmed; Reap keeps the exits of these in early_exits_ for Spawn to settle.
  absl::flat_hash_set<int> starting_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int, ProcessExit> early_exits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<int> running_ ABSL_GUARDED_BY(mu_);     // exec'd, not yet reaped
  std::vector<ProcessExit> unreported_ ABSL_GUARDED_BY(mu_);  // reaped early, for the next Reap
  // Every pid this spawner started (for SignalGroup and DrainOutput), with its output's forwarder.
  absl::flat_hash_map<int, std::shared_ptr<OutputForwarder>> outputs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<OutputForwarder>> unjoined_ ABSL_GUARDED_BY(mu_);
};

PosixProcessSpawner::~PosixProcessSpawner() {
  {
    ChildRegistry& children = Children();
    absl::MutexLock lock(&children.mu);
    absl::erase_if(children.owners, [this](const auto& entry) { return entry.second == this; });
  }
  std::vector<std::shared_ptr<OutputForwarder>> forwarders;
  {
    absl::MutexLock lock(&mu_);
    forwarders.swap(unjoined_);
    outputs_.clear();
  }
  const absl::Time deadline = absl::Now() + kDestructorDrain;
  for (const auto& f : forwarders) f->WaitUntilDone(deadline);
  const uint64_t one = 1;
  if (write(stop_fd_.get(), &one, sizeof one) != sizeof one) {
    LOG(ERROR) << "cannot stop the output forwarders: " << ErrnoText(errno);
  }
  forwarders.clear();  // joins
}

absl::StatusOr<int> PosixProcessSpawner::Spawn(const ProcessSpec& spec) {
  if (absl::Status status = CheckSpec(spec); !status.ok()) return status;
  absl::StatusOr<SpawnFds> fds = OpenSpawnFds(spec);
  if (!fds.ok()) return fds.status();
  const ExecArgs args(spec);
  absl::StatusOr<int> pid = Fork(*fds, args);
  if (!pid.ok()) return pid.status();
  fds->dev_null.reset();
  fds->output.write.reset();
  fds->secret_read.reset();
  fds->status.write.reset();
  // Also done in the child: whichever runs first, the group exists before Spawn returns. EACCES
  // (the child already exec'd) and ESRCH (it already ended) are fine.
  setpgid(*pid, *pid);
  if (const int err = ReadExecErrno(fds->status.read.get()); err != 0) {
    Abandon(*pid);
    return absl::ErrnoToStatus(err, absl::StrCat("cannot execute ", spec.argv[0]));
  }
  Started(*pid, std::make_shared<OutputForwarder>(std::move(fds->output.read), std::move(fds->log), spec.log_path,
                                                  spec.output_prefix, terminal_, stop_fd_.get()));
  return *pid;
}

absl::StatusOr<int> PosixProcessSpawner::Fork(const SpawnFds& fds, const ExecArgs& args) {
  const ChildFds child_fds{fds.dev_null.get(), fds.output.write.get(), fds.secret_read.get(), fds.status.write.get(),
                           max_fd_};
  const pid_t parent_pid = getpid();
  // Both held across fork so that no Reap (of any spawner) can reap the child before it is ours.
  ChildRegistry& children = Children();
  absl::MutexLock registry_lock(&children.mu);
  absl::MutexLock lock(&mu_);
  const pid_t pid = fork();
  if (pid == 0 && args.guard()) GuardChild(child_fds, parent_pid, args.argv(), args.envp(), args.cwd());
  if (pid == 0) ExecChild(child_fds, parent_pid, args.argv(), args.envp(), args.cwd());
  if (pid < 0) return absl::ErrnoToStatus(errno, "fork");
  starting_.insert(pid);
  children.owners[pid] = this;
  return pid;
}

// A child whose exec failed: reap it here (it is exiting), so that Reap never reports it.
void PosixProcessSpawner::Abandon(int pid) {
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }  // ECHILD: a concurrent Reap got it first and kept it in early_exits_
  ChildRegistry& children = Children();
  absl::MutexLock registry_lock(&children.mu);
  absl::MutexLock lock(&mu_);
  children.owners.erase(pid);
  starting_.erase(pid);
  early_exits_.erase(pid);
}

void PosixProcessSpawner::Started(int pid, std::shared_ptr<OutputForwarder> output) {
  absl::MutexLock lock(&mu_);
  JoinFinishedForwarders();
  starting_.erase(pid);
  if (auto it = early_exits_.find(pid); it != early_exits_.end()) {
    unreported_.push_back(it->second);
    early_exits_.erase(it);
  } else {
    running_.insert(pid);
  }
  unjoined_.push_back(output);
  outputs_[pid] = std::move(output);
}

// Threads of children long gone are joined as new ones start, so that restarts do not pile them up.
void PosixProcessSpawner::JoinFinishedForwarders() {
  auto finished = std::stable_partition(unjoined_.begin(), unjoined_.end(), [](const auto& f) { return !f->done(); });
  for (auto it = finished; it != unjoined_.end(); ++it) (*it)->Join();
  unjoined_.erase(finished, unjoined_.end());
}

void PosixProcessSpawner::SignalGroup(int pid, int signal) {
  {
    absl::MutexLock lock(&mu_);
    // Guards kill(-pid): a pid not ours could name someone else's group (and -1 names everyone).
    if (!outputs_.contains(pid)) {
      LOG(WARNING) << "SignalGroup(" << pid << ", " << signal << "): not a child of this spawner";
      return;
    }
  }
  if (kill(-pid, signal) != 0 && errno != ESRCH) {
    LOG(WARNING) << "kill(-" << pid << ", " << signal << "): " << ErrnoText(errno);
  }
}

std::vector<ProcessExit> PosixProcessSpawner::Reap() {
  {
    absl::MutexLock registry_lock(&Children().mu);
    ReapAll();
  }
  absl::MutexLock lock(&mu_);
  std::vector<ProcessExit> exits;
  exits.swap(unreported_);
  return exits;
}

void PosixProcessSpawner::ReapAll() {
  ChildRegistry& children = Children();
  while (true) {
    int wait_status = 0;
    const pid_t pid = waitpid(-1, &wait_status, WNOHANG);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;  // 0: none ended; ECHILD: no children at all
    auto owner = children.owners.find(pid);
    if (owner == children.owners.end()) continue;  // an orphaned grandchild: reaped so it is no zombie
    PosixProcessSpawner* spawner = owner->second;
    children.owners.erase(owner);
    spawner->Deliver(ToProcessExit(pid, wait_status));
  }
}

void PosixProcessSpawner::Deliver(const ProcessExit& exit) {
  absl::MutexLock lock(&mu_);
  if (running_.erase(exit.pid) > 0) {
    unreported_.push_back(exit);
  } else if (starting_.contains(exit.pid)) {
    early_exits_[exit.pid] = exit;
  }
}

void PosixProcessSpawner::DrainOutput(int pid, absl::Duration timeout) {
  std::shared_ptr<OutputForwarder> output;
  {
    absl::MutexLock lock(&mu_);
    auto it = outputs_.find(pid);
    if (it == outputs_.end()) return;
    output = it->second;
  }
  output->WaitUntilDone(absl::Now() + timeout);
}

}  // namespace

std::unique_ptr<ProcessSpawner> NewPosixProcessSpawner(TerminalWriter* terminal) {
  return std::make_unique<PosixProcessSpawner>(terminal != nullptr ? terminal : &StdoutTerminal());
}

absl::Status BecomeSubreaper() {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return absl::InternalError(absl::StrCat("prctl(PR_SET_CHILD_SUBREAPER): ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

}  // namespace stagehand
