// Unit tests of the pipeline planner: the balanced split against brute force over every contiguous
// split (with and without memory limits), the reference GPT's heavy head, uniform and explicit splits,
// and every refusal naming what to change.
#include "launcher/plan/planner.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Pointwise;

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr double kTol = 1e-9;

PlanLayer Layer(double forward_ms, double backward_ms, int64_t param_bytes = 0, int64_t activation_bytes = 0) {
  PlanLayer c;
  c.forward_ms = forward_ms;
  c.backward_ms = backward_ms;
  c.param_bytes = param_bytes;
  c.activation_bytes = activation_bytes;
  return c;
}

// Layers whose forward plus backward time is each of `ms` (backward is twice forward, as in training).
std::vector<PlanLayer> Layers(const std::vector<double>& ms) {
  std::vector<PlanLayer> out;
  for (double m : ms) out.push_back(Layer(m / 3, 2 * m / 3));
  return out;
}

// The reference GPT of targets.md: an embedding of tiny cost, 24 equal blocks, a head of 1.2 blocks.
std::vector<PlanLayer> ReferenceModel() {
  std::vector<double> ms = {0.03};
  ms.insert(ms.end(), 24, 1.0);
  ms.push_back(1.2);
  return Layers(ms);
}

PlanRequest Request(std::vector<PlanLayer> layers, int stages) {
  PlanRequest r;
  r.layers = std::move(layers);
  r.stages = stages;
  return r;
}

// --- An independent brute force: every contiguous split, priced straight from the definition. ---

double StageMs(const PlanRequest& r, int begin, int end) {
  double ms = 0;
  for (int i = begin; i < end; ++i) ms += r.layers[i].forward_ms + (r.forward_only ? 0 : r.layers[i].backward_ms);
  return ms;
}

int64_t StageBytes(const PlanRequest& r, int s, int begin, int end) {
  int64_t params = 0, acts = 0;
  for (int i = begin; i < end; ++i) {
    params += r.layers[i].param_bytes;
    acts += r.layers[i].activation_bytes;
  }
  if (r.forward_only) params /= 4;
  return params + (r.in_flight.empty() ? 1 : r.in_flight[s]) * acts;
}

// Calls `visit` with every split into r.stages parts of >= 1 layer, in lexicographic order.
void ForEachSplit(const PlanRequest& r, const std::function<void(const std::vector<int>&)>& visit) {
  std::vector<int> counts;
  std::function<void(int)> rec = [&](int left) {
    const int stages_left = r.stages - static_cast<int>(counts.size());
    if (stages_left == 1) {
      counts.push_back(left);
      visit(counts);
      counts.pop_back();
      return;
    }
    for (int c = 1; c <= left - (stages_left - 1); ++c) {
      counts.push_back(c);
      rec(left - c);
      counts.pop_back();
    }
  };
  rec(static_cast<int>(r.layers.size()));
}

// The worst value of `cost(stage, begin, end)` over the stages of `counts`.
double Worst(const std::vector<int>& counts, const std::function<double(int, int, int)>& cost) {
  double worst = 0;
  int begin = 0;
  for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
    worst = std::max(worst, cost(s, begin, begin + counts[s]));
    begin += counts[s];
  }
  return worst;
}

// The lexicographically first split whose worst cost is the minimum (within kTol): the planner's
// documented tie-break.
std::optional<std::vector<int>> BruteForceBest(const PlanRequest& r, const std::function<double(int, int, int)>& cost) {
  double best = std::numeric_limits<double>::infinity();
  ForEachSplit(r, [&](const std::vector<int>& c) { best = std::min(best, Worst(c, cost)); });
  if (best == std::numeric_limits<double>::infinity()) return std::nullopt;
  std::optional<std::vector<int>> first;
  ForEachSplit(r, [&](const std::vector<int>& c) {
    if (!first && Worst(c, cost) <= best * (1 + kTol)) first = c;
  });
  return first;
}

