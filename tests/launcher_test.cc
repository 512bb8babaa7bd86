// Integration tests of the launcher with real processes over loopback (CPU workers): clean runs,
// a worker killed, the launcher killed, SIGINT, SIGHUP, a hung worker, a wrong secret, bad flags, run
// directories it must refuse, results on a full disk, a stdout nobody reads, a registration timeout,
// and (LauncherCycles, its own large target) 200 start/kill cycles. Each test checks that no process
// of the run outlives it.
#include <dirent.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "protos/coordinator.grpc.pb.h"
#include "protos/job.pb.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;
using ::stagehand::testing::ScopedTmpfs;

using Clock = std::chrono::steady_clock;

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

// Polls `done` every 10 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Processes whose command line contains `needle` (the workers of a job carry --job_id=<id>).
std::vector<int> PidsWith(const std::string& needle) {
  std::vector<int> pids;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    int pid = atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    bool zombie = stat.find(") Z ") != std::string::npos;
    if (!zombie && cmd.find(needle) != std::string::npos) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

class Launcher {
 public:
  // With stdout_pipe, the launcher's stdout is a pipe that the test never reads (its stderr still
  // goes to the output file).
  explicit Launcher(std::vector<std::string> args, bool stdout_pipe = false) {
    static int counter = 0;
    run_dir_ = absl::StrCat(TempDir(), "/run", getpid(), "_", counter);
    output_ = absl::StrCat(TempDir(), "/run", getpid(), "_", counter++, ".out");
    args.insert(args.begin(), Runfile("launcher/launcher"));
    // A test that names its own run directory keeps it; the others get a fresh one.
    bool given = false;
    for (const std::string& a : args) {
      if (a.rfind("--run_dir=", 0) == 0) given = true, run_dir_ = a.substr(10);
    }
    if (!given) args.push_back("--run_dir=" + run_dir_);
    int pipe_fds[2] = {-1, -1};
    if (stdout_pipe) {
      if (pipe2(pipe_fds, O_CLOEXEC) != 0) abort();
      pipe_capacity_ = fcntl(pipe_fds[0], F_GETPIPE_SZ);
      pipe_read_ = pipe_fds[0];
    }
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(stdout_pipe ? pipe_fds[1] : fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    if (stdout_pipe) close(pipe_fds[1]);
  }
  ~Launcher() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (pipe_read_ >= 0) close(pipe_read_);
  }
  // With stdout_pipe: true while the pipe is full as a writer sees it, within two pages of its
  // capacity: a line that does not fit in what is left of a page takes the next one, and poll()
  // stops saying POLLOUT once every page is taken, however full the last.
  bool StdoutPipeFull() const {
    int queued = 0;
    return pipe_read_ >= 0 && ioctl(pipe_read_, FIONREAD, &queued) == 0 && queued >= pipe_capacity_ - 2 * 4096;
  }
  int pid() const { return pid_; }
  std::string output() const { return ReadFile(output_); }
  const std::string& run_dir() const { return run_dir_; }

  // Waits for the launcher to exit; returns its exit code (128+signal if killed), or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout) {
    int status = 0;
    bool done = WaitFor([&] { return exited_ || waitpid(pid_, &status, WNOHANG) == pid_; }, timeout);
    if (!done) return -1;
    if (!exited_) {
      exited_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      end_ = Clock::now();
    }
    return code_;
  }
  // The job id, once the launcher has printed it.
  std::string JobId(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    std::smatch m;
    std::string out;
    static const std::regex re("job ([0-9a-f]+):");
    WaitFor(
        [&] {
          out = output();
          return std::regex_search(out, m, re);
        },
        timeout);
    return m.size() > 1 ? m[1].str() : "";
  }
  std::string CoordinatorAddress() {
    std::smatch m;
    std::string out = output();
    static const std::regex re("coordinator (127\\.0\\.0\\.1:[0-9]+)");
    return std::regex_search(out, m, re) ? m[1].str() : "";
  }
  // Waits until every worker has printed a line (its transport is up).
  bool WaitForWorkersUp(int workers, std::chrono::milliseconds timeout) {
    return WaitFor(
        [&] {
          std::string out = output();
          int n = 0;
          for (int r = 0; r < workers; ++r) n += out.find(absl::StrCat("[rank ", r, "]")) != std::string::npos;
          return n == workers;
        },
        timeout);
  }

 private:
  int pid_ = 0;
  int pipe_read_ = -1;
  int pipe_capacity_ = 0;
  bool exited_ = false;
  int code_ = -1;
  Clock::time_point start_, end_;
  std::string run_dir_, output_;
};

std::vector<std::string> CpuJob(int workers, int64_t steps) {
  return {"--device=cpu", absl::StrCat("--workers=", workers), absl::StrCat("--steps=", steps), "--model=allreduce",
          "--tensor_elements=4096"};
}

int WorkerPid(const std::string& job_id, int index) {
  auto pids = PidsWith(absl::StrCat("--job_id=", job_id, " --worker_index=", index, " "));
  return pids.empty() ? -1 : pids[0];
}

void ExpectNothingLeft(const std::string& job_id, std::chrono::milliseconds within) {
  ASSERT_FALSE(job_id.empty());
  EXPECT_TRUE(WaitFor([&] { return PidsWith("--job_id=" + job_id).empty(); }, within))
      << "processes of job " << job_id << " remain";
}

