// The validation split and the SIGTERM checkpoint through the real launcher on CPU workers (fp32): a
// 2-stage run's validation loss equals one process's and falls as the model learns a learnable token
// file; SIGTERM mid-run writes a checkpoint at one step on every rank and exits 75, and --resume from
// it gives the uninterrupted run's 12 losses; bad evaluation flags are refused before anything starts.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::Exists;
using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

std::string TmpPath(const std::string& name) { return ::stagehand::testing::TmpPath("eval_" + name); }

// A token file the tiny GPT can learn: each token follows from the previous one by a fixed rule 9
// times in 10 (else a random token), so the loss on held-out text falls well below ln 256.
const std::string& LearnableFile() {
  static const std::string* path = [] {
    auto* p = new std::string(TmpPath("tokens") + ".bin");
    std::vector<uint16_t> tokens(64 * 1024);
    uint64_t x = 12345;
    auto next = [&x] {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      return x;
    };
    uint16_t t = 1;
    for (uint16_t& v : tokens) {
      v = t;
      t = next() % 10 != 0 ? static_cast<uint16_t>((t * 37 + 11) % 256) : static_cast<uint16_t>(next() % 256);
    }
    std::ofstream out(*p, std::ios::binary);
    out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 2));
    return p;
  }();
  return *path;
}

std::vector<std::string> Job(int workers, int steps = 12) {
  return {"--device=cpu",
          absl::StrCat("--workers=", workers),
          "--model=tiny",
          "--fp32",
          "--micro_batches=4",
          "--global_batch=16",
          absl::StrCat("--steps=", steps),
          "--lr=0.003",
          "--partition=uniform",
          "--seed=7",
          "--data=" + LearnableFile()};
}

struct RunResult {
  int exit_code = -1;
  std::string output;
  std::string run_dir;
};

