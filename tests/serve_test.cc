// `launcher --serve` end to end on loopback, with real processes: the server, its workers, the client
// binary as a user runs it and the client library for the many-watcher cases. Each test starts its
// own server on a free port with its own state directory; every wait is bounded.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "client/control_client.h"
#include "tests/test_util.h"

namespace stagehand {
namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;
using Clock = std::chrono::steady_clock;

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// The pids whose parent is `parent` (the server's workers).
std::vector<int> ChildrenOf(int parent) {
  std::vector<int> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  while (dirent* e = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    int ppid = 0;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) && ppid == parent && fields[0] != "Z")
      out.push_back(pid);
  }
  closedir(proc);
  return out;
}

bool Alive(int pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t close = stat.rfind(')');
  return close != std::string::npos && stat.size() > close + 2 && stat[close + 2] != 'Z';
}

// A `launcher --serve` process on 127.0.0.1, port chosen by the kernel.
class Server {
 public:
  explicit Server(std::string state_dir, std::vector<std::string> extra = {}) : state_dir_(std::move(state_dir)) {
    static int counter = 0;
    log_ = absl::StrCat(TempDir(), "/server", getpid(), "_", counter++, ".log");
    std::vector<std::string> args = {Runfile("launcher/launcher"), "--serve", "--listen=127.0.0.1:0",
                                     "--state_dir=" + state_dir_};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    WaitFor([&] { return !address().empty() || !Running(); }, std::chrono::seconds(30));
  }
  ~Server() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool Running() {
    if (reaped_) return false;
    int status;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      reaped_ = true;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return !reaped_;
  }
  // From the line "stagehand: serving on ADDR ..."; "" until it is printed.
  std::string address() const {
    const std::string log = ReadFile(log_);
    const size_t at = log.rfind("serving on ");
    if (at == std::string::npos) return "";
    const size_t start = at + 11;
    return log.substr(start, log.find(' ', start) - start);
  }
  void Kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    reaped_ = true;
  }
  int Stop() {
    kill(pid_, SIGTERM);
    WaitFor([&] { return !Running(); }, std::chrono::seconds(20));
    return exit_code_;
  }
  int pid() const { return pid_; }
  int exit_code() const { return exit_code_; }  // once !Running()
  std::string log() const { return ReadFile(log_); }
  std::string token_file() const { return state_dir_ + "/admin.token"; }

 private:
  std::string state_dir_;
  std::string log_;
  int pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
};

struct ClientResult {
  int exit_code = -1;
  std::string output;
};

// The client binary, as a user runs it: `client ARGS` with the server and token in the environment.
ClientResult RunClient(const Server& server, const std::string& args, const std::string& token_file = "") {
  static int counter = 0;
  const std::string out = absl::StrCat(TempDir(), "/client", getpid(), "_", counter++, ".out");
  const std::string command =
      absl::StrCat("STAGEHAND_SERVER=", server.address(),
                   " STAGEHAND_TOKEN_FILE=", token_file.empty() ? server.token_file() : token_file, " timeout 120 ",
                   Runfile("client/client"), " ", args, " >", out, " 2>&1");
  const int status = std::system(command.c_str());
  ClientResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ReadFile(out);
  return r;
}

std::string LastLine(const std::string& text) {
  std::string t(absl::StripTrailingAsciiWhitespace(text));
  return t.substr(t.rfind('\n') == std::string::npos ? 0 : t.rfind('\n') + 1);
}

std::unique_ptr<ControlClient> Connect(const Server& server, const std::string& token) {
  ControlClientOptions o;
  o.server = server.address();
  o.token = token;
  absl::StatusOr<std::unique_ptr<ControlClient>> c = ControlClient::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

std::string AdminToken(const Server& server) {
  return std::string(absl::StripAsciiWhitespace(ReadFile(server.token_file())));
}

control::SubmitJobRequest TinyJob(int workers, int64_t steps, const std::string& submission) {
  control::SubmitJobRequest r;
  r.set_submission_id(submission);
  JobSpec* j = r.mutable_job();
  j->set_device("cpu");
  j->set_workers(workers);
  j->set_steps(steps);
  j->set_model("tiny");
  return r;
}

control::JobInfo WaitForEnd(ControlClient& c, const std::string& id, std::chrono::seconds timeout) {
  control::JobInfo info;
  WaitFor(
      [&] {
        absl::StatusOr<control::JobInfo> got = c.Get(id);
        if (got.ok()) info = *got;
        return got.ok() && info.end_time_ms() > 0;
      },
      timeout);
  return info;
}

class ServeTest : public ::testing::Test {
 protected:
  std::string StateDir() {
    static int counter = 0;
    return absl::StrCat(TempDir(), "/state", getpid(), "_", counter++);
  }
};

TEST_F(ServeTest, SubmitWatchFetch_TinyJob_EveryStepStreamedAndFilesMatch) {
  const std::string state = StateDir();
  Server server(state);
  ASSERT_FALSE(server.address().empty()) << server.log();
  ClientResult submit = RunClient(server, "submit --device=cpu --workers=2 --model=tiny --steps=8");
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = LastLine(submit.output);
  ClientResult watch = RunClient(server, "watch " + id);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  int steps = 0;
  for (absl::string_view line : absl::StrSplit(watch.output, '\n')) {
    steps += absl::StrContains(line, "step ") && absl::StrContains(line, "/8 ");
  }
  EXPECT_EQ(steps, 8) << watch.output;
  const std::string fetched = absl::StrCat(TempDir(), "/steps_", id, ".csv");
  ClientResult fetch = RunClient(server, absl::StrCat("fetch ", id, " steps.csv --output=", fetched));
  ASSERT_EQ(fetch.exit_code, 0) << fetch.output;
  const std::string ours = ReadFile(absl::StrCat(state, "/runs/", id, "/steps.csv"));
  EXPECT_FALSE(ours.empty());
  EXPECT_EQ(ReadFile(fetched), ours);
  ClientResult list = RunClient(server, "list");
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, id)) << list.output;
  // The launcher's own lines are in the run directory too, and the same file comes to stdout.
  ClientResult launcher_log = RunClient(server, "logs " + id + " --launcher");
  ASSERT_EQ(launcher_log.exit_code, 0) << launcher_log.output;
  EXPECT_TRUE(absl::StrContains(launcher_log.output, "stagehand: job " + id)) << launcher_log.output;
  ClientResult to_stdout = RunClient(server, absl::StrCat("fetch ", id, " launcher.log --output=-"));
  ASSERT_EQ(to_stdout.exit_code, 0) << to_stdout.output;
  EXPECT_EQ(to_stdout.output, ReadFile(absl::StrCat(state, "/runs/", id, "/launcher.log")));
  // A job that fails: watch exits with its exit code.
  ClientResult bad =
      RunClient(server, "submit --device=cpu --workers=2 --model=tiny --steps=3 --data=/nonexistent --watch");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  // A path outside the job roots is refused, saying nothing of the file.
  ClientResult shadow = RunClient(server, "submit --device=cpu --workers=2 --model=tiny --steps=3 --data=/etc/shadow");
  EXPECT_EQ(shadow.exit_code, 2) << shadow.output;
  EXPECT_TRUE(absl::StrContains(shadow.output, "--job_roots=")) << shadow.output;
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST_F(ServeTest, Cancel_RunningJob_ClientSaysCancelledAndEveryProcessGoneWithin5s) {
  Server server(StateDir());
  ASSERT_FALSE(server.address().empty()) << server.log();
  ClientResult submit = RunClient(server, "submit --device=cpu --workers=2 --model=tiny --steps=1000000");
  ASSERT_EQ(submit.exit_code, 0) << submit.output;
  const std::string id = LastLine(submit.output);
  std::unique_ptr<ControlClient> c = Connect(server, AdminToken(server));
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<control::JobInfo> info = c->Get(id);
        return info.ok() && info->steps_done() > 0;
      },
      std::chrono::seconds(60)))
      << server.log();
  const std::vector<int> workers = ChildrenOf(server.pid());
  ASSERT_EQ(workers.size(), 2u);
  const auto cancel_start = Clock::now();
  ClientResult cancel = RunClient(server, "cancel " + id);
  EXPECT_EQ(cancel.exit_code, 0) << cancel.output;
  EXPECT_TRUE(absl::StrContains(cancel.output, "cancelled")) << cancel.output;
  EXPECT_TRUE(WaitFor(
      [&] {
        for (int pid : workers) {
          if (Alive(pid)) return false;
        }
        return true;
      },
      std::chrono::seconds(5) - std::chrono::duration_cast<std::chrono::seconds>(Clock::now() - cancel_start)))
      << "a worker of the cancelled job outlived 5 s";
  absl::StatusOr<control::JobInfo> info = c->Get(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state(), control::JOB_STATE_CANCELLED);
  EXPECT_EQ(info->cancelled_by(), "admin");
}

