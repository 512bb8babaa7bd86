// The bias-gradient kernels (bias_grad_kernels.h, through nn.h's ColumnSums, CastWithColumnSums and
// AssembleHeadsGrad) against ATen, and Dense::ForwardHeads's gradients against autograd of the unfused
// ops. The *Cuda* cases skip without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "kernels/bias_grad_kernels.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

// q, k, v as the unfused path makes them: the linear's output viewed and permuted.
std::vector<torch::Tensor> UnfusedHeads(Dense& dense, const torch::Tensor& x, int64_t heads) {
  const torch::Tensor y = dense(x);
  return y.view({y.size(0), y.size(1), 3, heads, -1}).permute({2, 0, 3, 1, 4}).unbind(0);
}

// {x.grad, weight.grad, bias.grad} of sum(q a + k b + v c) (`use_k` false: k unused, its gradient undefined).
std::vector<torch::Tensor> HeadsGrads(bool fused, bool use_k, bool defer) {
  torch::manual_seed(5);
  Dense dense(16, 48, true);
  {
    torch::NoGradGuard no_grad;
    dense->weight.normal_();
    dense->bias.normal_();
  }
  torch::Tensor x = torch::randn({2, 5, 16}, torch::requires_grad());
  torch::Tensor a = torch::randn({2, 2, 5, 8}), b = torch::randn({2, 2, 5, 8}), c = torch::randn({2, 2, 5, 8});
  const std::vector<torch::Tensor> qkv = fused ? dense->ForwardHeads(x, 2) : UnfusedHeads(dense, x, 2);
  EXPECT_EQ(qkv.size(), 3u);
  torch::Tensor loss = (qkv[0] * a).sum() + (qkv[2] * c).sum();
  if (use_k) loss = loss + (qkv[1] * b).sum();
  WeightGradQueue queue;
  {
    std::optional<DeferWeightGrads> route;
    if (defer) route.emplace(&queue);
    loss.backward();
  }
  if (defer) {
    EXPECT_EQ(queue.size(), 1u);
    EXPECT_FALSE(dense->weight.grad().defined());
    queue.Apply();
  }
  return {x.grad(), dense->weight.grad(), dense->bias.grad()};
}

TEST(ForwardHeads, Cpu_GradientsMatchAutogradOfUnfusedOps) {
  for (bool use_k : {true, false}) {
    const std::vector<torch::Tensor> fused = HeadsGrads(true, use_k, false), plain = HeadsGrads(false, use_k, false);
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].defined()) << i;
      EXPECT_TRUE(torch::allclose(fused[i], plain[i], 1e-5, 1e-6)) << "use_k " << use_k << " grad " << i;
    }
  }
}

TEST(ForwardHeads, DeferredWeightGrads_QueuedAndSameAfterApply) {
  const std::vector<torch::Tensor> deferred = HeadsGrads(true, true, true), plain = HeadsGrads(false, true, false);
  for (size_t i = 0; i < deferred.size(); ++i) EXPECT_TRUE(torch::allclose(deferred[i], plain[i], 1e-5, 1e-6)) << i;
}

TEST(ForwardHeads, NoGrad_ViewsOfForward) {
  torch::manual_seed(4);
  Dense dense(16, 48, true);
  torch::NoGradGuard no_grad;
  dense->weight.normal_();  // drawn: Dense leaves the weight to its owner (torch::empty, possibly NaN bits)
  torch::Tensor x = torch::randn({2, 5, 16});
  const std::vector<torch::Tensor> fused = dense->ForwardHeads(x, 2), plain = UnfusedHeads(dense, x, 2);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(fused[i], plain[i])) << i;
}

TEST(ForwardHeads, WrongWidth_Throws) {
  Dense dense(16, 40, true);
  EXPECT_THROW(dense->ForwardHeads(torch::randn({2, 5, 16}), 3), c10::Error);
}

