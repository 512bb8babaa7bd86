// Checkpoints, --resume and --max_restarts through the real launcher on CPU workers (fp32): a worker
// killed with SIGKILL mid-run is restarted from the newest checkpoint and the run's losses equal an
// uninterrupted run's; a 2-stage run's checkpoint resumed with 3 stages gives the 2-stage run's
// losses; a checkpoint cut short (no manifest) is never loaded; a corrupt shard is refused, naming it.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::Exists;
using ::stagehand::testing::LauncherCommand;
using ::stagehand::testing::ReadFile;
using ::stagehand::testing::RunResult;

std::string TmpPath(const std::string& name) { return ::stagehand::testing::TmpPath("ckpt_" + name); }

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
          "--seed=7"};
}

RunResult Launch(const std::vector<std::string>& flags, const std::string& name) {
  return ::stagehand::testing::Launch(flags, "ckpt_" + name);
}

// step -> loss from steps.csv; a step a restarted incarnation ran again keeps its last row.
std::map<int, double> Losses(const std::string& run_dir) {
  std::map<int, double> out;
  std::vector<std::string> lines = absl::StrSplit(ReadFile(run_dir + "/steps.csv"), '\n', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    double loss;
    int step;
    if (f.size() > 2 && !f[2].empty() && absl::SimpleAtoi(f[0], &step) && absl::SimpleAtod(f[2], &loss))
      out[step] = loss;
  }
  return out;
}

void ExpectSameLosses(const std::map<int, double>& want, const std::map<int, double>& got, double rel) {
  for (const auto& [step, loss] : got) {
    ASSERT_TRUE(want.count(step)) << "step " << step;
    EXPECT_NEAR(loss, want.at(step), rel * std::abs(want.at(step))) << "step " << step;
  }
}

const RunResult& Uninterrupted() {
  static const RunResult* r = new RunResult(Launch(Job(2), "reference"));
  return *r;
}

TEST(Restart, WorkerKilledAfterStep6_RestartsFromCheckpointAndLossesEqualUninterrupted) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Uninterrupted();
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::string dir = TmpPath("killed");
  std::vector<std::string> flags = Job(2);
  flags.push_back("--checkpoint_every=4");
  flags.push_back("--max_restarts=1");
  const pid_t launcher = fork();
  ASSERT_GE(launcher, 0);
  if (launcher == 0) {
    execl("/bin/sh", "sh", "-c", LauncherCommand(flags, dir).c_str(), nullptr);
    _exit(127);
  }
  std::string out;  // "step 7/12": seven steps (0 to 6) done
  for (int i = 0; i < 1200 && out.find("step 7/12") == std::string::npos; ++i) {
    usleep(5 * 1000);
    out = ReadFile(dir + ".out");
  }
  ASSERT_NE(out.find("step 7/12"), std::string::npos) << out;
  const std::string job = out.substr(out.find("job ") + 4, 8);
  ASSERT_EQ(std::system(absl::StrCat("pkill -9 -f -- '[-]-job_id=", job, " --worker_index=1 '").c_str()), 0);
  int status = 0;
  ASSERT_EQ(waitpid(launcher, &status, 0), launcher);
  out = ReadFile(dir + ".out");
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("restart 1 of 1: rank 1 "), std::string::npos) << out;
  EXPECT_NE(out.find("signal 9"), std::string::npos) << out;
  const std::map<int, double> want = Losses(reference.run_dir), got = Losses(dir);
  ASSERT_EQ(got.size(), 12u) << ReadFile(dir + "/steps.csv");
  ExpectSameLosses(want, got, 1e-6);
  // The steps from the restart's checkpoint (a multiple of 4, or the end; which one depends on how
  // far the run got before the kill landed) to the kill were run twice: by both ranks in the second
  // incarnation, and in the first by both ranks, except that the step the kill interrupted (the last
  // the first incarnation reported) may have been reported by one rank alone: the other was killed
  // between its last exchange and its report. Two to four rows each, the first of them a checkpoint's
  // step. Every other step has two.
  // --max_restarts adds the incarnation column: a repeated step's rows say which incarnation ran them.
  const std::string csv = ReadFile(dir + "/steps.csv");
  ASSERT_EQ(csv.substr(0, csv.find('\n')), "step,rank,loss,seconds,tokens,peak_memory_bytes,incarnation") << csv;
  std::map<int, int> rows;
  std::map<std::pair<int, int>, int> by_incarnation;  // (step, incarnation) -> rows
  for (absl::string_view line : absl::StrSplit(csv, '\n')) {
    int step = 0, incarnation = 0;
    if (!absl::SimpleAtoi(line.substr(0, line.find(',')), &step)) continue;
    ++rows[step];
    ASSERT_TRUE(absl::SimpleAtoi(line.substr(line.rfind(',') + 1), &incarnation)) << line;
    ++by_incarnation[{step, incarnation}];
  }
  int first_repeated = -1;
  int half_done = -1, last_first = -1;  // the step the first incarnation reported on one rank only; its last
  for (const auto& [step, n] : rows) {
    EXPECT_TRUE(n >= 2 && n <= 4) << "step " << step << ": " << n << " rows\n" << csv;
    const int first = by_incarnation[std::make_pair(step, 1)], second = by_incarnation[std::make_pair(step, 2)];
    EXPECT_TRUE(second == 0 || second == 2) << "step " << step << "\n" << csv;
    EXPECT_TRUE(first == 0 || first == 2 || (first == 1 && second == 2)) << "step " << step << "\n" << csv;
    if (first == 1) {
      EXPECT_LT(half_done, 0) << "a second step reported by one rank alone: " << step << "\n" << csv;
      half_done = step;
    }
    if (first > 0) last_first = std::max(last_first, step);
    if (first > 0 && second > 0 && first_repeated < 0) first_repeated = step;
  }
  if (half_done >= 0) EXPECT_EQ(half_done, last_first) << "only the interrupted step may lack a row\n" << csv;
  // None repeated: the kill landed after the last step, and the restart resumed the final checkpoint.
  if (first_repeated >= 0) EXPECT_EQ(first_repeated % 4, 0) << csv;
}

