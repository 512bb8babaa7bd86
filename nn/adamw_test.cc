// FusedAdamW's own kernel (adamw_kernels.h) against ATen's _fused_adamw_ (FusedAdamW with own_kernel
// false) over three steps: parameters and moments within a few float ulps (on an H200: 1-3
// ulps of the moments, 1 of the parameters; not bit for bit), the bf16 copies it writes for linear layers (equal to
// a fresh cast, and left current for the next forward), and the gradients it zeroes. The *Cuda* cases
// skip without a GPU; on CPU both run ATen's.
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
      EXPECT_LE(worst, 1e-6 * scale) << "tensor " << i << " (parameter " << i / 3 << ", " << "pmv"[i % 3] << ")";
      if (i % 3 == 0) std::cout << "parameter " << i / 3 << ": worst difference " << worst << "\n";
    }
  }
}

}  // namespace
}  // namespace stagehand