bool Fits(const PlanRequest& r, int s, int begin, int end) {
  return r.memory_bytes.empty() || StageBytes(r, s, begin, end) <= r.memory_bytes[s];
}

std::optional<std::vector<int>> BruteForceBalanced(const PlanRequest& r) {
  return BruteForceBest(r, [&r](int s, int b, int e) {
    return Fits(r, s, b, e) ? StageMs(r, b, e) : std::numeric_limits<double>::infinity();
  });
}

double BruteForceBottleneck(const PlanRequest& r, const std::vector<int>& counts) {
  return Worst(counts, [&r](int, int b, int e) { return StageMs(r, b, e); });
}

// The message the planner must give when nothing fits: the tightest stage of the split closest to fitting.
std::string BruteForceNoFitMessage(const PlanRequest& r) {
  auto fill = [&r](int s, int b, int e) {
    return static_cast<double>(StageBytes(r, s, b, e)) / static_cast<double>(r.memory_bytes[s]);
  };
  const std::vector<int> closest = *BruteForceBest(r, fill);
  int tightest = 0, begin = 0;
  double worst = -1;
  int64_t needed = 0;
  for (int s = 0; s < r.stages; ++s) {
    const double f = fill(s, begin, begin + closest[s]);
    if (f > worst) {
      worst = f;
      tightest = s;
      needed = StageBytes(r, s, begin, begin + closest[s]);
    }
    begin += closest[s];
  }
  return absl::StrFormat("stage %d needs %.1f GiB but its device has %.1f GiB", tightest,
                         static_cast<double>(needed) / kGiB, static_cast<double>(r.memory_bytes[tightest]) / kGiB);
}

int Uniform(std::mt19937& rng, int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); }

// A random instance; times are multiples of 1/4 so sums are exact and ties (hence the tie-break) are
// common. Memory, when `limited`, is tight enough that some instances fit nothing at all.
PlanRequest RandomRequest(std::mt19937& rng, int layers, int stages, bool limited) {
  PlanRequest r;
  r.stages = stages;
  r.forward_only = Uniform(rng, 0, 3) == 0;
  for (int i = 0; i < layers; ++i) {
    r.layers.push_back(Layer(Uniform(rng, 0, 12) / 4.0, Uniform(rng, 0, 24) / 4.0, Uniform(rng, 0, 8) * kGiB,
                             Uniform(rng, 0, 4) * kGiB / 2));
  }
  if (limited) {
    for (int s = 0; s < stages; ++s) {
      r.memory_bytes.push_back(Uniform(rng, 4, 30) * kGiB);
      r.in_flight.push_back(Uniform(rng, 1, 3));
    }
  }
  return r;
}

struct Tally {
  int fit = 0;
  int no_fit = 0;
  int memory_moved_split = 0;  // memory made the best split slower than the unconstrained one
};

// Checks the planner against brute force on one instance.
void ExpectMatchesBruteForce(const PlanRequest& r, Tally& tally) {
  const absl::StatusOr<Plan> plan = PlanBalanced(r);
  const std::optional<std::vector<int>> expected = BruteForceBalanced(r);
  if (!expected) {
    ++tally.no_fit;
    ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(plan.status().message(), HasSubstr(BruteForceNoFitMessage(r)));
    return;
  }
  ++tally.fit;
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAreArray(*expected));
  EXPECT_NEAR(plan->bottleneck_ms, BruteForceBottleneck(r, *expected), kTol);
  for (size_t s = 0; s < r.memory_bytes.size(); ++s) EXPECT_LE(plan->stage_bytes[s], r.memory_bytes[s]);
  PlanRequest unlimited = r;
  unlimited.memory_bytes.clear();
  if (BruteForceBottleneck(r, *BruteForceBalanced(unlimited)) < plan->bottleneck_ms) ++tally.memory_moved_split;
}

