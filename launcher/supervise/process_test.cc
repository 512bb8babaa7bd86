// Tests of the POSIX process spawner with real processes (/bin/sh, /bin/sleep), of the bounded
// terminal writer its forwarders write to (with a fake terminal and a real pipe), and of the fakes.
#include "launcher/supervise/process.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launcher/supervise/fake_process.h"
#include "launcher/supervise/fake_terminal.h"
#include "launcher/supervise/terminal.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr absl::Duration kPatience = absl::Seconds(5);

// Polls cond every millisecond until it holds or kPatience passes.
bool WaitFor(const std::function<bool()>& cond) {
  const absl::Time deadline = absl::Now() + kPatience;
  while (!cond()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// Gone, or a zombie: it no longer runs (its parent, init or a subreaper, may not have reaped it yet).
bool ProcessEnded(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || stat.substr(paren + 2, 1) == "Z";
}

int ParentOf(int pid) {
  for (absl::string_view line : absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/status")), '\n')) {
    int ppid = 0;
    if (absl::ConsumePrefix(&line, "PPid:") && absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &ppid)) {
      return ppid;
    }
  }
  return -1;
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::string dir_template = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/process_test.XXXXXX");
    ASSERT_NE(mkdtemp(dir_template.data()), nullptr);
    dir_ = dir_template;
    spawner_ = NewPosixProcessSpawner();
  }

  // Kills what a test left running (a failed test included), so that no process outlives the test.
  void TearDown() override {
    for (int pid : spawned_) spawner_->SignalGroup(pid, SIGKILL);
    for (int pid : spawned_) WaitForExit(pid);
    spawner_.reset();
  }

  std::string Path(absl::string_view name) const { return absl::StrCat(dir_, "/", name); }

  ProcessSpec ShellSpec(const std::string& script) {
    ProcessSpec spec;
    spec.argv = {"/bin/sh", "-c", script};
    spec.env = {"PATH=/usr/bin:/bin"};
    spec.output_prefix = "[child] ";
    spec.log_path = Path(absl::StrCat("child", spawned_.size(), ".log"));
    return spec;
  }

  int Spawn(const ProcessSpec& spec) {
    absl::StatusOr<int> pid = spawner_->Spawn(spec);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return -1;
    spawned_.push_back(*pid);
    return *pid;
  }

  // Polls Reap() until pid is reported; keeps the other reports for later calls.
  ProcessExit WaitForExit(int pid) {
    const bool reported = WaitFor([&] {
      for (const ProcessExit& exit : spawner_->Reap()) exits_[exit.pid] = exit;
      return exits_.count(pid) > 0;
    });
    EXPECT_TRUE(reported) << "pid " << pid << " not reported by Reap within " << kPatience;
    return reported ? exits_[pid] : ProcessExit{};
  }

  // Waits for the child to end and for its output to be forwarded; returns its log.
  std::string LogAfterExit(int pid, const ProcessSpec& spec) {
    WaitForExit(pid);
    spawner_->DrainOutput(pid, kPatience);
    return ReadFile(spec.log_path);
  }

  // The pid of a grandchild the shell printed with `echo $!` as the first line of its log.
  int GrandchildPid(const ProcessSpec& spec) {
    int grandchild = -1;
    EXPECT_TRUE(WaitFor([&] {
      const std::string log = ReadFile(spec.log_path);
      return log.find('\n') != std::string::npos && absl::SimpleAtoi(log.substr(0, log.find('\n')), &grandchild);
    }));
    return grandchild;
  }

  std::string dir_;
  std::unique_ptr<ProcessSpawner> spawner_;
  std::vector<int> spawned_;
  std::map<int, ProcessExit> exits_;
};

TEST_F(ProcessTest, Spawn_ChildExitsWithCode_ReapReportsIt) {
  const int pid = Spawn(ShellSpec("exit 7"));
  const ProcessExit exit = WaitForExit(pid);
  EXPECT_EQ(exit.pid, pid);
  EXPECT_EQ(exit.exit_code, 7);
  EXPECT_EQ(exit.signal, 0);
  EXPECT_THAT(spawner_->Reap(), IsEmpty());  // reported once
}

