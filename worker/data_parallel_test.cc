// Tests of data parallelism: the bucket plan, the shards, and the averaged (and ZeRO-1 sharded) step
// of replicas as threads over the fake transport, against one optimizer on the mean gradient.
#include "worker/data_parallel.h"

#include <torch/torch.h>

#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nn/nn.h"
#include "transport/fake_transport.h"

namespace stagehand {
namespace {

TEST(PlanBucketsTest, PlanBuckets_EqualParams_LastFirstInBucketsOfTheSize) {
  EXPECT_EQ(PlanBuckets({4, 4, 4, 4}, 8), (std::vector<std::vector<int>>{{3, 2}, {1, 0}}));
}

TEST(PlanBucketsTest, PlanBuckets_ParamLargerThanBucket_IsAloneAndWhole) {
  EXPECT_EQ(PlanBuckets({4, 100, 4}, 8), (std::vector<std::vector<int>>{{2, 1}, {0}}));
  EXPECT_EQ(PlanBuckets({100, 4}, 8), (std::vector<std::vector<int>>{{1, 0}}));
}

TEST(PlanBucketsTest, PlanBuckets_NoParams_NoBuckets) { EXPECT_TRUE(PlanBuckets({}, 8).empty()); }

TEST(ShardOfTest, ShardOf_TenOverThree_PadsToTwelveInShardsOfFour) {
  for (int i = 0; i < 3; ++i) {
    const Shard s = ShardOf(10, 3, i);
    EXPECT_EQ(s.size, 4);
    EXPECT_EQ(s.padded, 12);
    EXPECT_EQ(s.begin, 4 * i);
  }
  EXPECT_EQ(ShardOf(8, 2, 1).begin, 4);
  EXPECT_EQ(ShardOf(8, 2, 1).padded, 8);
}

std::vector<torch::Tensor> InitialParams() {
  torch::manual_seed(3);
  return {torch::randn({3, 2}), torch::randn({5}), torch::randn({7})};
}

// Replica r's gradient of parameter i.
torch::Tensor GradOf(int replica, int i, const torch::Tensor& p) {
  return torch::full(p.sizes(), 0.25 * (replica + 1) * (i + 1)) + torch::arange(p.numel()).view(p.sizes()) * 0.125;
}

// Each of `replicas` threads steps its copy of the parameters `steps` times through DataParallel;
// returns every replica's parameters and (via `elements`) its optimizer state's size.
std::vector<std::vector<torch::Tensor>> RunReplicas(int replicas, bool shard, int steps, int64_t bucket_bytes,
                                                    std::vector<int64_t>* elements) {
  FakeFabric fabric(replicas);
  // Drawn once here: torch::manual_seed and randn on the global generator from several threads at once
  // would race (and gave replicas different starting points now and then).
  const std::vector<torch::Tensor> initial = InitialParams();
  std::vector<std::vector<torch::Tensor>> params(replicas);
  elements->assign(replicas, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < replicas; ++r) {
    threads.emplace_back([&, r] {
      FakeTransport world(&fabric, r);
      std::vector<int> all;
      for (int i = 0; i < replicas; ++i) all.push_back(i);
      auto group = world.Split(0, all);
      ASSERT_TRUE(group.ok()) << group.status();
      for (const torch::Tensor& p : initial) params[r].push_back(p.clone());
      for (auto& p : params[r]) p.requires_grad_(true);
      FusedAdamW optimizer(params[r], 0.01);
      DataParallelOptions o;
      o.shard_optimizer = shard;
      o.bucket_bytes = bucket_bytes;
      o.lr = 0.01;
      Streams streams(false);
      DataParallel dp(o, {params[r]}, group->get(), &streams);
      for (int step = 0; step < steps; ++step) {
        for (size_t i = 0; i < params[r].size(); ++i)
          params[r][i].mutable_grad() = GradOf(r, i, params[r][i]) * (step + 1);
        dp.GradientsReady(0);
        ASSERT_TRUE(dp.Step(optimizer).ok());
        optimizer.ZeroGrad();
      }
      (*elements)[r] = dp.OptimizerElements();
      absl::StatusOr<double> loss = dp.MeanLoss(torch::tensor(1.0 + r));
      ASSERT_TRUE(loss.ok());
      EXPECT_DOUBLE_EQ(*loss, 1.0 + 0.5 * (replicas - 1));
    });
  }
  for (auto& t : threads) t.join();
  return params;
}

// One process: the mean of the replicas' gradients, one optimizer.
std::vector<torch::Tensor> Reference(int replicas, int steps) {
  std::vector<torch::Tensor> params = InitialParams();
  for (auto& p : params) p.requires_grad_(true);
  FusedAdamW optimizer(params, 0.01);
  for (int step = 0; step < steps; ++step) {
    for (size_t i = 0; i < params.size(); ++i) {
      torch::Tensor sum = torch::zeros_like(params[i]);
      for (int r = 0; r < replicas; ++r) sum += GradOf(r, i, params[i]) * (step + 1);
      params[i].mutable_grad() = sum / replicas;
    }
    optimizer.Step();
    optimizer.ZeroGrad();
  }
  return params;
}

void ExpectMatches(const std::vector<std::vector<torch::Tensor>>& got, const std::vector<torch::Tensor>& want) {
  for (size_t r = 0; r < got.size(); ++r) {
    ASSERT_EQ(got[r].size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[r][i], want[i], 1e-6, 1e-7)) << "replica " << r << " parameter " << i;
    }
  }
}

TEST(DataParallelTest, Step_TwoReplicasSmallBuckets_EqualsOneOptimizerOnTheMeanGradient) {
  std::vector<int64_t> elements;
  ExpectMatches(RunReplicas(2, /*shard=*/false, 3, /*bucket_bytes=*/24, &elements), Reference(2, 3));
  EXPECT_EQ(elements[0], 18);
}

TEST(DataParallelTest, Step_ThreeReplicasOneBucket_EqualsOneOptimizerOnTheMeanGradient) {
  std::vector<int64_t> elements;
  ExpectMatches(RunReplicas(3, false, 2, int64_t{1} << 20, &elements), Reference(3, 2));
}

TEST(DataParallelTest, Step_ShardedTwoReplicas_EqualsUnshardedAndHoldsHalfTheState) {
  std::vector<int64_t> elements;
  ExpectMatches(RunReplicas(2, /*shard=*/true, 3, /*bucket_bytes=*/24, &elements), Reference(2, 3));
  // Buckets of 7 (padded to 8) and 6 + 5 = 11 (padded to 12) elements: 4 + 6 per replica.
  EXPECT_EQ(elements[0], 10);
  EXPECT_EQ(elements[1], 10);
}

TEST(DataParallelTest, Step_ShardedThreeReplicasWithPadding_EqualsUnsharded) {
  std::vector<int64_t> elements;
  ExpectMatches(RunReplicas(3, true, 2, int64_t{1} << 20, &elements), Reference(3, 2));
  EXPECT_EQ(elements[0], 6);  // 18 elements in one bucket, 6 each
}

}  // namespace
}  // namespace stagehand