TEST(Resume, TwoStageCheckpointWithThreeStages_GivesTheTwoStageLosses) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Uninterrupted();
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  std::vector<std::string> flags = Job(2, 6);
  flags.push_back("--checkpoint_every=3");
  RunResult first = Launch(flags, "first");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(Exists(first.run_dir + "/checkpoints/step_00000006/MANIFEST")) << first.output;
  std::vector<std::string> three = Job(3);
  three.push_back("--resume=" + first.run_dir);
  RunResult r = Launch(three, "resumed");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from step 6 of "), std::string::npos) << r.output;
  const std::map<int, double> got = Losses(r.run_dir);
  ASSERT_EQ(got.size(), 6u) << ReadFile(r.run_dir + "/steps.csv");
  EXPECT_EQ(got.begin()->first, 6);
  ExpectSameLosses(Losses(reference.run_dir), got, 1e-5);
}

// The command a stopped run prints, --resume=RUN_DIR with nothing of the job typed again, continues
// that job (its model, fp32, learning rate, batch, seed and steps come from the run), and gives the
// uninterrupted run's losses. The layout (workers, micro-batches, partition) is this run's to choose.
TEST(Resume, ResumeAlone_ContinuesTheJobWithItsSettings) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Uninterrupted();
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  std::vector<std::string> flags = Job(2);
  flags.push_back("--checkpoint_every=6");
  RunResult first = Launch(flags, "alone_first");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // As if stopped after step 6: the final checkpoint is not there.
  ASSERT_EQ(std::system(absl::StrCat("rm -r '", first.run_dir, "/checkpoints/step_00000012'").c_str()), 0);
  RunResult r =
      Launch({"--device=cpu", "--workers=2", "--micro_batches=4", "--partition=uniform", "--resume=" + first.run_dir},
             "alone");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("resuming from step 6 of "), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("no --model given"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("trajectory"), std::string::npos) << r.output;
  const std::map<int, double> got = Losses(r.run_dir);
  ASSERT_EQ(got.size(), 6u) << ReadFile(r.run_dir + "/steps.csv");
  EXPECT_EQ(got.begin()->first, 6);
  ExpectSameLosses(Losses(reference.run_dir), got, 1e-5);
  // A typed learning rate wins, and is said.
  RunResult faster = Launch({"--device=cpu", "--workers=2", "--micro_batches=4", "--partition=uniform", "--lr=0.01",
                             "--steps=7", "--resume=" + first.run_dir},
                            "alone_lr");
  ASSERT_EQ(faster.exit_code, 0) << faster.output;
  EXPECT_NE(faster.output.find("--lr=0.01 (was 0.003)"), std::string::npos) << faster.output;
}

TEST(Resume, CheckpointCutShort_TakesTheOneBefore) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Uninterrupted();
  std::vector<std::string> flags = Job(2, 8);
  flags.push_back("--checkpoint_every=4");
  RunResult first = Launch(flags, "cut");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // As if killed after the shards and before the manifest.
  ASSERT_EQ(unlink((first.run_dir + "/checkpoints/step_00000008/MANIFEST").c_str()), 0);
  std::vector<std::string> again = Job(2);
  again.push_back("--resume=" + first.run_dir);
  RunResult r = Launch(again, "after_cut");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step_00000008: it has no manifest"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resuming from step 4 of "), std::string::npos) << r.output;
  const std::map<int, double> got = Losses(r.run_dir);
  ASSERT_EQ(got.size(), 8u);
  ExpectSameLosses(Losses(reference.run_dir), got, 1e-6);
}

TEST(Resume, CorruptShard_RefusedNamingItBeforeAnythingStarts) {
  std::vector<std::string> flags = Job(2, 4);
  flags.push_back("--checkpoint_every=4");
  RunResult first = Launch(flags, "corrupt");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::string shard = first.run_dir + "/checkpoints/step_00000004/rank1.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-7, std::ios::end);
    f.put('\x7f');
  }
  std::vector<std::string> again = Job(2);
  again.push_back("--resume=" + first.run_dir);
  RunResult r = Launch(again, "refused");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find(shard), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("SHA-256"), std::string::npos) << r.output;
  EXPECT_FALSE(Exists(r.run_dir)) << "a refused job created its run directory";
}

TEST(Resume, ImpossibleResumes_RefusedBeforeAnythingStarts) {
  std::vector<std::string> flags = Job(2, 4);
  flags.push_back("--checkpoint_every=2");
  RunResult first = Launch(flags, "base");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--steps=4"}, "has done 4 steps but --steps=4"},
      {{"--layers=2"}, "pass --layers=4"},
      {{"--model=llama-tiny"}, "pass --model=tiny"},
  };
  for (const auto& [extra, message] : cases) {
    std::vector<std::string> f = Job(2);
    f.insert(f.end(), extra.begin(), extra.end());
    f.push_back("--resume=" + first.run_dir);
    RunResult r = Launch(f, "impossible");
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(message), std::string::npos) << r.output;
  }
  RunResult none = Launch({"--device=cpu", "--model=tiny", "--resume=" + TmpPath("nothing")}, "none");
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_NE(none.output.find("no complete checkpoint"), std::string::npos) << none.output;
  RunResult bad = Launch({"--device=cpu", "--model=tiny", "--checkpoint_every=0"}, "zero");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--checkpoint_every=0: out of range"), std::string::npos) << bad.output;
}

}  // namespace