TEST(PlannerTest, PlanBalanced_HeavyHead_GivesLastStageFewerBlocks) {
  const PlanRequest r = Request(ReferenceModel(), 2);
  const absl::StatusOr<Plan> plan = PlanBalanced(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Embedding + 13 blocks, then 11 blocks + head: 13.03 ms against 12.2 ms.
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(14, 12));
  EXPECT_THAT(plan->layers_per_stage, ElementsAreArray(*BruteForceBalanced(r)));
  EXPECT_NEAR(plan->bottleneck_ms, 13.03, 1e-9);
  EXPECT_THAT(plan->stage_ms, Pointwise(DoubleNear(1e-9), {13.03, 12.2}));
  // The even 12/12 block split (13/13 layers) is what the balanced split beats.
  const absl::StatusOr<Plan> uniform = PlanUniform(r);
  ASSERT_TRUE(uniform.ok()) << uniform.status();
  EXPECT_NEAR(uniform->bottleneck_ms, 13.2, 1e-9);
}

TEST(PlannerTest, PlanBalanced_RandomEightLayersThreeStages_MatchesBruteForce) {
  std::mt19937 rng(20261129);
  Tally tally;
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(i);
    ExpectMatchesBruteForce(RandomRequest(rng, 8, 3, /*limited=*/i % 4 != 0), tally);
  }
  // The instances must exercise every branch: fits, fits only by moving layers, and fits nowhere.
  EXPECT_GT(tally.fit, 20);
  EXPECT_GT(tally.no_fit, 10);
  EXPECT_GT(tally.memory_moved_split, 10);
}

TEST(PlannerTest, PlanBalanced_RandomShapes_MatchesBruteForce) {
  std::mt19937 rng(7);
  Tally tally;
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(i);
    const int layers = Uniform(rng, 1, 9);
    ExpectMatchesBruteForce(RandomRequest(rng, layers, Uniform(rng, 1, std::min(layers, 5)), i % 3 != 0), tally);
  }
  EXPECT_GT(tally.fit, 20);
  EXPECT_GT(tally.no_fit, 5);
}

TEST(PlannerTest, PlanBalanced_IrrationalCosts_ReachesBruteForceBottleneck) {
  // Costs that are not exact in binary: the split may differ on near-ties, the bottleneck may not.
  std::mt19937 rng(99);
  for (int i = 0; i < 200; ++i) {
    SCOPED_TRACE(i);
    std::vector<double> ms;
    for (int l = 0; l < 8; ++l) ms.push_back(0.1 + (rng() % 100000) / 7919.0);
    const PlanRequest r = Request(Layers(ms), 3);
    const absl::StatusOr<Plan> plan = PlanBalanced(r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_NEAR(plan->bottleneck_ms, BruteForceBottleneck(r, *BruteForceBalanced(r)), 1e-9);
  }
}

TEST(PlannerTest, PlanBalanced_EqualCosts_PutsSurplusOnLaterStages) {
  // The documented tie-break: each stage takes the fewest layers that still reach the optimum.
  const absl::StatusOr<Plan> plan = PlanBalanced(Request(Layers({1, 1, 1, 1}), 3));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(1, 1, 2));
}

TEST(PlannerTest, PlanBalanced_MemoryLimit_MovesLayersOffTheFullStage) {
  PlanRequest r = Request({}, 2);
  for (int i = 0; i < 4; ++i) r.layers.push_back(Layer(1, 2, 0, kGiB));
  r.in_flight = {2, 1};                    // 1F1B: the first stage holds two micro-batches
  r.memory_bytes = {3 * kGiB, 10 * kGiB};  // room for one layer's activations twice, not two
  const absl::StatusOr<Plan> plan = PlanBalanced(r);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(1, 3));
  EXPECT_THAT(plan->stage_bytes, ElementsAre(2 * kGiB, 3 * kGiB));
  EXPECT_DOUBLE_EQ(plan->bottleneck_ms, 9);
}

