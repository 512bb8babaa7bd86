// For the model families' tests: checks a stage's zero-bubble split (BackwardInput, then
// BackwardWeight) against one full Backward of the same micro-batch. LibTorch and GoogleTest; testonly.
#ifndef STAGEHAND_ENGINE_SPLIT_BACKWARD_CHECK_H_
#define STAGEHAND_ENGINE_SPLIT_BACKWARD_CHECK_H_

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/stage.h"

namespace stagehand {

// `make` builds the same stage (same parameters) each call. `input`: tokens (the first stage) or
// hidden states; `grad_output`: undefined on the last stage, whose output goes through `loss`.
// `deferred(name)`: whether parameter `name` is a linear layer's weight that the split defers to W
// (its gradient must be untouched after I; every other parameter's may be complete already).
// I + W must accumulate bit for bit what Backward does.
inline void ExpectSplitBackwardIsTheWholeBackward(const std::function<std::unique_ptr<Stage>()>& make,
                                                  const torch::Tensor& input, const torch::Tensor& grad_output,
                                                  const std::function<torch::Tensor(const torch::Tensor&)>& loss,
                                                  const std::function<bool(const std::string&)>& deferred) {
  const bool tokens = input.scalar_type() == torch::kInt64;
  auto run = [&](Stage& stage, const torch::Tensor& x) {
    torch::Tensor out = stage.Forward(x);
    return grad_output.defined() ? out : loss(out);
  };
  std::unique_ptr<Stage> whole = make();
  torch::Tensor x1 = tokens ? input : input.clone().requires_grad_(true);
  whole->Backward(run(*whole, x1), grad_output);

  std::unique_ptr<Stage> split = make();
  torch::Tensor x2 = tokens ? input : input.clone().requires_grad_(true);
  const torch::Tensor out = run(*split, x2);
  const torch::Tensor dx = split->BackwardInput(tokens ? torch::Tensor() : x2, out, grad_output);
  if (tokens) {
    EXPECT_FALSE(dx.defined());
  } else {
    ASSERT_TRUE(dx.defined());
    EXPECT_TRUE(torch::equal(dx, x1.grad())) << "input gradient";
  }
  int untouched = 0;
  for (auto& [name, p] : split->NamedParameters()) {
    if (!deferred(name)) continue;
    EXPECT_FALSE(p.grad().defined()) << name << ": its weight gradient was formed in I, not deferred to W";
    ++untouched;
  }
  EXPECT_GT(untouched, 0) << "no deferred linear weight in the stage";
  split->BackwardWeight(out, grad_output);
  const auto want = whole->NamedParameters();
  const auto got = split->NamedParameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const torch::Tensor &w = want[i].second.grad(), &g = got[i].second.grad();
    ASSERT_EQ(g.defined(), w.defined()) << want[i].first;
    if (w.defined()) {
      EXPECT_TRUE(torch::equal(g, w)) << want[i].first << ": I + W differs from the whole backward";
    }
  }
}

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_SPLIT_BACKWARD_CHECK_H_