void ExpectCleanRun(int workers) {
  Launcher l(CpuJob(workers, 20));
  ASSERT_EQ(l.Wait(std::chrono::seconds(60)), 0) << l.output();
  std::string out = l.output();
  EXPECT_NE(out.find("stagehand: done"), std::string::npos) << out;
  for (int r = 0; r < workers; ++r) {
    EXPECT_NE(out.find(absl::StrCat("[rank ", r, "] ")), std::string::npos) << out;
    EXPECT_FALSE(ReadFile(absl::StrCat(l.run_dir(), "/rank", r, ".log")).empty());
  }
  std::vector<std::string> ledger =
      absl::StrSplit(ReadFile(l.run_dir() + "/startup_ledger.tsv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(ledger.size(), workers + 2u);  // launch time, header, one row per rank
  EXPECT_EQ(ledger[0].rfind("# launch_unix_micros=", 0), 0u) << ledger[0];
  for (int r = 2; r < workers + 2; ++r) EXPECT_EQ(ledger[r].find('-'), std::string::npos) << ledger[r];
  EXPECT_NE(ReadFile(l.run_dir() + "/job.textproto").find("workers: " + std::to_string(workers)), std::string::npos);
  ExpectNothingLeft(l.JobId(), std::chrono::seconds(1));
}

TEST(Launcher, CleanRun_TwoCpuWorkers_ExitsZeroWithLogsAndLedger) { ExpectCleanRun(2); }

TEST(Launcher, CleanRun_FourCpuWorkers_ExitsZeroWithLogsAndLedger) { ExpectCleanRun(4); }

// The README's first command: a bare launcher on a machine without a GPU trains the tiny GPT and its
// loss visibly falls (ln 256 = 5.5 at first; the synthetic corpus allows about 0.9).
TEST(Launcher, NoFlags_TrainsAModelWhoseLossFalls) {
  if (access("/dev/nvidia0", F_OK) == 0) GTEST_SKIP() << "a GPU is visible: the bare launcher would train gpt-1.3b";
  Launcher l({});
  ASSERT_EQ(l.Wait(std::chrono::seconds(60)), 0) << l.output();
  const std::string out = l.output();
  EXPECT_NE(out.find("no --model given: training tiny for 200 steps"), std::string::npos) << out;
  std::vector<double> losses;
  static const std::regex re("step [0-9]+/200  loss ([0-9.]+)");
  for (std::sregex_iterator it(out.begin(), out.end(), re), end; it != end; ++it) losses.push_back(std::stod((*it)[1]));
  ASSERT_EQ(losses.size(), 200u) << out;
  EXPECT_GT(losses.front(), 5.0);
  EXPECT_LT(losses.back(), 2.0);
}

TEST(Launcher, KillWorker_Sigkill_LauncherExitsNonZeroWithin2sNamingRank) {
  Launcher l(CpuJob(4, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(4, std::chrono::seconds(30))) << l.output();
  int victim = WorkerPid(job, 2);
  ASSERT_GT(victim, 0);
  auto t0 = Clock::now();
  kill(victim, SIGKILL);
  int code = l.Wait(std::chrono::seconds(10));
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(code, 1) << l.output();
  EXPECT_LT(secs, 2.0);
  EXPECT_NE(l.output().find("FAILED (exit 1): rank 2 "), std::string::npos) << l.output();
  EXPECT_NE(l.output().find("signal 9"), std::string::npos) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

TEST(Launcher, KillLauncher_Sigkill_EveryWorkerGoneWithin5s) {
  Launcher l(CpuJob(3, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(3, std::chrono::seconds(30))) << l.output();
  ASSERT_EQ(PidsWith("--job_id=" + job).size(), 3u);
  kill(l.pid(), SIGKILL);
  EXPECT_EQ(l.Wait(std::chrono::seconds(5)), 128 + SIGKILL);
  ExpectNothingLeft(job, std::chrono::seconds(5));
}

TEST(Launcher, Sigint_GracefulStop_Exits130) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  kill(l.pid(), SIGINT);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 130) << l.output();
  EXPECT_NE(l.output().find("stagehand: stopped by SIGINT (exit 130); "), std::string::npos) << l.output();
  EXPECT_EQ(l.output().find("FAILED"), std::string::npos) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

int StepRowsNow(const std::string& run_dir);  // below

// The last line of an output ("" when there is none).
std::string LastLine(const std::string& out) {
  std::vector<std::string> lines = absl::StrSplit(out, '\n', absl::SkipEmpty());
  return lines.empty() ? "" : lines.back();
}

// Ctrl-C of a pipeline printed "rank 0 failed at the marked action of its schedule" with its grid,
// then "FAILED (exit 130)": a stop is no failure, and its line is the last.
TEST(Launcher, SigintDuringAPipeline_StoppedNotFailedNoDiagram) {
  Launcher l(
      {"--device=cpu", "--workers=2", "--model=tiny", "--steps=100000", "--micro_batches=2", "--global_batch=4"});
  std::string job = l.JobId();
  ASSERT_TRUE(WaitFor([&] { return StepRowsNow(l.run_dir()) >= 2 * 3; }, std::chrono::seconds(60))) << l.output();
  kill(l.pid(), SIGINT);
  EXPECT_EQ(l.Wait(std::chrono::seconds(15)), 130) << l.output();
  const std::string out = l.output();
  EXPECT_EQ(out.find("FAILED"), std::string::npos) << out;
  EXPECT_EQ(out.find("failed at the marked action"), std::string::npos) << out;
  EXPECT_TRUE(absl::StartsWith(LastLine(out), "stagehand: stopped by SIGINT (exit 130); ")) << out;
  ExpectNothingLeft(job, std::chrono::seconds(1));
}

TEST(Launcher, Sigterm_GracefulStop_Exits143) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 143) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

// Whether process `pid` blocks `sig` (its main thread's mask, /proc/PID/status).
bool Blocks(int pid, int sig) {
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid, "/status")));
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigBlk:", 0) != 0) continue;
    const uint64_t mask = std::stoull(line.substr(7), nullptr, 16);
    return (mask >> (sig - 1)) & 1;
  }
  return false;
}