TEST(PlannerTest, PlanBalanced_NothingFits_NamesTightestStageAndWhatToDo) {
  PlanRequest r = Request({}, 2);
  for (int i = 0; i < 4; ++i) r.layers.push_back(Layer(1, 2, 10 * kGiB, 0));
  r.memory_bytes = {15 * kGiB, 25 * kGiB};
  // Closest split is 1/3: stage 1 needs 30 of 25 GiB (1.2x); 2/2 would need 20 of 15 (1.33x).
  const absl::StatusOr<Plan> plan = PlanBalanced(r);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(),
              AllOf(HasSubstr("stage 1 needs 30.0 GiB but its device has 25.0 GiB"),
                    HasSubstr("use more GPUs, fewer micro-batches in flight (1F1B), or a smaller model")));
}

TEST(PlannerTest, PlanBalanced_ForwardOnly_BalancesForwardTimeOnly) {
  // With backward the last layer dominates (2, 1, 11 -> split 2/1); forward only it is 2, 1, 1 -> 1/2.
  std::vector<PlanLayer> layers = {Layer(2, 0), Layer(1, 0), Layer(1, 10)};
  const absl::StatusOr<Plan> training = PlanBalanced(Request(layers, 2));
  ASSERT_TRUE(training.ok()) << training.status();
  EXPECT_THAT(training->layers_per_stage, ElementsAre(2, 1));
  EXPECT_DOUBLE_EQ(training->bottleneck_ms, 11);

  PlanRequest r = Request(layers, 2);
  r.forward_only = true;
  const absl::StatusOr<Plan> inference = PlanBalanced(r);
  ASSERT_TRUE(inference.ok()) << inference.status();
  EXPECT_THAT(inference->layers_per_stage, ElementsAre(1, 2));
  EXPECT_THAT(inference->stage_ms, ElementsAre(2.0, 2.0));
}

TEST(PlannerTest, PlanExplicit_ForwardOnly_CountsAQuarterOfParamBytes) {
  PlanRequest r = Request({Layer(1, 2, 400, 10), Layer(1, 2, 800, 20)}, 1);
  r.in_flight = {3};
  EXPECT_THAT(PlanExplicit(r, {2})->stage_bytes, ElementsAre(1200 + 3 * 30));
  r.forward_only = true;
  EXPECT_THAT(PlanExplicit(r, {2})->stage_bytes, ElementsAre(300 + 3 * 30));
}

TEST(PlannerTest, PlanBalanced_SingleStage_TakesEveryLayer) {
  const absl::StatusOr<Plan> plan = PlanBalanced(Request(Layers({1, 2, 3}), 1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(3));
  EXPECT_DOUBLE_EQ(plan->bottleneck_ms, 6);
}

TEST(PlannerTest, PlanBalanced_StagesEqualLayers_OneLayerEach) {
  const absl::StatusOr<Plan> plan = PlanBalanced(Request(Layers({3, 1, 2}), 3));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(1, 1, 1));
  EXPECT_THAT(plan->stage_ms, Pointwise(DoubleNear(1e-12), {3.0, 1.0, 2.0}));
  EXPECT_DOUBLE_EQ(plan->bottleneck_ms, 3);
}

TEST(PlannerTest, PlanBalanced_ManyLayers_IsExactAndQuick) {
  // 300 equal layers over 8 stages: no stage can do better than ceil(300 / 8) = 38 layers.
  const absl::StatusOr<Plan> plan = PlanBalanced(Request(Layers(std::vector<double>(300, 1.0)), 8));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_NEAR(plan->bottleneck_ms, 38, 1e-9);
}

TEST(PlannerTest, PlanBalanced_MoreStagesThanLayers_SaysHowManyAtMost) {
  const absl::StatusOr<Plan> plan = PlanBalanced(Request(Layers({1}), 2));
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("2 stages but the model has only 1 layers; use at most 1 stages"));
}