TEST_F(ProcessTest, Spawn_ChildKilledBySignal_ReapReportsSignal) {
  const int pid = Spawn(ShellSpec("kill -TERM $$; exit 3"));
  const ProcessExit exit = WaitForExit(pid);
  EXPECT_EQ(exit.exit_code, -1);
  EXPECT_EQ(exit.signal, SIGTERM);
}

TEST_F(ProcessTest, Spawn_ChildLeadsItsOwnProcessGroup) {
  const ProcessSpec spec = ShellSpec("cut -d' ' -f5 /proc/$$/stat");
  const int pid = Spawn(spec);
  const std::string log = LogAfterExit(pid, spec);
  EXPECT_EQ(absl::StripAsciiWhitespace(log), absl::StrCat(pid));
}

TEST_F(ProcessTest, Spawn_ParentIgnoresAndBlocksSignals_ChildGetsDefaults) {
  struct sigaction ignore = {}, old_action = {};
  ignore.sa_handler = SIG_IGN;
  ASSERT_EQ(sigaction(SIGINT, &ignore, &old_action), 0);
  sigset_t term, old_mask;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &term, &old_mask), 0);
  // A shell keeps an inherited SIG_IGN, so without the reset these would exit with 3.
  const int interrupted = Spawn(ShellSpec("kill -INT $$; exit 3"));
  const int terminated = Spawn(ShellSpec("kill -TERM $$; exit 3"));
  sigaction(SIGINT, &old_action, nullptr);
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  EXPECT_EQ(WaitForExit(interrupted).signal, SIGINT);
  EXPECT_EQ(WaitForExit(terminated).signal, SIGTERM);
}

TEST_F(ProcessTest, Spawn_ChildWritesLines_LogHasThemWithoutPrefix) {
  const ProcessSpec spec = ShellSpec("printf 'one\\ntwo\\n\\nlast without newline'");
  const int pid = Spawn(spec);
  EXPECT_EQ(LogAfterExit(pid, spec), "one\ntwo\n\nlast without newline\n");
}

TEST_F(ProcessTest, Spawn_StdoutAndStderr_BothForwarded) {
  const ProcessSpec spec = ShellSpec("echo to stdout; echo to stderr >&2");
  const int pid = Spawn(spec);
  EXPECT_EQ(LogAfterExit(pid, spec), "to stdout\nto stderr\n");
}

TEST_F(ProcessTest, Spawn_ChildWritesNothing_LogFileCreatedEmpty) {
  const ProcessSpec spec = ShellSpec("exit 0");
  const int pid = Spawn(spec);
  EXPECT_TRUE(FileExists(spec.log_path));
  EXPECT_EQ(LogAfterExit(pid, spec), "");
}

TEST_F(ProcessTest, Spawn_StdinIsDevNull_ChildReadsEof) {
  const ProcessSpec spec = ShellSpec("cat; echo done");
  const int pid = Spawn(spec);
  EXPECT_EQ(LogAfterExit(pid, spec), "done\n");
}

TEST_F(ProcessTest, DrainOutput_ManyLines_AllLoggedWhenItReturns) {
  const ProcessSpec spec = ShellSpec("seq 1 5000");
  const int pid = Spawn(spec);
  WaitForExit(pid);
  spawner_->DrainOutput(pid, kPatience);
  const std::vector<std::string> lines = absl::StrSplit(ReadFile(spec.log_path), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 5000);
  EXPECT_EQ(lines.front(), "1");
  EXPECT_EQ(lines.back(), "5000");
}

TEST_F(ProcessTest, DrainOutput_GrandchildHoldsPipe_ReturnsAfterTimeout) {
  const int pid = Spawn(ShellSpec("sleep 100 & echo $!"));
  EXPECT_EQ(WaitForExit(pid).exit_code, 0);
  const absl::Time start = absl::Now();
  spawner_->DrainOutput(pid, absl::Milliseconds(200));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(190));
  EXPECT_LT(waited, absl::Seconds(3));
}  // TearDown kills the group, the grandchild included