// A signal while the job is still being checked (a large token file scanned, a checkpoint hashed:
// here a check made to take 30 s) ends the launcher at once, 143 or 130, with nothing created, rather
// than staying blocked until the workers have started.
TEST(Launcher, SignalDuringSlowValidation_ExitsAtOnceNothingCreated) {
  for (const int sig : {SIGTERM, SIGINT, SIGHUP}) {
    setenv("STAGEHAND_TEST_SLOW_VALIDATION_MS", "30000", 1);
    Launcher l(CpuJob(2, 5));
    unsetenv("STAGEHAND_TEST_SLOW_VALIDATION_MS");
    // Once main() has blocked the signals (before that one would kill it by default, also 143).
    ASSERT_TRUE(WaitFor([&] { return Blocks(l.pid(), sig); }, std::chrono::seconds(20))) << l.output();
    ASSERT_EQ(l.Wait(std::chrono::milliseconds(1)), -1) << "ended before the signal: " << l.output();
    kill(l.pid(), sig);
    EXPECT_EQ(l.Wait(std::chrono::seconds(3)), sig == SIGINT ? 130 : 143) << strsignal(sig) << ": " << l.output();
    EXPECT_NE(l.output().find("while the job was being checked: stopped, nothing was started"), std::string::npos)
        << l.output();
    struct stat st;
    EXPECT_NE(stat(l.run_dir().c_str(), &st), 0) << "a run directory was created: " << l.run_dir();
  }
}

// Slurm signals every process of a step: a worker ignores a SIGTERM that is not its launcher's (the
// launcher decides), and still ends on the launcher's own.
TEST(Launcher, WorkerGetsAForeignSigterm_IgnoresIt_LaunchersSigtermStillEndsIt) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  int victim = WorkerPid(job, 1);
  ASSERT_GT(victim, 0);
  ASSERT_EQ(kill(victim, SIGTERM), 0);
  EXPECT_FALSE(WaitFor([&] { return kill(victim, 0) != 0; }, std::chrono::milliseconds(1500)))
      << "the worker died of a SIGTERM that was not its launcher's";
  EXPECT_EQ(l.Wait(std::chrono::milliseconds(1)), -1) << l.output();  // still running
  kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 143) << l.output();
  EXPECT_NE(l.output().find("ignoring a SIGTERM not sent by the launcher"), std::string::npos) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

TEST(Launcher, HungWorker_Sigstop_CaughtByHeartbeatTimeout) {
  std::vector<std::string> args = CpuJob(2, 10000000);
  args.push_back("--heartbeat_timeout_ms=1000");
  args.push_back("--grace_period_ms=500");
  Launcher l(args);
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  int victim = WorkerPid(job, 1);
  ASSERT_GT(victim, 0);
  kill(victim, SIGSTOP);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 3) << l.output();
  EXPECT_NE(l.output().find("rank 1 "), std::string::npos);
  EXPECT_NE(l.output().find("stopped heartbeating"), std::string::npos) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

TEST(Launcher, Register_WrongSecret_IsRefusedAndRunGoesOn) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  auto stub =
      stagehand::Coordinator::NewStub(grpc::CreateChannel(l.CoordinatorAddress(), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    stagehand::GetServerInfoResponse info;
    ASSERT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.job_id(), job);
  }
  stagehand::RegisterRequest req;
  req.set_job_id(job);
  req.set_worker_index(0);
  req.set_incarnation(2);
  for (const char* auth : {"Bearer not-the-secret", ""}) {
    grpc::ClientContext ctx;
    if (*auth) ctx.AddMetadata("authorization", auth);
    stagehand::RegisterResponse resp;
    grpc::Status s = stub->Register(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
  }
  EXPECT_EQ(l.Wait(std::chrono::milliseconds(300)), -1) << "the refused call must not disturb the run";
  kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 143);
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

// The job id and the pid of each worker, from the cmdlines of the launcher's children (for a run
// whose stdout cannot be read).
std::vector<int> ChildrenOf(int pid) {
  std::vector<int> out;
  std::istringstream in(ReadFile(absl::StrCat("/proc/", pid, "/task/", pid, "/children")));
  for (int child; in >> child;) out.push_back(child);
  return out;
}