// The LibTorch wrappers on the CPU are ATen's cast and sums.
TEST(ColumnSums, Cpu_AreAtens) {
  torch::Tensor g = torch::randn({7, 24});
  auto [y, sums] = CastWithColumnSums(g);
  EXPECT_TRUE(torch::equal(y, g.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(sums, y.sum(0, false, torch::kFloat32)));
  EXPECT_TRUE(torch::equal(ColumnSums(y), y.sum(0, false, torch::kFloat32)));
}

bool Cuda() { return torch::cuda::is_available(); }

// Sums of bf16 values in fp32 in another order than ATen's: close to the double sums, relative to the
// sum of magnitudes.
void ExpectSumsClose(const torch::Tensor& sums, const torch::Tensor& x, const std::string& what) {
  const torch::Tensor exact = x.to(torch::kFloat64).sum(0);
  const torch::Tensor scale = x.to(torch::kFloat64).abs().sum(0) + 1e-30;
  const double worst = ((sums.to(torch::kFloat64) - exact).abs() / scale).max().item<double>();
  EXPECT_LT(worst, 1e-5) << what;
}

const std::vector<std::pair<int64_t, int64_t>>& Shapes() {
  static const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {8192, 6144},
      {8192, 2048},
      {8192, 8192},
      {1, 6144},
      {1001, 2048},
      {1001, 8192},
      {1, 8},
      {1001, 24},
      {33, 264},
      // rows that leave the last block's row chunk, and its batch of loads, part-full
      {8191, 2048},
      {8197, 6144},
      {37, 2056}};
  return shapes;
}

TEST(ColumnSumsCuda, Bf16_MatchesAtenAndIsDeterministic) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  for (auto [rows, cols] : Shapes()) {
    const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
    torch::Tensor x = torch::randn({rows, cols}, torch::kCUDA).to(torch::kBFloat16);
    const torch::Tensor a = ColumnSums(x), b = ColumnSums(x);
    ASSERT_EQ(a.scalar_type(), torch::kFloat32);
    ASSERT_EQ(a.sizes(), (std::vector<int64_t>{cols}));
    EXPECT_TRUE(torch::equal(a, b)) << what;
    ExpectSumsClose(a, x, what);
    EXPECT_TRUE(torch::allclose(a, x.sum(0, false, torch::kFloat32), 1e-3, 1e-3)) << what;
  }
}

TEST(ColumnSumsCuda, CastWithColumnSums_CopyIsAtensCastSumsClose) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  for (auto [rows, cols] : Shapes()) {
    const std::string what = std::to_string(rows) + " x " + std::to_string(cols);
    torch::Tensor g = torch::randn({rows, cols}, torch::kCUDA) * 1e-3;
    auto [y, sums] = CastWithColumnSums(g);
    ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(torch::equal(y, g.to(torch::kBFloat16))) << what;
    ExpectSumsClose(sums, y, what);
    auto [y2, sums2] = CastWithColumnSums(g);
    EXPECT_TRUE(torch::equal(sums, sums2)) << what;
  }
}

TEST(ColumnSumsCuda, LayoutsTheKernelsRefuse_FallBackToAten) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  torch::Tensor odd = torch::randn({1001, 100}, torch::kCUDA).to(torch::kBFloat16);  // 100 columns: not 8k
  EXPECT_TRUE(torch::equal(ColumnSums(odd), odd.sum(0, false, torch::kFloat32)));
  torch::Tensor strided = torch::randn({64, 2048}, torch::kCUDA).t();  // not contiguous
  auto [y, sums] = CastWithColumnSums(strided);
  EXPECT_TRUE(torch::equal(y, strided.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(sums, y.sum(0, false, torch::kFloat32)));
  EXPECT_FALSE(ColumnSumsSupports(100));
  EXPECT_TRUE(ColumnSumsSupports(6144));
}

// dq, dk, dv in the layouts they come in: [B, NH, S, D] contiguous, [B, S, NH, D] transposed, views of
// one [B, S, 3, NH, D] tensor; the kernel's dqkv equals the copies exactly, its sums are close.
TEST(AssembleHeadsGradCuda, Layouts_EqualCopiesAndSumsClose) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  struct Case {
    int64_t b, heads, s, d;
  };
  const auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  for (const Case& c : {Case{8, 16, 1024, 128}, Case{1, 16, 1, 128}, Case{3, 4, 37, 16}, Case{1, 2, 1001, 8},
                        Case{3, 16, 1001, 128}, Case{2, 3, 4099, 24}}) {
    std::vector<std::vector<torch::Tensor>> layouts;
    auto r = [&](std::vector<int64_t> shape) { return torch::randn(shape, opt); };
    layouts.push_back({r({c.b, c.heads, c.s, c.d}), r({c.b, c.heads, c.s, c.d}), r({c.b, c.heads, c.s, c.d})});
    layouts.push_back({r({c.b, c.s, c.heads, c.d}).transpose(1, 2), r({c.b, c.s, c.heads, c.d}).transpose(1, 2),
                       r({c.b, c.s, c.heads, c.d}).transpose(1, 2)});
    const std::vector<torch::Tensor> packed = r({c.b, c.s, 3, c.heads, c.d}).permute({2, 0, 3, 1, 4}).unbind(0);
    layouts.push_back(packed);
    for (size_t l = 0; l < layouts.size(); ++l) {
      const auto& g = layouts[l];
      const std::string what = std::to_string(c.b * c.s) + " rows, " + std::to_string(c.heads) + " x " +
                               std::to_string(c.d) + ", layout " + std::to_string(l);
      auto [dqkv, sums] = AssembleHeadsGrad(g[0], g[1], g[2], true);
      torch::Tensor expected = torch::stack({g[0], g[1], g[2]}, 0).permute({1, 3, 0, 2, 4}).reshape({c.b, c.s, -1});
      ASSERT_EQ(dqkv.sizes(), expected.sizes()) << what;
      EXPECT_TRUE(torch::equal(dqkv, expected)) << what;
      ExpectSumsClose(sums, expected.reshape({c.b * c.s, -1}), what);
      auto [dqkv2, sums2] = AssembleHeadsGrad(g[0], g[1], g[2], true);
      EXPECT_TRUE(torch::equal(sums, sums2)) << "deterministic: " << what;
    }
  }
}