TEST(PlannerTest, AllPlanners_BadRequest_AreInvalidArgument) {
  PlanRequest zero = Request(Layers({1, 2}), 0);
  PlanRequest memory = Request(Layers({1, 2}), 2);
  memory.memory_bytes = {kGiB};
  PlanRequest in_flight = Request(Layers({1, 2}), 2);
  in_flight.in_flight = {1, 1, 1};
  PlanRequest negative = Request({Layer(-1, 0), Layer(1, 0)}, 2);
  for (const PlanRequest& r : {zero, memory, in_flight, negative}) {
    EXPECT_EQ(PlanBalanced(r).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(PlanUniform(r).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(PlanExplicit(r, {1, 1}).status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(PlanBalanced(memory).status().message(),
              HasSubstr("memory_bytes lists 1 entries but there are 2 stages"));
  EXPECT_THAT(PlanBalanced(in_flight).status().message(),
              HasSubstr("in_flight lists 3 entries but there are 2 stages"));
}

TEST(PlannerTest, PlanUniform_37LayersOver3Stages_ExtraLayersGoFirst) {
  const absl::StatusOr<Plan> plan = PlanUniform(Request(Layers(std::vector<double>(37, 1.0)), 3));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(13, 12, 12));
  EXPECT_DOUBLE_EQ(plan->bottleneck_ms, 13);
}

TEST(PlannerTest, PlanUniform_EvenCount_SplitsEqually) {
  const absl::StatusOr<Plan> plan = PlanUniform(Request(ReferenceModel(), 2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(13, 13));
  EXPECT_THAT(plan->stage_ms, Pointwise(DoubleNear(1e-9), {12.03, 13.2}));
}

TEST(PlannerTest, PlanUniform_OverMemory_IsResourceExhausted) {
  PlanRequest r = Request({}, 2);
  for (int i = 0; i < 4; ++i) r.layers.push_back(Layer(1, 2, 10 * kGiB, 0));
  r.memory_bytes = {40 * kGiB, 15 * kGiB};  // 2/2 needs 20 GiB on stage 1; 3/1 would fit
  const absl::StatusOr<Plan> plan = PlanUniform(r);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("stage 1 needs 20.0 GiB but its device has 15.0 GiB"));
  EXPECT_TRUE(PlanBalanced(r).ok());
}

TEST(PlannerTest, PlanExplicit_ValidCounts_PricesEachStage) {
  PlanRequest r = Request({Layer(1, 2, 100, 10), Layer(2, 4, 200, 20), Layer(3, 6, 300, 30)}, 2);
  r.in_flight = {2, 1};
  const absl::StatusOr<Plan> plan = PlanExplicit(r, {1, 2});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(plan->layers_per_stage, ElementsAre(1, 2));
  EXPECT_THAT(plan->stage_ms, ElementsAre(3, 15));
  EXPECT_THAT(plan->stage_bytes, ElementsAre(100 + 2 * 10, 500 + 50));
  EXPECT_DOUBLE_EQ(plan->bottleneck_ms, 15);
}

TEST(PlannerTest, PlanExplicit_WrongNumberOfSizes_SaysSo) {
  const absl::StatusOr<Plan> plan = PlanExplicit(Request(Layers({1, 1, 1}), 2), {1, 1, 1});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("--partition lists 3 stage sizes but there are 2 stages"));
}

TEST(PlannerTest, PlanExplicit_WrongSum_SaysTheLayerCount) {
  const absl::StatusOr<Plan> plan = PlanExplicit(Request(Layers(std::vector<double>(26, 1.0)), 2), {13, 12});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("sizes sum to 25 but the model has 26 layers"));
}

TEST(PlannerTest, PlanExplicit_EmptyStage_NeedsAtLeastOneLayer) {
  const absl::StatusOr<Plan> plan = PlanExplicit(Request(Layers({1, 1, 1}), 3), {2, 1, 0});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("stage 2 gets 0 layers; every stage needs at least 1"));
}