TEST_F(ServeTest, Queue_JobsOverTheCap_RunOneAfterTheOther_JobsThatFit_RunAtOnce) {
  Server server(StateDir(), {"--max_cpu_workers=4"});
  ASSERT_FALSE(server.address().empty()) << server.log();
  std::unique_ptr<ControlClient> c = Connect(server, AdminToken(server));
  absl::StatusOr<control::JobInfo> a = c->Submit(TinyJob(3, 40, "a"));
  absl::StatusOr<control::JobInfo> b = c->Submit(TinyJob(3, 40, "b"));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  const control::JobInfo a_end = WaitForEnd(*c, a->id(), std::chrono::seconds(120));
  const control::JobInfo b_end = WaitForEnd(*c, b->id(), std::chrono::seconds(120));
  ASSERT_EQ(a_end.state(), control::JOB_STATE_SUCCEEDED) << a_end.root_cause();
  ASSERT_EQ(b_end.state(), control::JOB_STATE_SUCCEEDED) << b_end.root_cause();
  EXPECT_GE(b_end.start_time_ms(), a_end.end_time_ms()) << "3 + 3 workers on a cap of 4 ran at once";

  absl::StatusOr<control::JobInfo> x = c->Submit(TinyJob(2, 40, "x"));
  absl::StatusOr<control::JobInfo> y = c->Submit(TinyJob(2, 40, "y"));
  ASSERT_TRUE(x.ok() && y.ok()) << x.status() << y.status();
  const control::JobInfo x_end = WaitForEnd(*c, x->id(), std::chrono::seconds(120));
  const control::JobInfo y_end = WaitForEnd(*c, y->id(), std::chrono::seconds(120));
  ASSERT_EQ(x_end.state(), control::JOB_STATE_SUCCEEDED) << x_end.root_cause();
  ASSERT_EQ(y_end.state(), control::JOB_STATE_SUCCEEDED) << y_end.root_cause();
  EXPECT_LT(y_end.start_time_ms(), x_end.end_time_ms()) << "2 + 2 workers on a cap of 4 did not run at once";
  EXPECT_LT(x_end.start_time_ms(), y_end.end_time_ms());

  // A repeated submission id is the first submission's job, not a second one.
  absl::StatusOr<control::JobInfo> again = c->Submit(TinyJob(2, 40, "x"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), x->id());
}

TEST_F(ServeTest, Refusals_NoToken_ViewToken_PathOut_NeverFits) {
  Server server(StateDir(), {"--max_cpu_workers=2"});
  ASSERT_FALSE(server.address().empty()) << server.log();
  std::unique_ptr<ControlClient> admin = Connect(server, AdminToken(server));
  std::unique_ptr<ControlClient> none = Connect(server, "");
  EXPECT_EQ(none->List({}).status().code(), absl::StatusCode::kUnauthenticated);
  std::unique_ptr<ControlClient> wrong = Connect(server, "sh_not_a_token");
  EXPECT_EQ(wrong->List({}).status().code(), absl::StatusCode::kUnauthenticated);
  // GetServerInfo needs no token.
  EXPECT_TRUE(none->Info().ok());

  absl::StatusOr<std::string> view_token = admin->Mint("viewer", control::ROLE_VIEW);
  ASSERT_TRUE(view_token.ok()) << view_token.status();
  std::unique_ptr<ControlClient> viewer = Connect(server, *view_token);
  absl::StatusOr<control::JobInfo> refused = viewer->Submit(TinyJob(2, 3, "v"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied) << refused.status();
  EXPECT_TRUE(viewer->List({}).ok());

  absl::StatusOr<control::JobInfo> too_big = admin->Submit(TinyJob(3, 3, "big"));
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(too_big.status().message(), "--workers=2")) << too_big.status();

  absl::StatusOr<control::JobInfo> job = admin->Submit(TinyJob(2, 3, "ok"));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(WaitForEnd(*admin, job->id(), std::chrono::seconds(60)).state(), control::JOB_STATE_SUCCEEDED);
  const std::string out = TempDir() + "/fetched_passwd";
  absl::StatusOr<int64_t> escaped = viewer->Fetch(job->id(), "../../../../etc/passwd", out);
  EXPECT_EQ(escaped.status().code(), absl::StatusCode::kInvalidArgument) << escaped.status();
  struct stat st;
  EXPECT_NE(stat(out.c_str(), &st), 0) << "a refused fetch left a file";
  absl::StatusOr<int64_t> report = viewer->Fetch(job->id(), "report.json", TempDir() + "/report.json");
  EXPECT_TRUE(report.ok()) << report.status();

  // The client binary says what to do.
  ClientResult no_token = RunClient(server, "list", "/nonexistent/token");
  EXPECT_NE(no_token.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(no_token.output, "token")) << no_token.output;
}

// Tokens through the client binary across a restart: a revoked name is never reused, `token list`
// shows every record, and a lost admin.token is replaced with --new_admin_token.
TEST_F(ServeTest, Tokens_RevokeListAndALostAdminToken_AcrossARestart) {
  const std::string state = StateDir();
  std::string first_admin;
  {
    Server server(state);
    ASSERT_FALSE(server.address().empty()) << server.log();
    first_admin = AdminToken(server);
    ClientResult mint = RunClient(server, "token mint carol --role=submit");
    ASSERT_EQ(mint.exit_code, 0) << mint.output;
    ClientResult revoke = RunClient(server, "token revoke carol");
    ASSERT_EQ(revoke.exit_code, 0) << revoke.output;
    ClientResult reuse = RunClient(server, "token mint carol --role=view");
    EXPECT_NE(reuse.exit_code, 0);
    EXPECT_TRUE(absl::StrContains(reuse.output, "was revoked")) << reuse.output;
    EXPECT_EQ(server.Stop(), 0) << server.log();
  }
  ASSERT_EQ(unlink((state + "/admin.token").c_str()), 0);  // the admin token is lost
  Server plain(state);
  ASSERT_FALSE(plain.address().empty()) << plain.log();
  EXPECT_TRUE(absl::StrContains(plain.log(), "--new_admin_token")) << plain.log();
  EXPECT_EQ(plain.Stop(), 0);
  Server server(state, {"--new_admin_token"});
  ASSERT_FALSE(server.address().empty()) << server.log();
  EXPECT_TRUE(absl::StrContains(server.log(), "admin token 'admin2'")) << server.log();
  ClientResult list = RunClient(server, "token list");
  ASSERT_EQ(list.exit_code, 0) << list.output;
  EXPECT_TRUE(absl::StrContains(list.output, "admin2")) << list.output;
  // carol's line has a revoke time; the admins' do not.
  bool carol_revoked = false;
  for (absl::string_view line : absl::StrSplit(list.output, '\n')) {
    if (absl::StartsWith(line, "carol "))
      carol_revoked = !absl::EndsWith(absl::StripTrailingAsciiWhitespace(line), "-");
    if (absl::StartsWith(line, "admin "))
      EXPECT_TRUE(absl::EndsWith(absl::StripTrailingAsciiWhitespace(line), "-")) << line;
  }
  EXPECT_TRUE(carol_revoked) << list.output;
  // The first admin token still works, until revoked.
  std::unique_ptr<ControlClient> old_admin = Connect(server, first_admin);
  EXPECT_TRUE(old_admin->List({}).ok());
}