std::string JobIdOfChildren(int launcher) {
  static const std::regex re("--job_id=([0-9a-f]+)");
  for (int child : ChildrenOf(launcher)) {
    std::string cmd = ReadFile(absl::StrCat("/proc/", child, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    std::smatch m;
    if (std::regex_search(cmd, m, re)) return m[1].str();
  }
  return "";
}

// A --worker_binary: a script that runs `before` (with the worker's arguments in "$@") and then
// execs the real worker, so that the pid and the cmdline (--job_id=...) stay the worker's.
std::string WrapperWorker(const std::string& name, const std::string& before) {
  const std::string path = absl::StrCat(TempDir(), "/", name, getpid(), ".sh");
  std::ofstream(path) << "#!/bin/sh\n" << before << "\nexec " << Runfile("worker/worker") << " \"$@\"\n";
  chmod(path.c_str(), 0755);
  return path;
}

int CountPrefixed(const std::string& text, const std::string& prefix, std::string* last) {
  int n = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.substr(0, prefix.size()) != prefix) continue;
    ++n;
    *last = std::string(line);
  }
  return n;
}

// With stdout a pipe nobody reads, the launcher does not block in write: a killed worker is noticed
// within 2 s, and the rank logs are complete. Each worker first prints 20,000 lines.
TEST(Launcher, StdoutNeverRead_KillWorker_NoticedWithin2sAndRankLogsComplete) {
  std::vector<std::string> args = CpuJob(2, 10000000);
  args.push_back("--worker_binary=" + WrapperWorker("chatty", "/usr/bin/seq -f 'chatter %g' 1 20000"));
  Launcher l(args, /*stdout_pipe=*/true);
  ASSERT_TRUE(WaitFor([&] { return l.StdoutPipeFull(); }, std::chrono::seconds(30))) << l.output();
  std::string job;
  ASSERT_TRUE(WaitFor([&] { return !(job = JobIdOfChildren(l.pid())).empty(); }, std::chrono::seconds(30)));
  // Both workers past their chatter and their transport up: the run is under way.
  for (int r = 0; r < 2; ++r) {
    const std::string log = absl::StrCat(l.run_dir(), "/rank", r, ".log");
    ASSERT_TRUE(WaitFor([&] { return ReadFile(log).find("cpu transport rank") != std::string::npos; },
                        std::chrono::seconds(30)))
        << ReadFile(log).substr(0, 200);
  }
  ASSERT_TRUE(l.StdoutPipeFull()) << "the test must not have read it";
  const int victim = WorkerPid(job, 1);
  ASSERT_GT(victim, 0);
  const auto t0 = Clock::now();
  kill(victim, SIGKILL);
  const int code = l.Wait(std::chrono::seconds(10));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("kill -9 of rank 1 to the launcher's exit, stdout never read: %.3f s\n", secs);
  EXPECT_EQ(code, 1) << l.output();
  EXPECT_LT(secs, 2.0);
  EXPECT_NE(ReadFile(l.run_dir() + "/report.json").find("\"root_cause\": \"rank 1 ("), std::string::npos)
      << ReadFile(l.run_dir() + "/report.json");
  for (int r = 0; r < 2; ++r) {
    std::string last;
    EXPECT_EQ(CountPrefixed(ReadFile(absl::StrCat(l.run_dir(), "/rank", r, ".log")), "chatter ", &last), 20000)
        << "rank " << r;
    EXPECT_EQ(last, "chatter 20000");
  }
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

// A registration timeout is a hang (exit 3) naming the rank that did not register, not exit 1 blaming
// a rank whose registration the stopping coordinator refused.
TEST(Launcher, RegisterTimeout_RankZeroNeverRegisters_Exits3NamingRankZero) {
  std::vector<std::string> args = CpuJob(2, 10000000);
  args.push_back("--worker_binary=" +
                 WrapperWorker("late0", "case \" $* \" in *' --worker_index=0 '*) /bin/sleep 60;; esac"));
  args.push_back("--register_timeout_ms=3000");
  Launcher l(args);
  const std::string job = l.JobId();
  EXPECT_EQ(l.Wait(std::chrono::seconds(30)), 3) << l.output();
  EXPECT_TRUE(std::regex_search(l.output(), std::regex("FAILED \\(exit 3\\): ranks? 0 \\(pid [0-9]+\\)[^\\n]* did "
                                                       "not register within 3s")))
      << l.output();
  ExpectNothingLeft(job, std::chrono::seconds(2));
}

// 200 launches, each killed (SIGTERM and SIGKILL in turn) at a moment that varies from
// just after the workers are spawned to well into the run; after each, no process of the job may
// remain. Sequential by design: one job at a time on CI's two cores.
TEST(LauncherCycles, StartKill_200Cycles_NoProcessLeft) {
  constexpr int kCycles = 200;
  const auto start = Clock::now();
  static const std::regex row("\\n +[0-9]+ +[0-9]+ +float");
  for (int i = 0; i < kCycles; ++i) {
    Launcher l(CpuJob(2, 10000000));
    const std::string job = l.JobId();
    ASSERT_FALSE(job.empty()) << "cycle " << i << ": " << l.output();
    switch (i % 4) {
      case 0:  // the workers are being spawned: none has registered
        break;
      case 1:  // the first rank log exists: a worker is starting
        WaitFor([&] { return access((l.run_dir() + "/rank0.log").c_str(), F_OK) == 0; }, std::chrono::seconds(10));
        break;
      case 2:  // every worker is up
        l.WaitForWorkersUp(2, std::chrono::seconds(20));
        break;
      case 3: {  // mid-run, after 1 to 8 steps
        const int steps = 1 + (i / 4) % 8;
        WaitFor(
            [&] {
              const std::string out = l.output();
              return std::distance(std::sregex_iterator(out.begin(), out.end(), row), std::sregex_iterator()) >= steps;
            },
            std::chrono::seconds(20));
        break;
      }
    }
    const int sig = i % 2 == 0 ? SIGTERM : SIGKILL;
    kill(l.pid(), sig);
    const int code = l.Wait(std::chrono::seconds(15));
    ASSERT_NE(code, -1) << "cycle " << i << ": the launcher did not exit after signal " << sig << "\n" << l.output();
    if (sig == SIGKILL) {
      EXPECT_EQ(code, 128 + SIGKILL) << "cycle " << i;
    }
    const bool none_left = WaitFor([&] { return PidsWith("--job_id=" + job).empty(); }, std::chrono::seconds(5));
    ASSERT_TRUE(none_left) << "cycle " << i << " (signal " << sig << ", moment " << i % 4 << "): processes of job "
                           << job << " remain\n"
                           << l.output();
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%d start/kill cycles in %.1f s (%.2f s each)\n", kCycles, secs, secs / kCycles);
  // Measured on two shared cores: 225.6 s alone at a load average of 10 (1.13 s a cycle), 380 s
  // beside the rest of //... (1.9 s). The target of 180 s needs an idle machine: the test is
  // exclusive in Bazel, and this bound only catches a cycle gone much slower (each cycle has its own).
  EXPECT_LT(secs, 600.0) << "the cycles must fit CI's time";
}

TEST(Launcher, BadFlags_OneClearLineAndExitCode2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--coordinator_address=10.0.0.1:0",
       "is not loopback: every hop off this host needs mutual TLS; pass --tls_cert, --tls_key and --tls_ca"},
      {"--sweep=2,20", "stagehand: sweep: 20 workers: "},  // too many CPU workers or stages: either way refused
      {"--gpus=0", "--gpus=0: must be at least 1"},
      {"--workers=-1", "--workers=-1: out of range; pass --workers=N with 1 <= N <= 1024"},
      {"--device=tpu", "--device=tpu: unknown device"},
      {"--job=/nonexistent/job.textproto", "cannot read it"},
      {"--steps=zero", "--steps=zero:"},
      {"--no_such_flag", "unknown flag --no_such_flag"},
  };
  for (const auto& [flag, message] : cases) {
    Launcher l({"--device=cpu", flag});
    EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 2) << flag << ": " << l.output();
    std::string out = l.output();
    EXPECT_NE(out.find(message), std::string::npos) << flag << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << flag << ": " << out;
    EXPECT_NE(access(l.run_dir().c_str(), F_OK), 0) << flag << ": a run directory was created";
  }
}