TEST(PlannerTest, PlanExplicit_OverMemory_IsResourceExhausted) {
  PlanRequest r = Request({Layer(1, 2, 2 * kGiB, 0), Layer(1, 2, 2 * kGiB, 0)}, 2);
  r.memory_bytes = {3 * kGiB, kGiB};
  const absl::StatusOr<Plan> plan = PlanExplicit(r, {1, 1});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(plan.status().message(), HasSubstr("stage 1 needs 2.0 GiB but its device has 1.0 GiB"));
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

// --- Clock-aware partitions: each stage's device speed (telemetry/clock_model.h, time ~ 1/clock). ---

TEST(PlannerTest, PlanBalanced_EqualSpeeds_ExactlyTheUnweightedPlan) {
  std::mt19937 rng(19);
  for (int i = 0; i < 50; ++i) {
    const int layers = Uniform(rng, 2, 30);
    PlanRequest r = RandomRequest(rng, layers, Uniform(rng, 1, std::min(layers, 5)), i % 2 == 0);
    absl::StatusOr<Plan> blind = PlanBalanced(r);
    r.stage_speed.assign(r.stages, 1.0);
    absl::StatusOr<Plan> weighted = PlanBalanced(r);
    ASSERT_EQ(blind.ok(), weighted.ok());
    if (!blind.ok()) continue;
    EXPECT_EQ(weighted->layers_per_stage, blind->layers_per_stage);
    EXPECT_EQ(weighted->stage_ms, blind->stage_ms);  // bit for bit
    EXPECT_EQ(weighted->bottleneck_ms, blind->bottleneck_ms);
  }
}

TEST(PlannerTest, PlanBalanced_StageAtNinetyPercent_GetsLessWorkAndABetterBottleneck) {
  PlanRequest r = Request(ReferenceModel(), 2);
  const absl::StatusOr<Plan> blind = PlanBalanced(r);
  ASSERT_TRUE(blind.ok()) << blind.status();
  r.stage_speed = {0.9, 1.0};
  const absl::StatusOr<Plan> weighted = PlanBalanced(r);
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  EXPECT_LT(weighted->layers_per_stage[0], blind->layers_per_stage[0]);
  // The clock-blind split, priced at the same speeds, is slower than the clock-aware one.
  const absl::StatusOr<Plan> blind_at_speed = PlanExplicit(r, blind->layers_per_stage);
  ASSERT_TRUE(blind_at_speed.ok());
  EXPECT_LT(weighted->bottleneck_ms, blind_at_speed->bottleneck_ms);
  // Stage 0's time is its layers' time over its speed.
  EXPECT_NEAR(weighted->stage_ms[0], StageMs(r, 0, weighted->layers_per_stage[0]) / 0.9, kTol);
}

TEST(PlannerTest, PlanBalanced_RandomSpeeds_MatchesBruteForce) {
  std::mt19937 rng(1919);
  for (int i = 0; i < 100; ++i) {
    const int layers = Uniform(rng, 2, 9);
    PlanRequest r = RandomRequest(rng, layers, Uniform(rng, 1, std::min(layers, 4)), /*limited=*/false);
    std::uniform_real_distribution<double> speed(0.7, 1.0);
    for (int s = 0; s < r.stages; ++s) r.stage_speed.push_back(speed(rng));
    const absl::StatusOr<Plan> plan = PlanBalanced(r);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::optional<std::vector<int>> expected =
        BruteForceBest(r, [&r](int s, int b, int e) { return StageMs(r, b, e) / r.stage_speed[s]; });
    ASSERT_TRUE(expected.has_value());
    EXPECT_NEAR(plan->bottleneck_ms,
                Worst(*expected, [&r](int s, int b, int e) { return StageMs(r, b, e) / r.stage_speed[s]; }), 1e-9);
  }
}

TEST(PlannerTest, PlanBalanced_BadSpeeds_AreInvalidArgument) {
  PlanRequest r = Request(ReferenceModel(), 2);
  r.stage_speed = {1.0};
  EXPECT_THAT(PlanBalanced(r).status().message(), HasSubstr("stage_speed lists 1 entries but there are 2 stages"));
  r.stage_speed = {1.0, 0.0};
  EXPECT_THAT(PlanBalanced(r).status().message(), HasSubstr("stage 1 has speed 0"));
  EXPECT_EQ(PlanUniform(r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagehand
