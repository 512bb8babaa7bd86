// LibTorch links and computes: a matmul against a hand-computed result, and autograd on a small MLP.
#include <torch/torch.h>

#include "gtest/gtest.h"

namespace {

TEST(LibTorch, Matmul_SmallIntegers_MatchesHandComputedProduct) {
  auto a = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2});
  auto b = torch::tensor({5.0f, 6.0f, 7.0f, 8.0f}).reshape({2, 2});
  auto c = torch::matmul(a, b);
  EXPECT_FLOAT_EQ(c[0][0].item<float>(), 19.0f);
  EXPECT_FLOAT_EQ(c[0][1].item<float>(), 22.0f);
  EXPECT_FLOAT_EQ(c[1][0].item<float>(), 43.0f);
  EXPECT_FLOAT_EQ(c[1][1].item<float>(), 50.0f);
}

TEST(LibTorch, Autograd_QuadraticLoss_GradientIsTwoX) {
  auto x = torch::arange(0, 6, torch::kFloat32).requires_grad_(true);
  auto loss = (x * x).sum();
  loss.backward();
  EXPECT_TRUE(torch::allclose(x.grad(), 2 * x.detach()));
}

TEST(LibTorch, Sgd_LinearRegression_LossFalls) {
  torch::manual_seed(0);
  auto w_true = torch::tensor({2.0f, -3.0f}).reshape({2, 1});
  auto x = torch::randn({256, 2});
  auto y = x.matmul(w_true);
  torch::nn::Linear model(2, 1);
  torch::optim::SGD opt(model->parameters(), 0.1);
  float first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    auto loss = torch::mse_loss(model->forward(x), y);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<float>();
    last = loss.item<float>();
  }
  EXPECT_LT(last, first * 1e-3);
}

}  // namespace