// ---- The run directory: refused before anything starts, and results that survive faults. ----

std::vector<std::string> Lines(const std::string& text) { return absl::StrSplit(text, '\n', absl::SkipEmpty()); }

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

// steps.csv as a reader finds it: every row whole (six fields, ended by a newline). Returns the rows
// after the header, or -1 (with a failure) when a row is cut.
int WholeStepRows(const std::string& path) {
  const std::string text = ReadFile(path);
  if (text.empty()) return 0;
  EXPECT_EQ(text.back(), '\n') << path << " ends in a cut row";
  std::vector<std::string> lines = Lines(text);
  EXPECT_EQ(lines[0], "step,rank,loss,seconds,tokens,peak_memory_bytes");
  for (const std::string& line : lines) {
    if (std::count(line.begin(), line.end(), ',') != 5) {
      ADD_FAILURE() << path << ": cut row '" << line << "'";
      return -1;
    }
  }
  return static_cast<int>(lines.size()) - 1;
}

// report.json is whole or absent: when present it parses as a RunReport.
std::optional<stagehand::RunReport> ReportIfPresent(const std::string& run_dir) {
  const std::string path = run_dir + "/report.json";
  if (access(path.c_str(), F_OK) != 0) return std::nullopt;
  stagehand::RunReport report;
  const auto status = google::protobuf::util::JsonStringToMessage(ReadFile(path), &report);
  EXPECT_TRUE(status.ok()) << path << " is not whole JSON: " << status.ToString();
  return report;
}

int StepRowsNow(const std::string& run_dir) {
  return static_cast<int>(Lines(ReadFile(run_dir + "/steps.csv")).size()) - 1;
}