TEST(AssembleHeadsGradCuda, UndefinedGradient_ZerosItsSlot) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  const auto opt = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::Tensor dq = torch::randn({2, 4, 8, 16}, opt), dv = torch::randn({2, 4, 8, 16}, opt);
  auto [dqkv, sums] = AssembleHeadsGrad(dq, torch::Tensor(), dv, true);
  torch::Tensor expected =
      torch::stack({dq, torch::zeros_like(dq), dv}, 0).permute({1, 3, 0, 2, 4}).reshape({2, 8, -1});
  EXPECT_TRUE(torch::equal(dqkv, expected));
  ExpectSumsClose(sums, expected.reshape({16, -1}), "undefined dk");
}

// The real path: bf16 autocast, cuDNN's (or the first available) SDPA backward giving dq, dk, dv; the
// gradients of x, the weight and the bias against the unfused linear-and-split.
TEST(ForwardHeadsCuda, Gpt13bShapesUnderAutocast_MatchUnfused) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  ASSERT_TRUE(SelectAttentionKernel("cudnn").ok());
  const int64_t b = 8, s = 1024, hidden = 2048, heads = 16;
  auto run = [&](bool fused) {
    torch::manual_seed(11);
    Dense dense(hidden, 3 * hidden, true, torch::kCUDA);
    {
      torch::NoGradGuard no_grad;
      dense->weight.normal_(0.0, 0.02);
      dense->bias.normal_(0.0, 0.02);
    }
    torch::Tensor x = torch::randn({b, s, hidden}, torch::kCUDA).requires_grad_();
    torch::Tensor gy = torch::randn({b, s, hidden}, torch::kCUDA);
    {
      CudaBf16Autocast autocast;
      const std::vector<torch::Tensor> qkv = fused ? dense->ForwardHeads(x, heads) : UnfusedHeads(dense, x, heads);
      torch::Tensor att = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, true);
      torch::Tensor out = att.transpose(1, 2).reshape({b, s, hidden});
      if (fused) {
        const auto g = torch::autograd::grad({out}, {qkv[0], qkv[1], qkv[2]}, {gy.to(out.scalar_type())}, true);
        std::cout << "SDPA backward's dq: sizes " << g[0].sizes() << " strides " << g[0].strides() << "\n";
      }
      out.backward(gy.to(out.scalar_type()));
    }
    return std::vector<torch::Tensor>{x.grad(), dense->weight.grad(), dense->bias.grad()};
  };
  const std::vector<torch::Tensor> fused = run(true), plain = run(false);
  const char* names[] = {"x", "weight", "bias"};
  for (size_t i = 0; i < fused.size(); ++i) {
    ASSERT_TRUE(fused[i].defined()) << names[i];
    const double scale = plain[i].abs().max().item<double>();
    const double worst = (fused[i] - plain[i]).abs().max().item<double>() / scale;
    EXPECT_LT(worst, 1e-2) << names[i];
  }
}

