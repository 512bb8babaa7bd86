// Gradient clipping by the global norm across stages, against hand computations; the batched refresh of
// the linear layers' bf16 casts (CastBatch).
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

torch::Tensor WithGrad(std::vector<float> grad) {
  torch::Tensor p = torch::zeros({static_cast<int64_t>(grad.size())}).requires_grad_(true);
  p.mutable_grad() = torch::tensor(grad);
  return p;
}

// Two stages: one holds gradient (3, 0), the other (0, 4). The global norm is 5 (neither stage's own);
// clipped to 1, each gradient is scaled by 1 / (5 + 1e-6).
TEST(ClipGradNorm, TwoStages_ClipByTheGlobalNorm) {
  torch::Tensor a = WithGrad({3, 0}), b = WithGrad({0, 4});
  const double other_a = 16, other_b = 9;  // what the all-reduce adds: the other stage's squared norm
  const double na = ClipGradNorm({a}, 1.0, [&](torch::Tensor& s) { s += other_a; });
  const double nb = ClipGradNorm({b}, 1.0, [&](torch::Tensor& s) { s += other_b; });
  EXPECT_DOUBLE_EQ(na, 5.0);
  EXPECT_DOUBLE_EQ(nb, 5.0);
  const double c = 1.0 / (5.0 + 1e-6);
  EXPECT_NEAR(a.grad()[0].item<double>(), 3 * c, 1e-7);
  EXPECT_NEAR(b.grad()[1].item<double>(), 4 * c, 1e-7);
  EXPECT_EQ(a.grad()[1].item<double>(), 0);
}

TEST(ClipGradNorm, UnderTheLimit_LeavesGradientsAlone) {
  torch::Tensor a = WithGrad({0.3f, 0.4f});
  EXPECT_NEAR(ClipGradNorm({a}, 1.0, [](torch::Tensor&) {}), 0.5, 1e-7);
  EXPECT_FLOAT_EQ(a.grad()[0].item<float>(), 0.3f);
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), 0.4f);
}

// CastBatch: stale casts are copied into their existing buffers in one multi-tensor copy (the buffer
// stays the one a captured CUDA graph reads), current ones are left alone, and a cast whose buffer cannot
// be reused is made at once.
TEST(CastBatch, RefreshesStaleCastsInPlaceAndLeavesCurrentOnes) {
  torch::Tensor a = torch::randn({4, 3}), b = torch::randn({5});
  CastCache ca, cb;
  const torch::Tensor buffer_a = ca.Get(a, torch::kBFloat16), buffer_b = cb.Get(b, torch::kBFloat16);
  const void* const at_a = buffer_a.data_ptr();
  {
    torch::NoGradGuard no_grad;
    a.mul_(3);  // moves a's version: its cast is stale; b's is current
  }
  EXPECT_NE(ca.StaleBuffer(a, torch::kBFloat16), nullptr);
  EXPECT_EQ(cb.StaleBuffer(b, torch::kBFloat16), nullptr);
  CastBatch batch;
  batch.Add(ca, a, torch::kBFloat16);
  batch.Add(cb, b, torch::kBFloat16);
  EXPECT_EQ(batch.buffers.size(), 1u) << "only the stale cast is queued";
  batch.Run();
  const torch::Tensor now_a = ca.Get(a, torch::kBFloat16);
  EXPECT_EQ(now_a.data_ptr(), at_a) << "the same buffer, written in place";
  EXPECT_TRUE(torch::equal(now_a, a.to(torch::kBFloat16)));
  EXPECT_EQ(ca.StaleBuffer(a, torch::kBFloat16), nullptr) << "marked fresh after the copy";
  EXPECT_TRUE(torch::equal(cb.Get(b, torch::kBFloat16), b.to(torch::kBFloat16)));
  // A parameter replaced by one of another shape: a new buffer, made by Get at Add.
  torch::Tensor c = torch::randn({2, 2});
  CastBatch again;
  again.Add(ca, c, torch::kBFloat16);
  EXPECT_TRUE(again.buffers.empty());
  EXPECT_TRUE(torch::equal(ca.Get(c, torch::kBFloat16), c.to(torch::kBFloat16)));
}

// The same on CUDA, where the refresh is ATen's multi-tensor fp32 -> bf16 copy.
TEST(CastBatchCuda, MultiTensorCopyIsAFreshCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<torch::Tensor> params = {torch::randn({700, 300}, torch::kCUDA), torch::randn({1001}, torch::kCUDA),
                                       torch::randn({6, 64}, torch::kCUDA)};
  std::vector<CastCache> caches(params.size());
  std::vector<const void*> buffers;
  for (size_t i = 0; i < params.size(); ++i) buffers.push_back(caches[i].Get(params[i], torch::kBFloat16).data_ptr());
  CastBatch batch;
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) {
      params[i].mul_(1.7).add_(0.3);
      batch.Add(caches[i], params[i], torch::kBFloat16);
    }
  }
  EXPECT_EQ(batch.buffers.size(), params.size());
  batch.Run();
  for (size_t i = 0; i < params.size(); ++i) {
    const torch::Tensor& got = caches[i].Get(params[i], torch::kBFloat16);
    EXPECT_EQ(got.data_ptr(), buffers[i]);
    EXPECT_TRUE(torch::equal(got, params[i].to(torch::kBFloat16))) << i;
  }
}

}  // namespace
}  // namespace stagehand