TEST(Launcher, RunDir_EarlierRunWithoutOverwrite_Exits2AndTouchesNothing) {
  const std::string dir = absl::StrCat(TempDir(), "/reused_", getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  std::ofstream(dir + "/rank3.log") << "a line of an earlier run\n";
  std::vector<std::string> args = CpuJob(2, 3);
  args.push_back("--run_dir=" + dir);
  Launcher refused(args);
  EXPECT_EQ(refused.Wait(std::chrono::seconds(10)), 2) << refused.output();
  EXPECT_NE(refused.output().find("is not empty (rank3.log); pass --overwrite"), std::string::npos) << refused.output();
  EXPECT_EQ(Lines(refused.output()).size(), 1u) << refused.output();
  EXPECT_EQ(DirEntries(dir), std::vector<std::string>{"rank3.log"});

  args.push_back("--overwrite");
  Launcher replaced(args);
  ASSERT_EQ(replaced.Wait(std::chrono::seconds(60)), 0) << replaced.output();
  const std::vector<std::string> entries = DirEntries(dir);
  EXPECT_EQ(std::count(entries.begin(), entries.end(), "rank3.log"), 0) << "a stale rank log mixes with the new run";
  EXPECT_EQ(std::count(entries.begin(), entries.end(), "rank1.log"), 1);
  EXPECT_EQ(ReadFile(dir + "/rank0.log").find("earlier run"), std::string::npos);
}

TEST(Launcher, RunDir_ReadOnlyOrAFile_Exits2AndCreatesNothing) {
  const std::string base = absl::StrCat(TempDir(), "/readonly_", getpid());
  ScopedTmpfs ro(base, "64k", "ro");
  if (!ro.ok()) {
    ASSERT_EQ(mkdir(base.c_str(), 0555), 0);  // without root a directory without write permission
    if (access(base.c_str(), W_OK) == 0) GTEST_SKIP() << ro.why();
  }
  const std::string file = absl::StrCat(TempDir(), "/a_file_", getpid());
  std::ofstream(file) << "not a directory\n";
  for (const std::string& dir : {base, base + "/new", file}) {
    std::vector<std::string> args = CpuJob(2, 3);
    args.push_back("--run_dir=" + dir);
    Launcher l(args);
    EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 2) << dir << ": " << l.output();
    EXPECT_EQ(Lines(l.output()).size(), 1u) << l.output();
    EXPECT_NE(l.output().find("--run_dir=" + dir), std::string::npos) << l.output();
  }
  EXPECT_TRUE(DirEntries(base).empty());
  EXPECT_EQ(ReadFile(file), "not a directory\n");
}

TEST(Launcher, Sighup_HandledAsSigterm_Exits143WithResults) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  // 10 steps of both ranks: a row per (step, rank).
  ASSERT_TRUE(WaitFor([&] { return StepRowsNow(l.run_dir()) >= 2 * 10; }, std::chrono::seconds(30))) << l.output();
  kill(l.pid(), SIGHUP);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 143) << l.output();
  EXPECT_NE(l.output().find("stagehand: stopped by SIGHUP (handled as SIGTERM; exit 143); "), std::string::npos)
      << l.output();
  std::optional<stagehand::RunReport> report = ReportIfPresent(l.run_dir());
  ASSERT_TRUE(report.has_value()) << "no report.json after SIGHUP";
  EXPECT_EQ(report->exit_code(), 143);
  EXPECT_EQ(report->steps(), 10000000);
  EXPECT_GE(report->steps_done(), 10);
  EXPECT_LT(report->steps_done(), 10000000);
  EXPECT_GE(WholeStepRows(l.run_dir() + "/steps.csv"), 2 * 10);
  EXPECT_FALSE(ReadFile(l.run_dir() + "/trace.json").empty());
  EXPECT_FALSE(ReadFile(l.run_dir() + "/startup_ledger.tsv").empty());
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

TEST(Launcher, KillLauncher_Sigkill_StepsSoFarKeptAndReportWholeOrAbsent) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(WaitFor([&] { return StepRowsNow(l.run_dir()) >= 40; }, std::chrono::seconds(30))) << l.output();
  const int seen = StepRowsNow(l.run_dir());
  kill(l.pid(), SIGKILL);
  EXPECT_EQ(l.Wait(std::chrono::seconds(5)), 128 + SIGKILL);
  EXPECT_GE(WholeStepRows(l.run_dir() + "/steps.csv"), seen);
  (void)ReportIfPresent(l.run_dir());
  ExpectNothingLeft(job, std::chrono::seconds(5));
}

// A run whose steps.csv fills the disk part-way: it is stopped, exits 5 naming the file, and leaves
// whole rows and no cut file.
TEST(Launcher, FullDisk_StepsCsvMidRun_Exits5NamingThePathNoCutFile) {
  ScopedTmpfs fs(absl::StrCat(TempDir(), "/full_mid_", getpid()), "256k");
  if (!fs.ok()) GTEST_SKIP() << fs.why();
  ASSERT_TRUE(fs.LeaveFree(32 * 1024));
  std::vector<std::string> args = CpuJob(2, 10000000);
  args.push_back("--run_dir=" + fs.dir() + "/run");
  Launcher l(args);
  std::string job = l.JobId();
  EXPECT_EQ(l.Wait(std::chrono::seconds(60)), 5) << l.output();
  EXPECT_NE(l.output().find("cannot write " + fs.dir() + "/run/steps.csv: No space left on device"), std::string::npos)
      << l.output();
  EXPECT_NE(l.output().find("FAILED (exit 5)"), std::string::npos) << l.output();
  EXPECT_GT(WholeStepRows(fs.dir() + "/run/steps.csv"), 0);
  (void)ReportIfPresent(fs.dir() + "/run");
  ExpectNothingLeft(job, std::chrono::seconds(1));
}

// A run that ends well but whose trace.json does not fit: exit 5 naming trace.json; no trace.json
// under its name, and report.json (written last, it fits) says why.
TEST(Launcher, FullDisk_ResultsAtTheEnd_Exits5NamingThePathNoCutFile) {
  ScopedTmpfs fs(absl::StrCat(TempDir(), "/full_end_", getpid()), "256k");
  if (!fs.ok()) GTEST_SKIP() << fs.why();
  ASSERT_TRUE(fs.LeaveFree(64 * 1024));
  const std::string dir = fs.dir() + "/run";
  Launcher l({"--device=cpu", "--workers=2", "--model=tiny", "--steps=20", "--run_dir=" + dir});
  std::string job = l.JobId();
  EXPECT_EQ(l.Wait(std::chrono::seconds(60)), 5) << l.output();
  EXPECT_NE(l.output().find("cannot write " + dir + "/trace.json: No space left on device"), std::string::npos)
      << l.output();
  EXPECT_NE(access((dir + "/trace.json").c_str(), F_OK), 0) << "a cut trace.json";
  EXPECT_NE(access((dir + "/.trace.json.tmp").c_str(), F_OK), 0);
  EXPECT_EQ(WholeStepRows(dir + "/steps.csv"), 2 * 20);
  if (std::optional<stagehand::RunReport> report = ReportIfPresent(dir)) {
    EXPECT_EQ(report->exit_code(), 5);
    EXPECT_NE(report->root_cause().find("trace.json"), std::string::npos) << report->root_cause();
    EXPECT_EQ(report->steps_done(), 20);
  }
  ExpectNothingLeft(job, std::chrono::seconds(1));
}

// A model on CPU workers with --timing=false: no bubble without timing, no MFU and no GPU columns
// without a GPU, the partition line once, and no ETA from the first step (it includes start-up).
TEST(Launcher, CpuModel_TimingOff_NoBubbleMfuOrGpuColumnsOnePartitionLine) {
  Launcher l({"--device=cpu", "--workers=2", "--model=tiny", "--steps=4", "--timing=false"});
  ASSERT_EQ(l.Wait(std::chrono::seconds(60)), 0) << l.output();
  const std::string out = l.output();
  for (const char* absent : {"bubble 100.0%", "MFU", "cuda_ready", "nccl_ready", "memory per GPU"}) {
    EXPECT_EQ(out.find(absent), std::string::npos) << absent << " in:\n" << out;
  }
  std::smatch summary;  // the plan line's predicted bubble is a prediction; the summary measures
  ASSERT_TRUE(std::regex_search(out, summary, std::regex("stagehand: [0-9.]+ s/step[^\n]*"))) << out;
  EXPECT_EQ(summary.str().find("bubble"), std::string::npos) << summary.str();
  size_t partitions = 0;
  for (size_t at = out.find("partition: "); at != std::string::npos; at = out.find("partition: ", at + 1)) ++partitions;
  EXPECT_EQ(partitions, 1u) << out;
  std::smatch first;
  ASSERT_TRUE(std::regex_search(out, first, std::regex("stagehand: step 1/4[^\n]*"))) << out;
  EXPECT_EQ(first.str().find("ETA"), std::string::npos) << first.str();
  EXPECT_NE(out.find("step 2/4"), std::string::npos) << out;
  EXPECT_NE(ReadFile(l.run_dir() + "/startup_ledger.tsv").find("\tn/a\t"), std::string::npos);
}