TEST_F(ProcessTest, Spawn_Secret_ReadFromSecretFdNotFromEnvOrArgv) {
  const std::string secret = "s3cr3t-token";
  ProcessSpec spec = ShellSpec(
      "cat <&\"$STAGEHAND_SECRET_FD\" > \"$1\"; tr '\\0' '\\n' < /proc/$$/environ > \"$2\"; tr '\\0' ' ' < "
      "/proc/$$/cmdline > \"$3\"; "
      "echo \"fd=$STAGEHAND_SECRET_FD\"");
  spec.argv.insert(spec.argv.end(), {"sh", Path("secret"), Path("env"), Path("cmdline")});
  spec.env.push_back("STAGEHAND_SECRET_FD=9");  // a stale value must not win
  spec.secret = secret;
  const int pid = Spawn(spec);
  EXPECT_EQ(LogAfterExit(pid, spec), "fd=3\n");
  EXPECT_EQ(ReadFile(Path("secret")), secret);
  EXPECT_EQ(ReadFile(Path("env")), "PATH=/usr/bin:/bin\nSTAGEHAND_SECRET_FD=3\n");
  EXPECT_THAT(ReadFile(Path("cmdline")), HasSubstr("/bin/sh -c"));
  EXPECT_THAT(ReadFile(Path("cmdline")), Not(HasSubstr(secret)));
}

