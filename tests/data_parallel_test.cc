// Data parallelism on CPU workers over the CPU transport, through the real launcher, fp32, for both model
// families (tiny, llama-tiny), 1 and 2 stages x 2 replicas, with and without --shard_optimizer (ZeRO-1).
//
// What is compared, and why it must hold on any CPU:
// - One micro-batch per replica against one replica of two micro-batches: the replicas' gradients are
//   g0 and g1, summed by the all-reduce as g0 + g1 and halved; the one replica accumulates g0 / 2 + g1 / 2.
//   Each micro-batch's gradient is computed by the same code on the same shapes, a sum of two terms is
//   the same in either order, and halving is exact, so the gradients are equal bit for bit. Without
//   ZeRO-1 both runs then apply the same AdamW to the same tensors, so the parameters must be equal bit
//   for bit, on every CPU and at every thread count, after every step. The losses, means of the same two
//   values, agree to a rounding (1e-6 relative).
// - With ZeRO-1 the replicas apply AdamW to flat shards of a bucket, not to each parameter: torch's CPU
//   kernel takes each tensor in 16-element units with a scalar loop for the last partial unit, and the
//   scalar and vector loops round differently (fused multiply-adds), so one element is rounded
//   differently when it sits at another offset. After one step from the same gradients and states the
//   parameters differ by at most a few units in the last place of |p| + lr (AdamW's step is at most lr
//   in size): 2^-20 (|p| + lr) bounds it. Later steps are not compared parameter by parameter, for the
//   reason below.
// - Two micro-batches per replica against one replica of four: the sums are taken in another order
//   ((g0 + g1) + (g2 + g3) against ((g0 + g1) + g2) + g3), which changes gradients by a rounding, and
//   AdamW turns a rounding of a gradient that nearly cancels (GPT's key weights and bias get exactly
//   zero along the directions softmax ignores) into a step of up to about lr: no bound on the
//   parameters holds for every CPU. So there only the losses are compared (a mean over 16 x 32 tokens,
//   which the few such elements move by far less than 1e-5 relative), and the replicas, which sum the
//   same values in the same order, must hold identical parameters.
// Layouts that cannot work are refused before anything starts; --layout=auto prints its best three and
// runs the first.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;
using ::testing::HasSubstr;

using ::stagehand::testing::RunResult;

RunResult Launch(const std::vector<std::string>& flags) { return ::stagehand::testing::Launch(flags, "dp"); }

// `stages` x `replicas` workers, each replica running `per_replica` micro-batches of 4 sequences.
std::vector<std::string> Job(const std::string& model, int stages, int replicas, int per_replica, bool shard,
                             int steps = 3) {
  std::vector<std::string> flags = {
      "--device=cpu", absl::StrCat("--workers=", stages * replicas), "--model=" + model, "--fp32",
      // 1F1B needs a micro-batch per stage; GPipe runs one micro-batch through two stages.
      per_replica < stages ? "--schedule=gpipe" : "--schedule=1f1b", absl::StrCat("--pipeline_stages=", stages),
      absl::StrCat("--data_parallel=", replicas), absl::StrCat("--micro_batches=", per_replica),
      absl::StrCat("--global_batch=", 4 * per_replica * replicas), absl::StrCat("--steps=", steps), "--lr=0.003",
      "--partition=uniform", "--save_params", "--seed=7", "--bucket_mb=0.01"};
  if (shard) flags.push_back("--shard_optimizer");
  return flags;
}

std::map<int, double> Losses(const std::string& run_dir) {
  std::map<int, double> out;
  std::vector<std::string> lines = absl::StrSplit(ReadFile(run_dir + "/steps.csv"), '\n', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    double loss;
    int step;
    if (f.size() > 2 && !f[2].empty() && absl::SimpleAtoi(f[0], &step) && absl::SimpleAtod(f[2], &loss)) {
      EXPECT_FALSE(out.count(step)) << "step " << step << " reported a loss twice (one replica reports it)";
      out[step] = loss;
    }
  }
  return out;
}

void ExpectSameLosses(const RunResult& reference, const RunResult& run, double relative, size_t steps = 3) {
  std::map<int, double> want = Losses(reference.run_dir), got = Losses(run.run_dir);
  ASSERT_EQ(want.size(), steps) << ReadFile(reference.run_dir + "/steps.csv");
  ASSERT_EQ(got.size(), want.size()) << ReadFile(run.run_dir + "/steps.csv");
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, relative * std::abs(loss)) << "step " << step;
}

