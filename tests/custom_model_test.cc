// A user's own model family in a worker binary of its own (examples/custom_model, "mlp-lm"), through
// the real launcher on CPU workers: it learns, a 2-stage run matches a 1-stage run step by step, and the
// launcher refuses the family's model without --worker_binary.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

using ::stagehand::testing::RunResult;

RunResult Launch(const std::vector<std::string>& flags) { return ::stagehand::testing::Launch(flags, "custom_model"); }

// The sizes are passed although they are the preset's: the launcher resolves only built-in families,
// so without them the workers see vocab, hidden and seq 0 (PresetOnly_TwoWorkers_Trains below).
const std::vector<std::string> kPresetSizes = {"--vocab=256", "--hidden=64", "--layers=4", "--seq=32"};

std::vector<std::string> MlpJob(int workers, const std::string& partition, int steps) {
  std::vector<std::string> job = {"--device=cpu",
                                  absl::StrCat("--workers=", workers),
                                  "--model=mlp-lm-tiny",
                                  "--worker_binary=" + Runfile("examples/custom_model/mlp_worker"),
                                  "--fp32",
                                  "--micro_batches=4",
                                  "--global_batch=16",
                                  absl::StrCat("--steps=", steps),
                                  "--lr=0.003",
                                  "--partition=" + partition,
                                  "--seed=7"};
  job.insert(job.end(), kPresetSizes.begin(), kPresetSizes.end());
  return job;
}

using ::stagehand::testing::Losses;

std::vector<torch::Tensor> Params(const std::string& run_dir, int ranks) {
  std::vector<torch::Tensor> all;
  for (int r = 0; r < ranks; ++r) {
    std::vector<torch::Tensor> part;
    torch::load(part, absl::StrCat(run_dir, "/params_rank", r, ".pt"));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

void ExpectLearns(const RunResult& run, int steps) {
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::map<int, double> losses = Losses(run.run_dir);
  ASSERT_EQ(losses.size(), static_cast<size_t>(steps)) << ReadFile(run.run_dir + "/steps.csv");
  const double uniform = std::log(256.0);
  EXPECT_NEAR(losses[0], uniform, 0.5);
  EXPECT_LT(losses[steps - 1], 0.6 * uniform) << run.output;
}

TEST(CustomModel, Launch_TwoWorkersAutoPartition_LossFallsWellBelowUniformGuessing) {
  RunResult run = Launch(MlpJob(2, "auto", 60));
  ExpectLearns(run, 60);
  EXPECT_NE(run.output.find("(profiled)"), std::string::npos) << "the workers should have profiled:\n" << run.output;
}

TEST(CustomModel, Launch_TwoStagesUniform_LossesAndParametersMatchOneStageWithin1e5) {
  // One thread per worker, so that every kernel reduces in the same order in every process.
  setenv("OMP_NUM_THREADS", "1", 1);
  std::vector<std::string> one = MlpJob(1, "uniform", 5), two = MlpJob(2, "uniform", 5);
  one.push_back("--save_params");
  two.push_back("--save_params");
  RunResult reference = Launch(one), run = Launch(two);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::map<int, double> want = Losses(reference.run_dir), got = Losses(run.run_dir);
  ASSERT_EQ(want.size(), 5u) << ReadFile(reference.run_dir + "/steps.csv");
  ASSERT_EQ(got.size(), want.size()) << ReadFile(run.run_dir + "/steps.csv");
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  std::vector<torch::Tensor> a = Params(reference.run_dir, 1), b = Params(run.run_dir, 2);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "parameter " << i;
    const double err = (a[i] - b[i]).abs().max().item<double>() / std::max(1e-12, a[i].abs().max().item<double>());
    EXPECT_LT(err, 1e-5) << "parameter " << i;
  }
}

TEST(CustomModel, Launch_WithoutWorkerBinary_IsRefusedNamingTheFlag) {
  RunResult run = Launch({"--device=cpu", "--workers=2", "--model=mlp-lm-tiny", "--steps=5"});
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--worker_binary"), std::string::npos) << run.output;
}

// A size the family refuses fails in its workers (the launcher cannot check a family it does not
// know): the root cause, the last line, carries the worker's own error, not only "exited with code 1".
TEST(CustomModel, Launch_HeadsTheFamilyRefuses_TheLastLineCarriesTheWorkersError) {
  std::vector<std::string> job = MlpJob(1, "auto", 5);
  job.push_back("--heads=4");
  RunResult run = Launch(job);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  std::vector<std::string> lines = absl::StrSplit(run.output, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back().rfind("stagehand: FAILED (exit 1): rank 0 ", 0), 0u) << run.output;
  EXPECT_NE(lines.back().find("exited with code 1 after 0 steps: "), std::string::npos) << run.output;
  EXPECT_NE(lines.back().find("mlp-lm has no attention: drop them"), std::string::npos) << run.output;
  EXPECT_LT(lines.back().size(), 600u) << lines.back();
}

// What docs/custom_model.md shows, with no sizes: fails today because the launcher resolves only
// built-in families (launcher/job/job.cc ResolveModel), so the workers' JobSpec has vocab = seq = 0 and the
// profile (worker/pipeline.cc ProfileLayer) or the synthetic corpus (SIGFPE) fails. Enable once fixed.
TEST(CustomModel, PresetOnly_TwoWorkers_Trains) {
  std::vector<std::string> job = MlpJob(2, "auto", 60);
  job.resize(job.size() - kPresetSizes.size());
  ExpectLearns(Launch(job), 60);
}

}  // namespace
