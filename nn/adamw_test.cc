// FusedAdamW's own kernel (adamw_kernels.h) against ATen's _fused_adamw_ (FusedAdamW with own_kernel
// false) over three steps: parameters and moments within a few float ulps (on an H200: 1-3
// ulps of the moments, 1 of the parameters; not bit for bit), the bf16 copies it writes for linear layers (equal to
// a fresh cast, and left current for the next forward), and the gradients it zeroes. The *Cuda* cases
// skip without a GPU; on CPU both run ATen's. And FusedAdamW against torch::optim::AdamW over five
// steps (a parameter without a gradient skipped), and its in-place zeroing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

#include "nn/nn.h"

namespace stagehand {
namespace {

struct Model {
  Dense a{nullptr}, b{nullptr};
  torch::Tensor odd;  // a parameter no linear layer holds: no bf16 copy; numel not a multiple of 4
  std::vector<torch::Tensor> Params() const { return {a->weight, a->bias, b->weight, b->bias, odd}; }
};

Model Make(const torch::Device& device) {
  torch::manual_seed(3);
  Model m;
  m.a = Dense(300, 700, true, device);  // 210000 weights: several of the kernel's 65536-element slices
  m.b = Dense(64, 6, true, device);
  m.odd = torch::randn({1001}, torch::TensorOptions().device(device)).requires_grad_(true);
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& p : m.Params()) p.normal_(0.0, 0.5);
  return m;
}

// Three steps with the same gradients; returns the parameters and moments after them.
std::vector<torch::Tensor> Steps(const torch::Device& device, bool own, bool zero_grads) {
  Model m = Make(device);
  FusedAdamW opt(m.Params(), 1e-3, 0.9, 0.95, 1e-8, 0.1, own);
  if (device.is_cuda()) {  // the linear layers' bf16 copies exist, as after a forward under autocast
    m.a->RefreshCasts(at::kBFloat16);
    m.b->RefreshCasts(at::kBFloat16);
  }
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + step);
    for (torch::Tensor& p : m.Params()) {
      // Step 0 makes the gradients; later steps write them in place, as the CUDA-graph path does (the
      // kernel's table of addresses is then reused), except that step 2 follows a restored state.
      torch::Tensor g = torch::randn_like(p);
      if (step == 0 || !p.grad().defined()) {
        p.mutable_grad() = g;
      } else {
        p.mutable_grad().copy_(g);
      }
    }
    if (step == 2) {  // a checkpoint's restore between steps: new moment tensors, the table rebuilt
      for (size_t i = 0; i < opt.size(); ++i) opt.SetState(i, opt.State(i));
    }
    opt.Step(zero_grads);
    if (zero_grads && own && device.is_cuda()) {
      for (const torch::Tensor& p : m.Params()) EXPECT_EQ(p.grad().abs().max().item<float>(), 0.f) << "zeroed";
    }
    opt.ZeroGrad(false);
    for (const torch::Tensor& p : m.Params()) EXPECT_EQ(p.grad().abs().max().item<float>(), 0.f);
  }
  std::vector<torch::Tensor> out;
  for (size_t i = 0; i < opt.size(); ++i) {
    out.push_back(m.Params()[i].detach().clone());
    out.push_back(opt.State(i).exp_avg.clone());
    out.push_back(opt.State(i).exp_avg_sq.clone());
  }
  if (own && device.is_cuda()) {
    // The copies the kernel wrote are a fresh cast's, and current: the next refresh has nothing to do.
    for (Dense* d : {&m.a, &m.b}) {
      for (const torch::Tensor& p : {(*d)->weight, (*d)->bias}) {
        CastCache* cache = CastCopyOf(p);
        EXPECT_NE(cache, nullptr);
        if (cache == nullptr) continue;
        EXPECT_EQ(cache->StaleBuffer(p, at::kBFloat16), nullptr) << "the optimizer marked its copy fresh";
        EXPECT_TRUE(torch::equal(cache->Get(p, at::kBFloat16), p.detach().to(at::kBFloat16)));
      }
    }
  }
  return out;
}