// The parameters of ranks [first, first + count): one replica's pipeline.
std::vector<torch::Tensor> Params(const std::string& run_dir, int first, int count) {
  std::vector<torch::Tensor> all;
  for (int r = first; r < first + count; ++r) {
    std::vector<torch::Tensor> part;
    torch::load(part, absl::StrCat(run_dir, "/params_rank", r, ".pt"));
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

// The two replicas of `run` (ranks [0, stages) and [stages, 2 stages)) hold the same parameters, bit for
// bit: they apply the same averaged gradients in the same order.
void ExpectReplicasIdentical(const RunResult& run, int stages) {
  std::vector<torch::Tensor> first = Params(run.run_dir, 0, stages), second = Params(run.run_dir, stages, stages);
  ASSERT_EQ(first.size(), second.size());
  ASSERT_FALSE(first.empty());
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_TRUE(torch::equal(first[i], second[i])) << "parameter " << i << ": the replicas differ";
  }
}

using Layout = std::tuple<std::string, int, bool>;  // model, stages, ZeRO-1

std::string LayoutName(const ::testing::TestParamInfo<Layout>& info) {
  std::string model = std::get<0>(info.param);
  for (char& c : model) c = c == '-' ? '_' : c;
  return absl::StrCat(model, "_", std::get<1>(info.param), "StagesX2Replicas", std::get<2>(info.param) ? "_ZeRO1" : "");
}

// One reference run per (model, stages, micro-batches, steps), shared by the layouts that compare with it.
const RunResult& Reference(const std::string& model, int stages, int micro_batches, int steps = 3) {
  static std::map<std::tuple<std::string, int, int, int>, RunResult> references;
  const auto key = std::make_tuple(model, stages, micro_batches, steps);
  if (!references.count(key)) references[key] = Launch(Job(model, stages, 1, micro_batches, false, steps));
  return references[key];
}

using ModelAndStages = std::tuple<std::string, int>;

std::string ModelAndStagesName(const ::testing::TestParamInfo<ModelAndStages>& info) {
  return LayoutName(
      ::testing::TestParamInfo<Layout>(Layout{std::get<0>(info.param), std::get<1>(info.param), false}, info.index));
}

class DataParallelEqualsOneReplica : public ::testing::TestWithParam<ModelAndStages> {};

TEST_P(DataParallelEqualsOneReplica, OneMicroBatchPerReplica_ParametersBitForBit) {
  const auto [model, stages] = GetParam();
  setenv("OMP_NUM_THREADS", "1", 1);  // the same threads in every process: the same per-micro-batch sums
  const RunResult& reference = Reference(model, stages, 2);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  RunResult run = Launch(Job(model, stages, 2, 1, false));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("2 replicas"));
  ExpectSameLosses(reference, run, 1e-6);

  std::vector<torch::Tensor> want = Params(reference.run_dir, 0, stages), got = Params(run.run_dir, 0, stages);
  ASSERT_EQ(want.size(), got.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].sizes(), got[i].sizes()) << "parameter " << i;
    EXPECT_TRUE(torch::equal(want[i], got[i])) << "parameter " << i << " differs from one replica's by up to "
                                               << (want[i] - got[i]).abs().max().item<double>();
  }
  ExpectReplicasIdentical(run, stages);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndLayouts, DataParallelEqualsOneReplica,
                         ::testing::Combine(::testing::Values("tiny", "llama-tiny"), ::testing::Values(1, 2)),
                         ModelAndStagesName);

class ShardedOptimizerEqualsOneReplica : public ::testing::TestWithParam<ModelAndStages> {};

TEST_P(ShardedOptimizerEqualsOneReplica, OneStep_ParametersWithinAdamWsRounding) {
  const auto [model, stages] = GetParam();
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Reference(model, stages, 2, /*steps=*/1);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  RunResult run = Launch(Job(model, stages, 2, 1, /*shard=*/true, /*steps=*/1));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("ZeRO-1"));
  ExpectSameLosses(reference, run, 1e-6, 1);

  constexpr double kLr = 0.003, kUlps = 1.0 / (1 << 20);  // the job's lr; 2^-20 (16 float ulps)
  std::vector<torch::Tensor> want = Params(reference.run_dir, 0, stages), got = Params(run.run_dir, 0, stages);
  ASSERT_EQ(want.size(), got.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].sizes(), got[i].sizes()) << "parameter " << i;
    const torch::Tensor excess = (want[i] - got[i]).abs() - kUlps * (want[i].abs() + kLr);
    EXPECT_LE(excess.max().item<double>(), 0.0) << "parameter " << i << " differs from one replica's by up to "
                                                << (want[i] - got[i]).abs().max().item<double>();
  }
  ExpectReplicasIdentical(run, stages);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndLayouts, ShardedOptimizerEqualsOneReplica,
                         ::testing::Combine(::testing::Values("tiny", "llama-tiny"), ::testing::Values(1, 2)),
                         ModelAndStagesName);

