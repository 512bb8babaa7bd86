// The language-model losses of the Stage interface (stage.h): the plain one, and the fused one over bf16
// logits (fused_backward_kernels.h). The *Cuda* case skips without a GPU.
#include "engine/stage.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>

namespace stagehand {
namespace {

TEST(LanguageModelLoss, Bf16Logits_MatchesManualCrossEntropyInFp32) {
  torch::manual_seed(0);
  torch::Tensor logits = torch::randn({2, 3, 5}).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(5, {2, 3}, torch::kLong);
  torch::Tensor loss = LanguageModelLoss(logits, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  torch::Tensor logp = torch::log_softmax(logits.to(torch::kFloat32), -1);
  torch::Tensor expected = -logp.gather(-1, targets.unsqueeze(-1)).mean();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6);
}

// On the CPU (and for fp32 logits) the fused loss is the plain one, gradients included.
TEST(FusedLoss, Cpu_IsLanguageModelLoss) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({2, 5, 11}, torch::requires_grad());
  torch::Tensor targets = torch::randint(0, 11, {2, 5}, torch::kInt64);
  torch::Tensor a = FusedLanguageModelLoss(logits, targets);
  torch::Tensor ga = torch::autograd::grad({a}, {logits})[0];
  torch::Tensor b = LanguageModelLoss(logits, targets);
  torch::Tensor gb = torch::autograd::grad({b}, {logits})[0];
  EXPECT_EQ(a.item<float>(), b.item<float>());
  EXPECT_TRUE(torch::equal(ga, gb));
}

// The fused cross-entropy against torch's on the upcast logits: the loss within 1e-5 relative, the
// gradient (of 0.25 x the loss, so the incoming gradient counts) within a bf16 rounding of torch's fp32
// one, ignored targets (-100) out of the mean; vocabularies of 8k (vectors) and not (one at a time).
TEST(FusedKernelsCuda, CrossEntropy_MatchesTorchsOnUpcastLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t vocab : {32768, 32000, 1001}) {
    SCOPED_TRACE(vocab);
    const int64_t b = 3, s = 67;
    torch::Tensor base = (torch::randn({b, s, vocab}, cuda) * 4).to(torch::kBFloat16);
    torch::Tensor targets = torch::randint(0, vocab, {b, s}, cuda.dtype(torch::kInt64));
    targets.index_put_({0, torch::indexing::Slice(0, 5)}, -100);
    torch::Tensor fused_in = base.clone().requires_grad_(true), ref_in = base.clone().requires_grad_(true);
    torch::Tensor loss = FusedLanguageModelLoss(fused_in, targets);
    torch::Tensor ref = LanguageModelLoss(ref_in, targets);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>()));
    (loss * 0.25).backward();
    // The reference gradient in fp32 (the cast's backward would round it to bf16).
    torch::Tensor ref_f32 = base.to(torch::kFloat32).requires_grad_(true);
    (LanguageModelLoss(ref_f32, targets) * 0.25).backward();
    const torch::Tensor got = fused_in.grad().to(torch::kFloat32), want = ref_f32.grad();
    ASSERT_EQ(fused_in.grad().scalar_type(), torch::kBFloat16);
    const torch::Tensor off = (got - want).abs() > want.abs() * std::ldexp(1.0, -7) + 1e-9;
    EXPECT_EQ(off.sum().item<int64_t>(), 0);
    EXPECT_EQ(got.index({0, torch::indexing::Slice(0, 5)}).abs().max().item<float>(), 0.f);  // ignored rows
  }
}

}  // namespace
}  // namespace stagehand