TEST_F(ServeTest, Kill9_OneRunningOneQueued_RestartMarksLostAndRunsTheQueued) {
  const std::string state = StateDir();
  std::string running_id, queued_id, done_id;
  std::vector<int> workers;
  {
    Server server(state, {"--max_cpu_workers=2"});
    ASSERT_FALSE(server.address().empty()) << server.log();
    std::unique_ptr<ControlClient> c = Connect(server, AdminToken(server));
    absl::StatusOr<control::JobInfo> done = c->Submit(TinyJob(2, 3, "done"));
    ASSERT_TRUE(done.ok()) << done.status();
    done_id = done->id();
    ASSERT_EQ(WaitForEnd(*c, done_id, std::chrono::seconds(60)).state(), control::JOB_STATE_SUCCEEDED);
    absl::StatusOr<control::JobInfo> running = c->Submit(TinyJob(2, 1000000, "long"));
    absl::StatusOr<control::JobInfo> queued = c->Submit(TinyJob(2, 5, "next"));
    ASSERT_TRUE(running.ok() && queued.ok());
    running_id = running->id();
    queued_id = queued->id();
    ASSERT_TRUE(WaitFor(
        [&] {
          absl::StatusOr<control::JobInfo> info = c->Get(running_id);
          return info.ok() && info->steps_done() > 0;
        },
        std::chrono::seconds(60)));
    absl::StatusOr<control::JobInfo> q = c->Get(queued_id);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(q->state(), control::JOB_STATE_QUEUED);
    EXPECT_EQ(q->queue_position(), 1);
    workers = ChildrenOf(server.pid());
    server.Kill9();
  }
  // The workers die with the server (PR_SET_PDEATHSIG), the store survives it.
  EXPECT_TRUE(WaitFor(
      [&] {
        for (int pid : workers) {
          if (Alive(pid)) return false;
        }
        return true;
      },
      std::chrono::seconds(5)));
  Server server(state, {"--max_cpu_workers=2"});
  ASSERT_FALSE(server.address().empty()) << server.log();
  EXPECT_TRUE(absl::StrContains(server.log(), "marked lost")) << server.log();
  std::unique_ptr<ControlClient> c = Connect(server, AdminToken(server));
  absl::StatusOr<control::JobInfo> lost = c->Get(running_id);
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_EQ(lost->state(), control::JOB_STATE_LOST);
  EXPECT_TRUE(absl::StrContains(lost->root_cause(), "server")) << lost->root_cause();
  EXPECT_EQ(WaitForEnd(*c, queued_id, std::chrono::seconds(60)).state(), control::JOB_STATE_SUCCEEDED);
  absl::StatusOr<control::ListJobsResponse> list = c->List({});
  ASSERT_TRUE(list.ok());
  std::set<std::string> ids;
  for (const control::JobInfo& j : list->jobs()) ids.insert(j.id());
  EXPECT_EQ(ids, (std::set<std::string>{done_id, running_id, queued_id}));
}

