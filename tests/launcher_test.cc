// Integration tests of the launcher with real processes over loopback (CPU workers): clean runs,
// a worker killed, the launcher killed, SIGINT, a hung worker, a wrong secret, bad flags. Each test
// checks that no process of the run outlives it.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "protos/coordinator.grpc.pb.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

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
  explicit Launcher(std::vector<std::string> args) {
    static int counter = 0;
    run_dir_ = absl::StrCat(TempDir(), "/run", getpid(), "_", counter++);
    output_ = run_dir_ + ".out";
    args.insert(args.begin(), Runfile("launcher/launcher"));
    args.push_back("--run_dir=" + run_dir_);
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Launcher() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
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
    WaitFor([&] { out = output(); return std::regex_search(out, m, re); }, timeout);
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
    return WaitFor([&] {
      std::string out = output();
      int n = 0;
      for (int r = 0; r < workers; ++r) n += out.find(absl::StrCat("[rank ", r, "]")) != std::string::npos;
      return n == workers;
    }, timeout);
  }

 private:
  int pid_ = 0;
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
  std::vector<std::string> ledger = absl::StrSplit(ReadFile(l.run_dir() + "/startup_ledger.tsv"), '\n', absl::SkipEmpty());
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
  EXPECT_NE(l.output().find("interrupted by SIGINT"), std::string::npos) << l.output();
  ExpectNothingLeft(job, std::chrono::milliseconds(500));
}

TEST(Launcher, Sigterm_GracefulStop_Exits143) {
  Launcher l(CpuJob(2, 10000000));
  std::string job = l.JobId();
  ASSERT_TRUE(l.WaitForWorkersUp(2, std::chrono::seconds(30))) << l.output();
  kill(l.pid(), SIGTERM);
  EXPECT_EQ(l.Wait(std::chrono::seconds(10)), 143) << l.output();
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
  auto stub = stagehand::Coordinator::NewStub(
      grpc::CreateChannel(l.CoordinatorAddress(), grpc::InsecureChannelCredentials()));
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

TEST(Launcher, BadFlags_OneClearLineAndExitCode2) {
  const std::vector<std::pair<std::string, std::string>> cases = {
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

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = absl::StrCat(TempDir(), "/", name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

// The input cases of issue 11, through the real binary: one line, exit 2, no run directory, no worker.
TEST(Launcher, InvalidInput_OneLineExit2NoRunDirectory) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--lr=nan"}, "--lr=nan: out of range"},
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
      {{"--model=tiny", "--vocab=100", "--data=" + WriteTemp("oov.bin", std::string(8190, '\0') + "\xc8" + std::string(1, '\0'))},
       "at position 4095"},
      {{"--sweep=2,20"}, "--sweep point 20"},
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

}  // namespace