TEST_F(ProcessTest, Spawn_SecretTooLarge_IsInvalidArgument) {
  ProcessSpec spec = ShellSpec("exit 0");
  spec.secret = std::string(1 << 20, 'x');
  EXPECT_EQ(spawner_->Spawn(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ProcessTest, Spawn_ParentHasInheritableFdAndOtherChildren_ChildSeesOnlyFds0To3) {
  // Not CLOEXEC (as a library's socket may be): only the close in the child keeps it out.
  const int leaked = dup2(STDIN_FILENO, 100);
  ASSERT_EQ(leaked, 100);
  const int other = Spawn(ShellSpec("sleep 100"));  // its pipes are open in this process
  const ProcessSpec spec = ShellSpec("ls /proc/$$/fd");
  const int pid = Spawn(spec);
  EXPECT_EQ(LogAfterExit(pid, spec), "0\n1\n2\n3\n");
  close(leaked);
  spawner_->SignalGroup(other, SIGKILL);
}

TEST_F(ProcessTest, SignalGroup_ShellWithBackgroundSleep_KillsGrandchildToo) {
  const ProcessSpec spec = ShellSpec("sleep 100 & echo $!; wait");
  const int pid = Spawn(spec);
  const int grandchild = GrandchildPid(spec);
  ASSERT_GT(grandchild, 0);
  ASSERT_FALSE(ProcessEnded(grandchild));
  spawner_->SignalGroup(pid, SIGKILL);
  EXPECT_EQ(WaitForExit(pid).signal, SIGKILL);
  EXPECT_TRUE(WaitFor([&] { return ProcessEnded(grandchild); }));
}

TEST_F(ProcessTest, SignalGroup_ChildAlreadyReaped_IsHarmless) {
  const int pid = Spawn(ShellSpec("exit 0"));
  WaitForExit(pid);
  spawner_->SignalGroup(pid, SIGTERM);  // ESRCH, ignored
}

TEST_F(ProcessTest, Spawn_MissingExecutable_IsNotFoundNamingThePath) {
  ProcessSpec spec = ShellSpec("");
  spec.argv = {"/nonexistent/stagehand-worker"};
  const absl::StatusOr<int> pid = spawner_->Spawn(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pid.status().message(),
              HasSubstr("cannot execute /nonexistent/stagehand-worker: No such file or directory"));
}

TEST_F(ProcessTest, Spawn_FileWithoutExecuteBit_IsPermissionDenied) {
  ProcessSpec spec = ShellSpec("");
  spec.argv = {Path("not-executable")};
  std::ofstream(spec.argv[0]) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(chmod(spec.argv[0].c_str(), 0644), 0);
  const absl::StatusOr<int> pid = spawner_->Spawn(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr(spec.argv[0]));
}

// access(X_OK) passes, execve fails: the error comes back from the child through the status pipe.
TEST_F(ProcessTest, Spawn_ExecveFailsInChild_ReturnsErrorAndReapReportsNothing) {
  ProcessSpec spec = ShellSpec("");
  spec.argv = {Path("garbage")};
  std::ofstream(spec.argv[0]) << "not a program\n";
  ASSERT_EQ(chmod(spec.argv[0].c_str(), 0755), 0);
  const absl::StatusOr<int> pid = spawner_->Spawn(spec);
  ASSERT_FALSE(pid.ok());
  EXPECT_THAT(pid.status().message(), HasSubstr(absl::StrCat("cannot execute ", spec.argv[0], ": Exec format error")));
  EXPECT_THAT(spawner_->Reap(), IsEmpty());
}

TEST_F(ProcessTest, Spawn_EmptyArgv_IsInvalidArgument) {
  EXPECT_EQ(spawner_->Spawn(ProcessSpec{}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ProcessTest, Reap_ChildOfSomeoneElse_ReapedButNotReported) {
  const pid_t foreign = fork();
  ASSERT_GE(foreign, 0);
  if (foreign == 0) _exit(5);
  ASSERT_TRUE(WaitFor([&] { return ProcessEnded(foreign); }));  // a zombie now, waiting to be reaped
  const int pid = Spawn(ShellSpec("exit 3"));
  EXPECT_EQ(WaitForExit(pid).exit_code, 3);
  EXPECT_EQ(exits_.count(foreign), 0);
  EXPECT_EQ(waitpid(foreign, nullptr, WNOHANG), -1);  // Reap took it
}

TEST_F(ProcessTest, BecomeSubreaper_ShellLeavesOrphan_ItIsReparentedToUsAndReaped) {
  ASSERT_TRUE(BecomeSubreaper().ok());
  absl::Cleanup not_subreaper = [] { prctl(PR_SET_CHILD_SUBREAPER, 0); };
  int is_subreaper = 0;
  ASSERT_EQ(prctl(PR_GET_CHILD_SUBREAPER, &is_subreaper), 0);
  EXPECT_EQ(is_subreaper, 1);
  const ProcessSpec spec = ShellSpec("sleep 100 & echo $!");
  const int pid = Spawn(spec);
  const int orphan = GrandchildPid(spec);
  ASSERT_GT(orphan, 0);
  WaitForExit(pid);
  EXPECT_EQ(ParentOf(orphan), getpid());
  kill(orphan, SIGKILL);
  // Reap reaps the orphan (or it would stay a zombie of ours) but does not report it.
  EXPECT_TRUE(WaitFor([&] {
    for (const ProcessExit& exit : spawner_->Reap()) exits_[exit.pid] = exit;
    return kill(orphan, 0) != 0 && errno == ESRCH;
  }));
  EXPECT_EQ(exits_.count(orphan), 0);
}

// The launcher dies by SIGKILL (no cleanup runs): its children must die with it.
TEST_F(ProcessTest, Spawn_ParentKilled_ChildDiesByPdeathsig) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {  // the stand-in launcher: spawn a sleep, say its pid, wait to be killed
    std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner();
    ProcessSpec spec;
    spec.argv = {"/bin/sleep", "100"};
    const absl::StatusOr<int> pid = spawner->Spawn(spec);
    const int reply = pid.ok() ? *pid : -1;
    if (write(pipe_fds[1], &reply, sizeof reply) != sizeof reply) _exit(1);
    sleep(30);
    _exit(0);
  }
  close(pipe_fds[1]);
  int sleeper = -1;
  ASSERT_EQ(read(pipe_fds[0], &sleeper, sizeof sleeper), sizeof sleeper);
  close(pipe_fds[0]);
  ASSERT_GT(sleeper, 0);
  EXPECT_FALSE(ProcessEnded(sleeper));
  kill(launcher, SIGKILL);
  ASSERT_EQ(waitpid(launcher, nullptr, 0), launcher);
  const bool ended = WaitFor([&] { return ProcessEnded(sleeper); });
  EXPECT_TRUE(ended) << "the child outlived its killed parent";
  if (!ended) kill(sleeper, SIGKILL);
}

TEST(PosixProcessSpawnerTest, Destructor_ChildStillRunning_ReturnsWithoutKillingIt) {
  auto spawner = NewPosixProcessSpawner();
  ProcessSpec spec;
  spec.argv = {"/bin/sleep", "100"};
  const absl::StatusOr<int> pid = spawner->Spawn(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const absl::Time start = absl::Now();
  spawner.reset();  // the sleep holds its output pipe open: the destructor must not wait for EOF
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_EQ(waitpid(*pid, nullptr, WNOHANG), 0) << "the destructor ended the child";
  kill(-*pid, SIGKILL);
  EXPECT_EQ(waitpid(*pid, nullptr, 0), *pid);
}

// ---- The terminal writer. ----

// Room for `lines` queued lines of `text` (each charged its bytes, a newline and the overhead).
TerminalOptions RoomFor(int lines, absl::string_view text) {
  TerminalOptions options;
  options.max_bytes = lines * (text.size() + 1 + TerminalWriter::kEntryOverhead);
  return options;
}

TEST(TerminalWriterTest, Submit_TerminalStalled_DropsBeyondTheBoundAndSaysHowManyOnceItMoves) {
  auto sink = std::make_unique<FakeTerminalSink>();
  FakeTerminalSink* terminal = sink.get();
  terminal->Stall();
  TerminalWriter writer(std::move(sink), RoomFor(3, "line 0"));
  writer.Submit("line 0", "/run/rank0.log");
  ASSERT_TRUE(terminal->AwaitBlocked(kPatience));  // its thread holds line 0, in a write that waits
  for (int i = 1; i <= 10; ++i) writer.Submit(absl::StrCat("line ", i), "/run/rank0.log");  // never waits
  writer.Submit("a launcher line");
  EXPECT_EQ(writer.dropped(), 8);  // lines 1-3 queued, 4-10 and the launcher's line dropped
  terminal->Resume();
  ASSERT_TRUE(writer.Flush(kPatience));
  writer.Submit("line 11", "/run/rank0.log");
  ASSERT_TRUE(writer.Flush(kPatience));
  EXPECT_EQ(terminal->text(),
            "line 0\nline 1\nline 2\nline 3\n"
            "[stagehand] 1 lines of the launcher's output not shown (the terminal was not reading)\n"
            "[stagehand] 7 lines of worker output not shown (the terminal was not reading); see /run/rank0.log\n"
            "line 11\n");
}

TEST(TerminalWriterTest, Submit_LineLongerThanTheBound_TakenWhenTheQueueIsEmpty) {
  auto sink = std::make_unique<FakeTerminalSink>();
  FakeTerminalSink* terminal = sink.get();
  TerminalWriter writer(std::move(sink), RoomFor(1, "x"));
  const std::string long_line(10000, 'x');
  writer.Submit(long_line);
  ASSERT_TRUE(writer.Flush(kPatience));
  EXPECT_EQ(terminal->text(), long_line + "\n");
  EXPECT_EQ(writer.dropped(), 0);
}

TEST(TerminalWriterTest, Flush_TerminalNeverReads_GivesUpAfterPatience) {
  auto sink = std::make_unique<FakeTerminalSink>();
  sink->Stall();
  TerminalWriter writer(std::move(sink));
  writer.Submit("stuck");
  const absl::Time start = absl::Now();
  EXPECT_FALSE(writer.Flush(absl::Milliseconds(100)));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(90));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}  // and the destructor returns although the thread waits in Write

TEST(TerminalWriterTest, Flush_TerminalStalledLongBeforeTheCall_GivesUpAtOnce) {
  auto sink = std::make_unique<FakeTerminalSink>();
  FakeTerminalSink* terminal = sink.get();
  terminal->Stall();
  TerminalWriter writer(std::move(sink));
  writer.Submit("stuck");
  ASSERT_TRUE(terminal->AwaitBlocked(kPatience));
  EXPECT_FALSE(writer.Flush(absl::Milliseconds(200)));  // stalled for 200 ms now
  const absl::Time start = absl::Now();
  EXPECT_FALSE(writer.Flush(absl::Milliseconds(200)));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(100));
}

TEST(TerminalWriterTest, Submit_TerminalGone_LinesDiscardedWithoutCount) {
  auto sink = std::make_unique<FakeTerminalSink>();
  FakeTerminalSink* terminal = sink.get();
  terminal->Close();
  TerminalWriter writer(std::move(sink));
  for (int i = 0; i < 100; ++i) writer.Submit("into the void");
  EXPECT_TRUE(writer.Flush(kPatience));
  EXPECT_EQ(terminal->text(), "");
}

// A real pipe, full, that nobody reads: the writer's thread waits in poll, Submit does not, and the
// destructor ends the wait.
TEST(TerminalWriterTest, FdSink_FullPipeNobodyReads_SubmitReturnsAndDestructorEndsTheWait) {
  int fds[2];
  ASSERT_EQ(pipe2(fds, O_CLOEXEC), 0);
  absl::Cleanup close_pipe = [&] {
    close(fds[0]);
    close(fds[1]);
  };
  const int capacity = fcntl(fds[1], F_SETPIPE_SZ, 4096);
  ASSERT_GT(capacity, 0);
  const std::string fill(capacity, 'f');
  ASSERT_EQ(write(fds[1], fill.data(), fill.size()), capacity);  // exactly full: did not block
  auto writer = std::make_unique<TerminalWriter>(NewFdTerminalSink(fds[1]), RoomFor(10, "line"));
  const absl::Time start = absl::Now();
  for (int i = 0; i < 1000; ++i) writer->Submit("line", "rank0.log");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_GE(writer->dropped(), 1000 - 11);
  int queued = 0;
  ASSERT_EQ(ioctl(fds[0], FIONREAD, &queued), 0);
  EXPECT_EQ(queued, capacity);
  writer.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

// The forwarders' side: with the terminal stalled, the log still gets every line of a chatty child,
// and the terminal gets some lines and a count of the rest.
TEST(TerminalWriterTest, Spawn_TerminalStalled_LogCompleteTerminalGetsTheRestCounted) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string log = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/chatty.", getpid(), ".log");
  auto sink = std::make_unique<FakeTerminalSink>();
  FakeTerminalSink* terminal = sink.get();
  terminal->Stall();
  TerminalWriter writer(std::move(sink), RoomFor(100, "[rank 0] 12345"));
  std::unique_ptr<ProcessSpawner> spawner = NewPosixProcessSpawner(&writer);  // ends before writer
  ProcessSpec spec;
  spec.argv = {"/usr/bin/seq", "1", "20000"};
  spec.output_prefix = "[rank 0] ";
  spec.log_path = log;
  absl::StatusOr<int> pid = spawner->Spawn(spec);
  ASSERT_TRUE(pid.ok()) << pid.status();
  bool reaped = WaitFor([&] {
    for (const ProcessExit& e : spawner->Reap()) {
      if (e.pid == *pid) return true;
    }
    return false;
  });
  ASSERT_TRUE(reaped);
  spawner->DrainOutput(*pid, kPatience);  // the child was never held up by the stalled terminal
  const std::vector<std::string> logged = absl::StrSplit(ReadFile(log), '\n', absl::SkipEmpty());
  ASSERT_EQ(logged.size(), 20000u);
  EXPECT_EQ(logged.front(), "1");
  EXPECT_EQ(logged.back(), "20000");
  const int64_t dropped = writer.dropped();
  EXPECT_GT(dropped, 0);
  terminal->Resume();
  ASSERT_TRUE(writer.Flush(kPatience));
  const std::vector<std::string> shown = absl::StrSplit(terminal->text(), '\n', absl::SkipEmpty());
  ASSERT_EQ(shown.size(), 20000 - dropped + 1);
  EXPECT_EQ(shown.front(), "[rank 0] 1");
  EXPECT_EQ(shown.back(), absl::StrCat("[stagehand] ", dropped,
                                       " lines of worker output not shown (the terminal "
                                       "was not reading); see ",
                                       log));
  for (size_t i = 0; i + 1 < shown.size(); ++i) {
    ASSERT_EQ(shown[i], absl::StrCat("[rank 0] ", i + 1)) << "the lines shown are the first, in order";
  }
  spawner.reset();
}

TEST(FakeProcessSpawnerTest, SpawnSignalExit_RecordedAndReported) {
  FakeProcessSpawner fake;
  ProcessSpec spec;
  spec.argv = {"/bin/worker"};
  EXPECT_EQ(*fake.Spawn(spec), 1000);
  EXPECT_EQ(*fake.Spawn(spec), 1001);
  fake.FailNextSpawn(absl::UnavailableError("no"));
  EXPECT_EQ(fake.Spawn(spec).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(*fake.Spawn(spec), 1002);
  EXPECT_EQ(fake.specs().size(), 3);
  fake.SignalGroup(1000, SIGTERM);
  EXPECT_THAT(fake.signals(), ElementsAre(FakeProcessSpawner::SentSignal{1000, SIGTERM}));
  EXPECT_THAT(fake.Reap(), IsEmpty());
  fake.Exit(1000, 2);
  fake.Kill(1001, SIGKILL);
  const std::vector<ProcessExit> exits = fake.Reap();
  ASSERT_EQ(exits.size(), 2);
  EXPECT_EQ(exits[0].pid, 1000);
  EXPECT_EQ(exits[0].exit_code, 2);
  EXPECT_EQ(exits[1].signal, SIGKILL);
  EXPECT_EQ(exits[1].exit_code, -1);
  EXPECT_THAT(fake.running(), ElementsAre(1002));
  EXPECT_THAT(fake.Reap(), IsEmpty());
}

TEST(FakeProcessSpawnerTest, SetExitOnSignal_SignalEndsRunningPidOnce) {
  FakeProcessSpawner fake;
  fake.SetExitOnSignal(true);
  const int pid = *fake.Spawn(ProcessSpec{});
  fake.SignalGroup(pid, SIGTERM);
  fake.SignalGroup(pid, SIGKILL);
  const std::vector<ProcessExit> exits = fake.Reap();
  ASSERT_EQ(exits.size(), 1);
  EXPECT_EQ(exits[0].signal, SIGTERM);
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

// Two jobs of one server have a spawner each; waitpid(-1) in one must not take the other's exits.
TEST_F(ProcessTest, Reap_TwoSpawners_EachReportsOnlyItsOwnChildren) {
  std::unique_ptr<ProcessSpawner> other = NewPosixProcessSpawner();
  absl::StatusOr<int> theirs = other->Spawn(ShellSpec("exit 7"));
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  const int ours = Spawn(ShellSpec("exit 3"));
  EXPECT_EQ(WaitForExit(ours).exit_code, 3);
  std::map<int, ProcessExit> their_exits;
  ASSERT_TRUE(WaitFor([&] {
    for (const ProcessExit& e : other->Reap()) their_exits[e.pid] = e;
    return their_exits.count(*theirs) > 0;
  }));
  EXPECT_EQ(their_exits[*theirs].exit_code, 7);
  EXPECT_EQ(their_exits.size(), 1u);
  EXPECT_EQ(exits_.count(*theirs), 0u) << "our Reap reported the other spawner's child";
}

}  // namespace
}  // namespace stagehand