// Starts the launcher itself (not through a shell, so that a signal reaches it), output to
// <run_dir>.out.
pid_t Start(const std::vector<std::string>& flags, const std::string& run_dir) {
  const std::string binary = Runfile("launcher/launcher");
  std::vector<std::string> args = {binary};
  args.insert(args.end(), flags.begin(), flags.end());
  args.push_back("--run_dir=" + run_dir);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open((run_dir + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    // The launcher expects its signals blocked by main(); a test's mask is inherited as is.
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

int Wait(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

RunResult Launch(const std::vector<std::string>& flags, const std::string& name) {
  RunResult r;
  r.run_dir = TmpPath(name);
  r.exit_code = Wait(Start(flags, r.run_dir));
  r.output = ReadFile(r.run_dir + ".out");
  return r;
}

std::vector<std::string> Rows(const std::string& run_dir) {
  return absl::StrSplit(ReadFile(run_dir + "/steps.csv"), '\n', absl::SkipEmpty());
}

// step + 1 -> the value of column `name` (rows where it is set), from steps.csv.
std::map<int, double> Column(const std::string& run_dir, const std::string& name, bool steps_done = true) {
  const std::vector<std::string> lines = Rows(run_dir);
  std::map<int, double> out;
  if (lines.empty()) return out;
  const std::vector<std::string> header = absl::StrSplit(lines[0], ',');
  size_t col = header.size();
  for (size_t i = 0; i < header.size(); ++i) {
    if (header[i] == name) col = i;
  }
  if (col == header.size()) return out;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    int step;
    double v;
    if (f.size() > col && !f[col].empty() && absl::SimpleAtoi(f[0], &step) && absl::SimpleAtod(f[col], &v)) {
      out[steps_done ? step + 1 : step] = v;
    }
  }
  return out;
}

const RunResult& OneProcess() {
  static const RunResult* r = [] {
    std::vector<std::string> flags = Job(1);
    flags.push_back("--val_fraction=0.1");
    flags.push_back("--eval_every=4");
    return new RunResult(Launch(flags, "one"));
  }();
  return *r;
}

TEST(Eval, TwoStages_ValLossEqualsOneProcessAndFalls) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& one = OneProcess();
  ASSERT_EQ(one.exit_code, 0) << one.output;
  std::vector<std::string> flags = Job(2);
  flags.push_back("--val_fraction=0.1");
  flags.push_back("--eval_every=4");
  const RunResult two = Launch(flags, "two");
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(
      absl::StartsWith(Rows(two.run_dir)[0], "step,rank,loss,seconds,tokens,peak_memory_bytes,val_loss,val_ppl"))
      << Rows(two.run_dir)[0];
  const std::map<int, double> want = Column(one.run_dir, "val_loss"), got = Column(two.run_dir, "val_loss");
  ASSERT_EQ(want.size(), 3u) << ReadFile(one.run_dir + "/steps.csv");  // after steps 4, 8 and 12
  ASSERT_EQ(got.size(), 3u) << ReadFile(two.run_dir + "/steps.csv");
  for (const auto& [step, loss] : want) {
    ASSERT_TRUE(got.count(step)) << step;
    EXPECT_NEAR(got.at(step), loss, 1e-5 * loss) << "after step " << step;
  }
  EXPECT_LT(got.at(12), got.at(4) - 0.1) << "the validation loss did not fall";
  EXPECT_LT(got.at(4), std::log(256.0));
  // perplexity = exp(loss), in the file and the progress lines
  const std::map<int, double> ppl = Column(two.run_dir, "val_ppl");
  EXPECT_NEAR(ppl.at(12), std::exp(got.at(12)), 1e-6 * ppl.at(12));
  EXPECT_NE(two.output.find("val_loss "), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("  ppl "), std::string::npos) << two.output;
  EXPECT_NE(two.output.find("seen 6.1k tokens"), std::string::npos) << two.output;  // 12 x 16 x 32
  // The parameter count at the start: both ranks' together equal the one process's.
  const size_t at = one.output.find("stagehand: parameters: ");
  ASSERT_NE(at, std::string::npos) << one.output;
  const std::string total = one.output.substr(at, one.output.find(' ', at + 24) - at);
  EXPECT_NE(two.output.find(total + " ("), std::string::npos) << total << "\n" << two.output;
  const std::string report = ReadFile(two.run_dir + "/report.json");
  EXPECT_NE(report.find("\"has_val_loss\": true"), std::string::npos) << report;
  EXPECT_NE(report.find("\"val_perplexity\""), std::string::npos) << report;
  EXPECT_NE(report.find("\"tokens_seen\": \"6144\""), std::string::npos) << report;
  EXPECT_NE(report.find("\"parameters\""), std::string::npos) << report;
}

TEST(Eval, NoSplit_KeepsTheHeader) {
  const RunResult r = Launch(Job(1, 2), "plain");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Rows(r.run_dir)[0], "step,rank,loss,seconds,tokens,peak_memory_bytes");
  EXPECT_EQ(r.output.find("val_loss"), std::string::npos) << r.output;
}

// The training part of a split file is never drawn from: training on the file cut at the split
// gives the same losses.
TEST(Eval, Split_TrainsOnlyOnWhatComesBefore) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& one = OneProcess();
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // 65536 tokens; 10% = 6553, 198 whole sequences of 33 = 6534 tokens held out.
  const int64_t keep = 65536 - 198 * 33;
  const std::string cut = TmpPath("cut") + ".bin";
  {
    std::ifstream in(LearnableFile(), std::ios::binary);
    std::vector<char> bytes(keep * 2);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::vector<std::string> flags = Job(1);
  flags.back() = "--data=" + cut;
  const RunResult r = Launch(flags, "cut");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Windows are drawn at offsets below count - seq from the seed: the same count gives the same windows.
  const std::map<int, double> want = Column(one.run_dir, "loss"), got = Column(r.run_dir, "loss");
  ASSERT_EQ(got.size(), 12u);
  for (const auto& [step, loss] : want) EXPECT_NEAR(got.at(step), loss, 1e-6 * loss) << step;
}

TEST(Eval, BadFlags_RefusedWithOneLineBeforeAnythingStarts) {
  struct Case {
    std::vector<std::string> extra;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--val_fraction=1"}, "--val_fraction=1: out of range; pass --val_fraction=X with 0 <= X < 1"},
      {{"--val_fraction=-0.1"}, "0 <= X < 1"},
      {{"--eval_every=5"}, "--eval_every evaluates a validation split, and the job has none"},
      {{"--eval_batches=2"}, "--eval_batches evaluates a validation split"},
      {{"--val_fraction=0.001"}, "fewer than one evaluation batch (--global_batch=16); pass --val_fraction=0.009"},
      {{"--val_fraction=0.1", "--data=synthetic"}, "the synthetic corpus has none"},
      {{"--val_fraction=0.1", "--inference"}, "--val_fraction evaluates a model during training"},
      {{"--val_fraction=0.1", "--eval_every=0"}, "--eval_every=0: out of range"},
      {{"--term_checkpoint_timeout_ms=-5"}, "--term_checkpoint_timeout_ms=-5: out of range"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> flags = Job(2);
    flags.insert(flags.end(), c.extra.begin(), c.extra.end());
    const RunResult r = Launch(flags, "bad");
    EXPECT_EQ(r.exit_code, 2) << c.extra[0] << ": " << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.extra[0] << ": " << r.output;
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    EXPECT_FALSE(Exists(r.run_dir)) << "a refused job created its run directory";
  }
}

// step -> loss of the rows that carry one.
std::map<int, double> Losses(const std::string& run_dir) { return Column(run_dir, "loss", /*steps_done=*/false); }

// The SIGTERM tests' job: steps of 64 sequences (about 0.1 s on two CPU workers), so that the
// signal lands well before the last step.
std::vector<std::string> TermJob(int steps = 12) {
  std::vector<std::string> flags = Job(2, steps);
  flags.push_back("--global_batch=64");
  flags.push_back("--micro_batches=8");
  return flags;
}

const RunResult& Uninterrupted() {
  static const RunResult* r = new RunResult(Launch(TermJob(), "reference"));
  return *r;
}

// Waits (bounded) until the launcher's output shows `text`.
bool AwaitOutput(const std::string& run_dir, const std::string& text) {
  for (int i = 0; i < 3000; ++i) {  // 30 s
    if (ReadFile(run_dir + ".out").find(text) != std::string::npos) return true;
    usleep(10 * 1000);
  }
  return false;
}

bool NoWorkerLeft(const std::string& output) {
  const size_t at = output.find("job ");
  if (at == std::string::npos) return true;
  const std::string job = output.substr(at + 4, 8);
  return std::system(absl::StrCat("pgrep -f -- '[-]-job_id=", job, "' > /dev/null").c_str()) != 0;
}

TEST(TermCheckpoint, SigtermMidRun_CheckpointsExits75AndResumeGivesTheUninterruptedLosses) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Uninterrupted();
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::map<int, double> want = Losses(reference.run_dir);
  ASSERT_EQ(want.size(), 12u);
  std::vector<std::string> flags = TermJob();
  flags.push_back("--checkpoint_every=1000");  // otherwise only at the end
  const std::string dir = TmpPath("term");
  // The run stops early to be resumed: its weights are not final, so nothing is exported yet.
  const std::string export_dir = dir + ".export";
  flags.push_back("--export_dir=" + export_dir);
  const pid_t launcher = Start(flags, dir);
  ASSERT_TRUE(AwaitOutput(dir, "step 3/12")) << ReadFile(dir + ".out");
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  const int code = Wait(launcher);
  const std::string out = ReadFile(dir + ".out");
  ASSERT_EQ(code, 75) << out;
  EXPECT_NE(out.find("SIGTERM: every rank writes a checkpoint after step "), std::string::npos) << out;
  EXPECT_NE(out.find("stopped (exit 75): stopped by SIGTERM after a checkpoint at step "), std::string::npos) << out;
  EXPECT_TRUE(NoWorkerLeft(out)) << out;
  const std::map<int, double> first = Losses(dir);
  const int step = static_cast<int>(first.size());
  ASSERT_GE(step, 3);
  ASSERT_LT(step, 12) << "the run ended before the signal landed";
  char name[32];
  std::snprintf(name, sizeof(name), "step_%08d", step);
  EXPECT_TRUE(Exists(absl::StrCat(dir, "/checkpoints/", name, "/MANIFEST"))) << out;
  EXPECT_TRUE(Exists(absl::StrCat(dir, "/checkpoints/", name, "/rank0.safetensors")));
  EXPECT_TRUE(Exists(absl::StrCat(dir, "/checkpoints/", name, "/rank1.safetensors")));
  const std::string report = ReadFile(dir + "/report.json");
  EXPECT_NE(report.find("\"exit_code\": 75"), std::string::npos) << report;
  EXPECT_NE(report.find(absl::StrCat("\"term_checkpoint_step\": \"", step, "\"")), std::string::npos) << report;
  EXPECT_FALSE(Exists(export_dir)) << "a run stopped for a SIGTERM checkpoint exported its unfinished weights";
  EXPECT_NE(std::system(absl::StrCat("ls -d ", export_dir, ".partial-* >/dev/null 2>&1").c_str()), 0)
      << "a temporary export directory was left";

  std::vector<std::string> again = TermJob();
  again.push_back("--resume=" + dir);
  again.push_back("--export_dir=" + export_dir);  // the command the launcher's line suggests
  const RunResult resumed = Launch(again, "resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_TRUE(Exists(export_dir + "/config.json")) << resumed.output;
  std::map<int, double> got = first;
  for (const auto& [s, loss] : Losses(resumed.run_dir)) {
    EXPECT_GE(s, step);
    got[s] = loss;
  }
  ASSERT_EQ(got.size(), 12u);
  for (const auto& [s, loss] : want) EXPECT_NEAR(got.at(s), loss, 1e-6 * loss) << "step " << s;
}

TEST(TermCheckpoint, TimeoutZero_SigtermStopsAtOnceWith143) {
  std::vector<std::string> flags = TermJob(1000);
  flags.push_back("--checkpoint_every=1000");
  flags.push_back("--term_checkpoint_timeout_ms=0");
  const std::string dir = TmpPath("term0");
  const pid_t launcher = Start(flags, dir);
  ASSERT_TRUE(AwaitOutput(dir, "step 2/1000")) << ReadFile(dir + ".out");
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  const int code = Wait(launcher);
  const std::string out = ReadFile(dir + ".out");
  EXPECT_EQ(code, 143) << out;
  EXPECT_EQ(out.find("writes a checkpoint"), std::string::npos) << out;
  EXPECT_FALSE(Exists(dir + "/checkpoints/step_00001000"));
  EXPECT_TRUE(NoWorkerLeft(out)) << out;
}

TEST(TermCheckpoint, SecondSigterm_KillsAtOnce) {
  std::vector<std::string> flags = TermJob(1000);
  flags.push_back("--checkpoint_every=1000");
  const std::string dir = TmpPath("term2");
  const pid_t launcher = Start(flags, dir);
  ASSERT_TRUE(AwaitOutput(dir, "step 2/1000")) << ReadFile(dir + ".out");
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  ASSERT_TRUE(AwaitOutput(dir, "every rank writes a checkpoint")) << ReadFile(dir + ".out");
  ASSERT_EQ(kill(launcher, SIGTERM), 0);
  const int code = Wait(launcher);
  const std::string out = ReadFile(dir + ".out");
  // The checkpoint may have been written between the two signals (75); otherwise the kill (143).
  EXPECT_TRUE(code == 143 || code == 75) << code << "\n" << out;
  EXPECT_NE(out.find("killing the workers"), std::string::npos) << out;
  EXPECT_TRUE(NoWorkerLeft(out)) << out;
}

}  // namespace