// ColumnSums and CastWithColumnSums with `into`: the sums go into the parameter's .grad (made when
// missing, added to when there), and none come back.
TEST(GradSumsCuda, IntoWritesDotGradAndReturnsNone) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  torch::manual_seed(17);
  const torch::Tensor x = torch::randn({300, 64}, torch::kCUDA);
  torch::Tensor bias = torch::zeros({64}, torch::kCUDA).requires_grad_(true);
  const torch::Tensor want = x.to(torch::kBFloat16).sum(0, false, torch::kFloat32);
  EXPECT_FALSE(ColumnSums(x.to(torch::kBFloat16), &bias).defined()) << "no sums returned";
  ASSERT_TRUE(bias.grad().defined()) << ".grad made";
  EXPECT_TRUE(torch::allclose(bias.grad(), want, 1e-5, 1e-4));
  auto [y, sums] = CastWithColumnSums(x, &bias);
  EXPECT_FALSE(sums.defined());
  EXPECT_TRUE(torch::equal(y, x.to(torch::kBFloat16)));
  EXPECT_TRUE(torch::allclose(bias.grad(), 2 * want, 1e-5, 1e-4)) << "added to the .grad there";
  // Not a leaf that needs a gradient: the sums come back.
  torch::Tensor frozen = torch::zeros({64}, torch::kCUDA);
  EXPECT_TRUE(ColumnSums(x.to(torch::kBFloat16), &frozen).defined());
  EXPECT_FALSE(frozen.grad().defined());
}

// The fused backward adds the bias, LayerNorm weight and bias gradients into .grad itself (no
// gradient returned to autograd): over two backward passes (the second accumulating, the first from no
// .grad and from a zeroed one) the gradients equal the unfused path's, where autograd adds them.
TEST(GradSumsCuda, IntoDotGradAccumulate_MatchUnfused) {
  if (!Cuda()) GTEST_SKIP() << "no GPU";
  const int64_t b = 4, s = 64, hidden = 256;
  for (bool start_zeroed : {false, true}) {
    auto run = [&](bool fused) {
      torch::manual_seed(13);
      Dense qkv(hidden, 3 * hidden, true, torch::kCUDA), proj(hidden, hidden, true, torch::kCUDA),
          fc1(hidden, 4 * hidden, true, torch::kCUDA), fc2(4 * hidden, hidden, true, torch::kCUDA);
      torch::nn::LayerNorm ln(torch::nn::LayerNormOptions({hidden}));
      ln->to(torch::kCUDA);
      std::vector<Dense*> dense = {&qkv, &proj, &fc1, &fc2};
      {
        torch::NoGradGuard no_grad;
        for (Dense* d : dense) {
          (*d)->weight.normal_(0.0, 0.02);
          (*d)->bias.normal_(0.0, 0.02);
          (*d)->set_fused_bias_grad(fused);
        }
        ln->weight.normal_(1.0, 0.1);
        ln->bias.normal_(0.0, 0.1);
      }
      if (start_zeroed) {
        for (Dense* d : dense) (*d)->bias.mutable_grad() = torch::zeros_like((*d)->bias);
        ln->weight.mutable_grad() = torch::zeros_like(ln->weight);
        ln->bias.mutable_grad() = torch::zeros_like(ln->bias);
      }
      for (int pass = 0; pass < 2; ++pass) {
        torch::Tensor x = torch::randn({b, s, hidden}, torch::kCUDA).requires_grad_();
        CudaBf16Autocast autocast;
        auto [normed, skip] = NormForGemmWithSkip(ln, x, true, fused, fused);
        const std::vector<torch::Tensor> h = fused ? qkv->ForwardHeads(normed, 4) : UnfusedHeads(qkv, normed, 4);
        torch::Tensor att = at::scaled_dot_product_attention(h[0], h[1], h[2], {}, 0.0, true);
        torch::Tensor y =
            proj->ForwardResidual(att.transpose(1, 2).reshape({b, s, hidden}), skip, ResidualGemm::kCutlass);
        y = fc2->ForwardResidual(fc1->ForwardGelu(y.to(torch::kBFloat16), fused, fused), y, ResidualGemm::kCutlass);
        y.sum().backward();
      }
      std::vector<torch::Tensor> grads;
      for (Dense* d : dense) grads.push_back((*d)->bias.grad());
      grads.push_back(ln->weight.grad());
      grads.push_back(ln->bias.grad());
      return grads;
    };
    const std::vector<torch::Tensor> fused = run(true), plain = run(false);
    const char* names[] = {"qkv.bias", "proj.bias", "fc1.bias", "fc2.bias", "ln.weight", "ln.bias"};
    for (size_t i = 0; i < fused.size(); ++i) {
      ASSERT_TRUE(fused[i].defined() && plain[i].defined()) << names[i];
      const double scale = plain[i].abs().max().item<double>();
      const double worst = (fused[i] - plain[i]).abs().max().item<double>() / scale;
      EXPECT_LT(worst, 2e-2) << names[i] << (start_zeroed ? ", from zeroed .grad" : ", from no .grad");
    }
  }
}

}  // namespace
}  // namespace stagehand