// AdamW at --lr=10 with --weight_decay=10 multiplies every weight by -99 a step: the loss overflows to
// NaN by step 4 and stays there. The run stops after 5 non-finite steps in a row (exit 1), not exit 0.
TEST(Launcher, LossNaNStepAfterStep_StopsExit1AdvisingALowerLr) {
  Launcher l({"--device=cpu", "--workers=1", "--model=tiny", "--lr=10", "--weight_decay=10", "--steps=1000"});
  ASSERT_EQ(l.Wait(std::chrono::seconds(60)), 1) << l.output();
  const std::string out = l.output();
  EXPECT_NE(ReadFile(l.run_dir() + "/steps.csv").find(",nan,"), std::string::npos) << "the flags gave no NaN";
  EXPECT_TRUE(
      std::regex_search(LastLine(out), std::regex("^stagehand: FAILED \\(exit 1\\): the loss was (NaN|infinite) "
                                                  "at 5 steps in a row \\([0-9]+-[0-9]+\\) on rank 0: the "
                                                  "training diverged; pass a lower --lr \\(this run's: 10\\)")))
      << out;
  std::optional<stagehand::RunReport> report = ReportIfPresent(l.run_dir());
  ASSERT_TRUE(report.has_value());
  EXPECT_LT(report->steps_done(), 1000);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(TempDir(), "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// Bad input through the real binary: one line, exit 2, no run directory, no worker.
TEST(Launcher, InvalidInput_OneLineExit2NoRunDirectory) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--lr=nan"}, "--lr=nan: not a finite number"},
      {{"--peak_tflops=nan"}, "--peak_tflops=nan: not a finite number"},
      {{"--peak_tflops=inf"}, "--peak_tflops=inf: not a finite number"},
      {{"--peak_tflops=0"}, "--peak_tflops=0: pass the peak TFLOP/s of one device, a number above 0"},
      {{"--peak_tflops=-5"}, "--peak_tflops=-5: pass the peak TFLOP/s"},
      {{"--val_fraction=1e999"}, "--val_fraction=1e999: not a finite number"},
      {{"--replica_gbps=-inf"}, "--replica_gbps=-inf: not a finite number"},
      {{"--lr=-1"}, "--lr=-1: out of range"},
      {{"--micro_batches=0"}, "--micro_batches=0: out of range"},
      {{"--model=tiny", "--seq=1000000"}, "--seq=1000000: out of range"},
      {{"--workers=9999"}, "--workers=9999"},
      {{"--workers=2147483647"}, "--workers=2147483647"},
      {{"--job=/proc/self/mem"}, "--job=/proc/self/mem: cannot read it"},
      {{"--job=" + WriteTemp("dotdot.textproto", "name: \"../../x\"")}, "names its directory under runs/"},
      {{"--job=" + WriteTemp("negative.textproto", "workers: -3")}, "workers: -3 is out of range"},
      {{"--job=" + WriteTemp("interval.textproto", "timeouts { heartbeat_interval_ms: -5 }")},
       "timeouts.heartbeat_interval_ms: -5 is out of range"},
      {{"--job=" + WriteTemp("garbled.textproto", "steps: \"many\"\nbogus: 1\n")}, "line 1 column"},
      {{"--coordinator_address=127.evil.test:0"}, "--coordinator_address=127.evil.test:0"},
      {{"--model=tiny", "--data=" + TempDir() + "/no_tokens.bin"}, "No such file"},
      {{"--model=tiny", "--data=" + WriteTemp("odd.bin", std::string(4097, '\0'))}, "an odd count"},
      {{"--model=tiny", "--vocab=100",
        "--data=" + WriteTemp("oov.bin", std::string(8190, '\0') + "\xc8" + std::string(1, '\0'))},
       "at position 4095"},
      {{"--sweep=2,20"}, "sweep: 20 workers:"},
      // bench/bench_startup's command before --model=allreduce: it timed a training step, not the collective.
      {{"--workers=1", "--steps=1", "--tensor_elements=4096"}, "pass --model=allreduce, or drop --tensor_elements"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = {"--device=cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    Launcher l(args);
    const std::string what = absl::StrJoin(flags, " ");
    EXPECT_EQ(l.Wait(std::chrono::seconds(20)), 2) << what << ": " << l.output();
    std::string out = l.output();
    EXPECT_NE(out.find(message), std::string::npos) << what << ": " << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 1) << what << ": " << out;
    EXPECT_NE(access(l.run_dir().c_str(), F_OK), 0) << what << ": a run directory was created";
  }
}

TEST(Launcher, Version_PrintsVersionAndProtocol) {
  Launcher l({"--version"});
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 0);
  EXPECT_NE(l.output().find("coordinator protocol"), std::string::npos) << l.output();
}

// --help states each flag's real default: no "default: -1" beside "(default 10)".
TEST(Launcher, Help_NoSentinelDefaultBesideStatedOne) {
  Launcher l({"--help"});
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 0);
  const std::string out = l.output();
  EXPECT_NE(out.find("--steps"), std::string::npos) << out;
  EXPECT_EQ(out.find("default: -1"), std::string::npos) << out;
  EXPECT_EQ(out.find("--micro-batches"), std::string::npos) << out;
}

// --help groups the flags by topic, and every flag has one (none under "Other flags").
TEST(Launcher, Help_FlagsByTopic_EveryFlagInOne) {
  Launcher l({"--help"});
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 0);
  const std::string out = l.output();
  size_t last = 0;
  for (const char* topic :
       {"The job:", "The model", "Pipeline and parallelism:", "Training loop:", "Checkpoints and weights:",
        "Failure detection:", "GPUs:", "Outputs and startup:", "Several hosts:", "Serve"}) {
    const size_t at = out.find(absl::StrCat("\n\n", topic));
    ASSERT_NE(at, std::string::npos) << topic << " in:\n" << out;
    EXPECT_GT(at, last) << topic;
    last = at;
  }
  EXPECT_EQ(out.find("Other flags:"), std::string::npos) << out;
  EXPECT_NE(out.find("Checkpoints and weights:\n"), std::string::npos);
  EXPECT_LT(out.find("Checkpoints and weights:"), out.find("--checkpoint_every")) << out;
}

// --help tells the truth: the "--gpus=2 --steps=100" example does not call itself an all-reduce (the
// default model on GPUs trains gpt-1.3b; --model=allreduce does), exit code 75 is listed, and no flag
// that Llama takes too is labelled "GPT:".
TEST(Launcher, Help_ExamplesExitCodesAndLabelsTrue) {
  Launcher l({"--help"});
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 0);
  const std::string out = l.output();
  std::smatch example;
  ASSERT_TRUE(std::regex_search(out, example, std::regex("launcher --gpus=2 --steps=100 [^\n]*"))) << out;
  EXPECT_EQ(example.str().find("all-reduce"), std::string::npos) << example.str();
  EXPECT_NE(out.find("--model=allreduce      two GPUs, a checked all-reduce per step"), std::string::npos) << out;
  for (const char* code : {" 75 stopped by SIGTERM or SIGHUP after every rank wrote a checkpoint",
                           "130 stopped by SIGINT", "143 stopped by SIGTERM"}) {
    EXPECT_NE(out.find(code), std::string::npos) << code << " in:\n" << out;
  }
  EXPECT_EQ(out.find("GPT:"), std::string::npos) << out;
}

}  // namespace