TEST(FusedAdamW, CpuOwnKernelFlagRunsAten) {
  const std::vector<torch::Tensor> own = Steps(torch::kCPU, true, true), aten = Steps(torch::kCPU, false, false);
  for (size_t i = 0; i < own.size(); ++i) EXPECT_TRUE(torch::equal(own[i], aten[i])) << i;
}

TEST(FusedAdamWCuda, OwnKernelMatchesAtensFusedAdamW) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool zero : {false, true}) {
    const std::vector<torch::Tensor> own = Steps(torch::kCUDA, true, zero), aten = Steps(torch::kCUDA, false, false);
    for (size_t i = 0; i < own.size(); ++i) {
      const double worst = (own[i] - aten[i]).abs().max().item<double>();
      const double scale = aten[i].abs().max().item<double>();
      EXPECT_LE(worst, 1e-6 * scale) << "tensor " << i << " (parameter " << i / 3 << ", "
                                     << "pmv"[i % 3] << ")";
      if (i % 3 == 0) std::cout << "parameter " << i / 3 << ": worst difference " << worst << "\n";
    }
  }
}

// FusedAdamW against torch::optim::AdamW, with the same hyperparameters, and its in-place zeroing.

std::vector<torch::Tensor> RandomParams(torch::Device device) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params;
  for (auto shape : {std::vector<int64_t>{7, 5}, {13}, {3, 4, 2}}) {
    params.push_back(torch::randn(shape).to(device).requires_grad_());
  }
  return params;
}

void ExpectFusedAdamWMatchesTorch(torch::Device device) {
  std::vector<torch::Tensor> fused = RandomParams(device), reference = RandomParams(torch::kCPU);
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  FusedAdamW ours(fused, lr, beta1, beta2, eps, weight_decay);
  torch::optim::AdamW theirs(reference,
                             torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
  torch::manual_seed(4);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < fused.size(); ++i) {
      // Every other step the last parameter has no gradient: both optimizers skip it.
      if (step % 2 == 1 && i + 1 == fused.size()) continue;
      torch::Tensor g = torch::randn(fused[i].sizes());
      fused[i].mutable_grad() = g.to(device);
      reference[i].mutable_grad() = g.clone();
    }
    ours.Step();
    theirs.step();
    ours.ZeroGrad();
    theirs.zero_grad();
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_FALSE(fused[i].grad().defined());
      const double diff = (fused[i].detach().cpu() - reference[i].detach()).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << "parameter " << i << " after step " << step;
    }
  }
  EXPECT_FALSE(torch::equal(fused[0].detach().cpu(), RandomParams(torch::kCPU)[0].detach()));  // it moved
}

TEST(FusedAdamW, FewSteps_MatchesTorchAdamW) { ExpectFusedAdamWMatchesTorch(torch::kCPU); }

// Zeroing in place (what captured CUDA graphs need): the same gradient tensors, zeroed, and zeros for a
// parameter that had none; the default sets them to None.
TEST(FusedAdamW, ZeroGradInPlace_KeepsGradientTensors) {
  torch::Tensor a = torch::ones({3}).requires_grad_(true), b = torch::ones({2, 2}).requires_grad_(true);
  a.mutable_grad() = torch::full({3}, 5.0);
  const void* address = a.grad().data_ptr();
  FusedAdamW optimizer({a, b});
  optimizer.ZeroGrad(/*set_to_none=*/false);
  EXPECT_EQ(a.grad().data_ptr(), address);
  EXPECT_TRUE(torch::equal(a.grad(), torch::zeros({3})));
  ASSERT_TRUE(b.grad().defined());
  EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({2, 2})));
  optimizer.ZeroGrad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

TEST(FusedAdamWCuda, FewSteps_MatchesTorchAdamWOnCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  ExpectFusedAdamWMatchesTorch(torch::kCUDA);
}

}  // namespace
}  // namespace stagehand