class DataParallelMatchesOneProcess : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelMatchesOneProcess, TwoMicroBatchesPerReplica_LossesWithin1e5AndReplicasIdentical) {
  const auto [model, stages, shard] = GetParam();
  setenv("OMP_NUM_THREADS", "1", 1);
  const RunResult& reference = Reference(model, 1, 4);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  RunResult run = Launch(Job(model, stages, 2, 2, shard));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ExpectSameLosses(reference, run, 1e-5);
  ExpectReplicasIdentical(run, stages);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndLayouts, DataParallelMatchesOneProcess,
                         ::testing::Values(Layout{"tiny", 2, true}, Layout{"llama-tiny", 1, false}), LayoutName);

TEST(DataParallelRefused, WorkersNotStagesTimesReplicas_ExitsTwoSayingWhatToPass) {
  RunResult r = Launch({"--device=cpu", "--workers=3", "--model=tiny", "--pipeline_stages=2", "--steps=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("workers = stages x replicas"));
  r = Launch({"--device=cpu", "--workers=4", "--model=tiny", "--pipeline_stages=2", "--data_parallel=3", "--steps=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--data_parallel=3"));
}

TEST(DataParallelRefused, ShardOptimizerWithoutReplicas_ExitsTwo) {
  RunResult r = Launch({"--device=cpu", "--workers=2", "--model=tiny", "--shard_optimizer", "--steps=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--data_parallel=2 or more"));
}

TEST(DataParallelRefused, BatchNotSplittingOverReplicas_ExitsTwo) {
  RunResult r = Launch({"--device=cpu", "--workers=2", "--model=tiny", "--data_parallel=2", "--micro_batches=4",
                        "--global_batch=12", "--steps=1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("2 replicas x 4"));
}

TEST(LayoutAuto, TinyOnTwoCpuWorkers_PrintsTheBestThreeAndRunsTheFirst) {
  setenv("OMP_NUM_THREADS", "1", 1);
  // --partition=auto: the workers profile, so the coordinator predicts the step from what they measured.
  RunResult r = Launch({"--device=cpu", "--workers=2", "--model=tiny", "--layout=auto", "--global_batch=16",
                        "--steps=2", "--partition=auto"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("layout auto:"));
  EXPECT_THAT(r.output, HasSubstr("  1. "));
  EXPECT_THAT(r.output, HasSubstr("  3. "));
  EXPECT_THAT(r.output, HasSubstr("predicted"));
  EXPECT_THAT(r.output, HasSubstr("the first is "));  // why the first beat the second
  EXPECT_THAT(r.output, HasSubstr("in flight per rank"));
  // Within 3x: "predicted X s/step (from ...), measured Y s/step (+N%)"; beyond: in words.
  EXPECT_THAT(r.output,
              testing::ContainsRegex("stagehand: (predicted [0-9.]+ s/step \\(from the measured profile\\), "
                                     "measured [0-9.]+ s/step|measured [0-9.]+ s/step, [0-9.]+x (faster than )?"
                                     "the predicted [0-9.]+ s \\(from the measured profile\\))"));
  const std::string report = ReadFile(r.run_dir + "/report.json");
  EXPECT_THAT(report, HasSubstr("predicted_step_seconds"));
  EXPECT_THAT(report, HasSubstr("predicted_from"));
}

// An explicit layout predicts too: 2 stages of 1F1B, profiled, with each rank's predicted bubble beside
// the measured one at the end and in report.json.
TEST(LayoutManual, TwoStages_PredictedAgainstMeasuredPerRank) {
  setenv("OMP_NUM_THREADS", "1", 1);
  RunResult r =
      Launch({"--device=cpu", "--workers=2", "--model=tiny", "--schedule=zb-h1", "--micro_batches=4", "--steps=3"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, testing::ContainsRegex("in flight per rank 2/[12] micro-batches"));
  EXPECT_THAT(r.output, testing::ContainsRegex("stagehand: (predicted [0-9.]+ s/step \\(from the measured profile\\), "
                                               "measured [0-9.]+ s/step \\([-+][0-9]+%\\)|measured [0-9.]+ s/step, "
                                               "[0-9.]+x (faster than )?the predicted [0-9.]+ s \\(from the measured "
                                               "profile\\)); bubble per rank predicted [0-9.]+% [0-9.]+%, measured "
                                               "[0-9.]+% [0-9.]+%"));
  const std::string report = ReadFile(r.run_dir + "/report.json");
  EXPECT_THAT(report, testing::ContainsRegex("\"predicted_from\": ?\"profile\""));
  EXPECT_THAT(report, HasSubstr("predicted_bubble_fraction"));
}

}  // namespace
