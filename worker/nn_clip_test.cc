// Gradient clipping by the global norm across stages, against hand computations.
#include <torch/torch.h>

#include "gtest/gtest.h"
#include "worker/nn.h"

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

}  // namespace
}  // namespace stagehand