TEST_F(ServeTest, Watch_FiftyWatchersAndAResumedOne_EachSeesEveryEventOnce) {
  Server server(StateDir());
  ASSERT_FALSE(server.address().empty()) << server.log();
  const std::string token = AdminToken(server);
  std::unique_ptr<ControlClient> c = Connect(server, token);
  absl::StatusOr<control::JobInfo> job = c->Submit(TinyJob(2, 30, "watched"));
  ASSERT_TRUE(job.ok()) << job.status();
  constexpr int kWatchers = 50;
  std::vector<std::vector<int64_t>> seqs(kWatchers);
  std::vector<control::JobState> finals(kWatchers, control::JOB_STATE_UNSPECIFIED);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWatchers; ++w) {
    threads.emplace_back([&, w] {
      std::unique_ptr<ControlClient> mine = Connect(server, token);
      absl::StatusOr<control::JobInfo> end =
          mine->Watch(job->id(), false, 0, [&](const control::JobEvent& e) { seqs[w].push_back(e.seq()); });
      if (end.ok()) finals[w] = end->state();
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_FALSE(seqs[0].empty());
  for (int w = 0; w < kWatchers; ++w) {
    EXPECT_EQ(finals[w], control::JOB_STATE_SUCCEEDED) << "watcher " << w;
    EXPECT_EQ(seqs[w], seqs[0]) << "watcher " << w << " saw other events";
  }
  for (size_t i = 0; i < seqs[0].size(); ++i) EXPECT_EQ(seqs[0][i], static_cast<int64_t>(i + 1));
  // A watcher that stopped after event k and comes back from k misses nothing and repeats nothing.
  const int64_t k = static_cast<int64_t>(seqs[0].size()) / 2;
  std::vector<int64_t> resumed;
  absl::StatusOr<control::JobInfo> end =
      c->Watch(job->id(), false, k, [&](const control::JobEvent& e) { resumed.push_back(e.seq()); });
  ASSERT_TRUE(end.ok()) << end.status();
  EXPECT_EQ(resumed, std::vector<int64_t>(seqs[0].begin() + k, seqs[0].end()));
}

// Submissions that would wedge a server thread: a FIFO as an input is refused at once; a job whose
// check takes long does not keep SIGTERM from stopping the server.
TEST_F(ServeTest, WedgingSubmissions_FifoRefused_SigtermStopsTheServerWhileAJobIsChecked) {
  const std::string state = StateDir();
  setenv("STAGEHAND_TEST_SLOW_VALIDATION_MS", "30000", 1);  // the server's own: every check takes 30 s
  Server server(state);
  unsetenv("STAGEHAND_TEST_SLOW_VALIDATION_MS");
  ASSERT_FALSE(server.address().empty()) << server.log();
  ASSERT_EQ(mkdir((state + "/data").c_str(), 0700), 0);  // a job root by default
  const std::string fifo = state + "/data/profiles.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto start = Clock::now();
  ClientResult refused = RunClient(server, absl::StrCat("submit --device=cpu --workers=2 --model=tiny --steps=3 "
                                                        "--layout=auto --layout_profiles=",
                                                        fifo));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(absl::StrContains(refused.output, "not a regular file")) << refused.output;
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(15));
  // A check that runs long (the server's checks take 30 s here), from a client in the background; SIGTERM
  // while it runs stops the server at once and answers the waiting client.
  const std::string client_log = state + "/client.log";
  const std::string command = absl::StrCat(
      "(STAGEHAND_SERVER=", server.address(), " STAGEHAND_TOKEN_FILE=", server.token_file(), " timeout 60 ",
      Runfile("client/client"), " submit --device=cpu --workers=2 --model=tiny --steps=3 >", client_log,
      " 2>&1; echo \"exit $?\" >>", client_log, ") &");
  ASSERT_EQ(std::system(command.c_str()), 0);
  ASSERT_TRUE(
      WaitFor([&] { return absl::StrContains(server.log(), "checking a submission"); }, std::chrono::seconds(20)))
      << server.log();
  const auto stop = Clock::now();
  kill(server.pid(), SIGTERM);
  EXPECT_TRUE(WaitFor([&] { return !server.Running(); }, std::chrono::seconds(10))) << server.log();
  EXPECT_LT(Clock::now() - stop, std::chrono::seconds(8)) << server.log();
  EXPECT_TRUE(WaitFor([&] { return absl::StrContains(ReadFile(client_log), "exit "); }, std::chrono::seconds(20)))
      << ReadFile(client_log);
  EXPECT_TRUE(absl::StrContains(ReadFile(client_log), "shutting down")) << ReadFile(client_log) << server.log();
  unlink(fifo.c_str());
}

// A server that cannot listen (the port is another's) leaves no state directory behind; one whose
// state directory existed keeps it, its store included.
TEST_F(ServeTest, FailedStart_PortTaken_RemovesWhatItCreated) {
  Server first(StateDir());
  ASSERT_FALSE(first.address().empty()) << first.log();
  const std::string fresh = StateDir() + "/nested/state";
  Server second(fresh, {"--listen=" + first.address()});
  EXPECT_TRUE(WaitFor([&] { return !second.Running(); }, std::chrono::seconds(30)));
  EXPECT_NE(second.exit_code(), 0) << second.log();
  struct stat st;
  EXPECT_NE(stat(fresh.c_str(), &st), 0) << "the failed start left " << fresh;
  EXPECT_NE(stat((fresh + "/..").c_str(), &st), 0) << "the failed start left the state directory's parent";
  // An existing state directory: its store stays.
  const std::string kept = StateDir();
  {
    Server once(kept);
    ASSERT_FALSE(once.address().empty()) << once.log();
    EXPECT_EQ(once.Stop(), 0);
  }
  Server again(kept, {"--listen=" + first.address()});
  EXPECT_TRUE(WaitFor([&] { return !again.Running(); }, std::chrono::seconds(30)));
  EXPECT_EQ(stat((kept + "/jobs.db").c_str(), &st), 0);
  EXPECT_EQ(stat((kept + "/admin.token").c_str(), &st), 0);
}

TEST_F(ServeTest, ServerFlags_WithoutServe_AndJobFlagsWithServe_AreRefused) {
  const std::string command =
      absl::StrCat(Runfile("launcher/launcher"), " --state_dir=", TempDir(), "/x >/dev/null 2>&1");
  const int status = std::system(command.c_str());
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 2);
  const std::string with_job =
      absl::StrCat(Runfile("launcher/launcher"), " --serve --state_dir=", TempDir(), "/y --steps=3 >/dev/null 2>&1");
  const int status2 = std::system(with_job.c_str());
  EXPECT_EQ(WIFEXITED(status2) ? WEXITSTATUS(status2) : -1, 2);
  struct stat st;
  EXPECT_NE(stat((TempDir() + "/y").c_str(), &st), 0) << "a refused server created its state directory";
}

}  // namespace
}  // namespace stagehand
