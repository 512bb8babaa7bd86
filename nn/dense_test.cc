// Dense layers (nn.h) against fp32 references and ATen: the residual GEMM (cuBLASLt's and our CUTLASS
// kernel) and its shared algorithm timings, fc + GELU fused and deferred, the lowered inference
// weights, and the attention kernel choice. The *Cuda* cases skip without a GPU.
#include "nn/nn.h"

#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/gemm_residual.h"
#include "kernels/lt_gemm.h"

namespace stagehand {
namespace {

// skip + x W^T + b as one GEMM (DenseImpl::ForwardResidual), cuBLASLt's and our CUTLASS kernel: the fp32
// sum of the bf16 product and the fp32 stream, so it is close to an fp32 reference with the bf16-rounded
// weight (closer than autocast's, which rounds the branch to bf16 first), its gradients are the
// reference's to bf16 rounding, skip's gradient is the output's exactly, and without autograd it gives
// the same output; with kCutlass on an sm_90 GPU that output is our kernel's, bit for bit (not
// cuBLASLt's fallback).
TEST(DenseCuda, ForwardResidual_MatchesFp32ReferenceAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device cuda(torch::kCUDA, 0);
  for (auto [rows, in, out, bias, gemm] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool, ResidualGemm>>{
           {66, 256, 384, true, ResidualGemm::kCublasLt},
           {1, 128, 128, true, ResidualGemm::kCublasLt},
           {1001, 512, 136, false, ResidualGemm::kCublasLt},
           {66, 256, 384, true, ResidualGemm::kCutlass},
           {1, 128, 128, true, ResidualGemm::kCutlass},
           {1001, 512, 136, false, ResidualGemm::kCutlass},
           {1000, 4104, 260, true, ResidualGemm::kCutlass},
           {4096, 2048, 2048, true, ResidualGemm::kCutlass}}) {
    SCOPED_TRACE(absl::StrCat(rows, " x ", in, " -> ", out, bias ? " with bias" : "",
                              gemm == ResidualGemm::kCutlass ? ", CUTLASS" : ", cuBLASLt"));
    torch::manual_seed(3);
    Dense d(in, out, bias, cuda);
    at::Generator gen = LayerGenerator(5, 0, cuda);
    d->InitWeight(0.05, gen);
    if (bias) {
      torch::NoGradGuard no_grad;
      d->bias.normal_(0.0, 0.1);
    }
    const torch::Tensor x = torch::randn({rows, in}, torch::TensorOptions().device(cuda)).to(torch::kBFloat16);
    const torch::Tensor skip0 = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
    const torch::Tensor g = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
    auto run = [&](ResidualGemm kind) {
      d->zero_grad();
      torch::Tensor xi = x.clone().requires_grad_(true), skip = skip0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        CudaBf16Autocast autocast;
        y = d->ForwardResidual(xi, skip, kind);
      }
      EXPECT_EQ(y.scalar_type(), torch::kFloat32);
      y.backward(g);
      std::vector<torch::Tensor> r = {y.detach(), xi.grad().to(torch::kFloat32), skip.grad(), d->weight.grad().clone()};
      if (bias) r.push_back(d->bias.grad().clone());
      return r;
    };
    const std::vector<torch::Tensor> fused = run(gemm), plain = run(ResidualGemm::kOff);
    // The fp32 reference, with the weight rounded to bf16 as the GEMM reads it.
    torch::Tensor xr = x.to(torch::kFloat32).requires_grad_(true);
    torch::Tensor wr = d->weight.detach().to(torch::kBFloat16).to(torch::kFloat32).requires_grad_(true);
    torch::Tensor br = bias ? d->bias.detach().clone().requires_grad_(true) : torch::zeros({out}, xr.options());
    torch::Tensor yr = skip0 + at::matmul(xr, wr.t()) + br;
    yr.backward(g);
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
    };
    EXPECT_LT(rel(fused[0], yr.detach()), 1e-4) << "output against fp32";
    EXPECT_LT(rel(plain[0], yr.detach()), 1e-2) << "autocast's output against fp32";
    EXPECT_LT(rel(fused[1], xr.grad()), 1e-2) << "dx";
    EXPECT_TRUE(torch::equal(fused[2], g)) << "skip's gradient is the output's";
    EXPECT_LT(rel(fused[3], wr.grad()), 1e-2) << "dW";
    if (bias) EXPECT_LT(rel(fused[4], br.grad()), 1e-2) << "db";
    for (size_t i = 1; i < fused.size(); ++i)
      EXPECT_LT(rel(fused[i], plain[i]), 2e-2) << "gradient " << i << " vs autocast's";
    torch::Tensor no_grad_y;
    {
      torch::NoGradGuard no_grad;
      CudaBf16Autocast autocast;
      no_grad_y = d->ForwardResidual(x, skip0, gemm);
    }
    EXPECT_TRUE(torch::equal(no_grad_y, fused[0])) << "inference gives the training forward's output";
    if (gemm == ResidualGemm::kCutlass && GemmResidualAvailable()) {
      const torch::Tensor w = d->weight.detach().to(torch::kBFloat16);
      torch::Tensor direct = torch::empty_like(skip0);
      ASSERT_EQ(GemmResidualFp32(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                                 reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()),
                                 bias ? d->bias.data_ptr<float>() : nullptr, skip0.data_ptr<float>(),
                                 direct.data_ptr<float>(), rows, out, in, at::cuda::getCurrentCUDAStream()),
                cudaSuccess);
      EXPECT_TRUE(torch::equal(no_grad_y, direct)) << "the forward ran our CUTLASS kernel";
    }
  }
}

// Our CUTLASS residual GEMM takes the models' shapes itself (gpt-1.3b's proj and fc2, tinyllama-1.1b's
// down_proj without a bias, and a ragged one) and agrees with cuBLASLt's product to fp32 summation order.
TEST(DenseCuda, CutlassResidualGemm_TakesModelShapesAndAgreesWithCublasLt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  if (!GemmResidualAvailable()) GTEST_SKIP() << "not an sm_90 GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (auto [m, n, k, bias] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {2048, 2048, 2048, true}, {2048, 2048, 8192, true}, {1024, 2048, 5632, false}, {77, 136, 512, true}}) {
    SCOPED_TRACE(absl::StrCat(m, " x ", k, " -> ", n, bias ? " with bias" : ""));
    const torch::Tensor x = torch::randn({m, k}, f32).to(torch::kBFloat16);
    const torch::Tensor w = (torch::randn({n, k}, f32) * 0.02).to(torch::kBFloat16);
    const torch::Tensor b = torch::randn({n}, f32) * 0.1, c = torch::randn({m, n}, f32);
    torch::Tensor ours = torch::full({m, n}, std::nan(""), f32), theirs = torch::empty({m, n}, f32);
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); };
    const float* bias_ptr = bias ? b.data_ptr<float>() : nullptr;
    ASSERT_EQ(GemmResidualFp32(bits(x), bits(w), bias_ptr, c.data_ptr<float>(), ours.data_ptr<float>(), m, n, k,
                               at::cuda::getCurrentCUDAStream()),
              cudaSuccess);
    ASSERT_EQ(LtLinearAddFp32(at::cuda::getCurrentCUDABlasLtHandle(), at::cuda::getCUDABlasLtWorkspace(),
                              at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream(), x.data_ptr(),
                              w.data_ptr(), bias_ptr, c.data_ptr<float>(), theirs.data_ptr<float>(), m, n, k),
              "");
    EXPECT_LT(((ours - theirs).abs().max() / theirs.abs().max()).item<double>(), 1e-5);
  }
}

// Layers of one shape share one algorithm timing (lt_gemm.h): the first of three Dense layers with their own
// biases may time the heuristic's algorithms, the other two reuse its choice, and each still adds its own bias.
TEST(DenseCuda, ForwardResidual_LayersOfOneShapeShareOneTiming) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t rows = 2048, in = 1536, out = 768;  // a shape no other test here uses
  std::vector<Dense> layers;
  for (int i = 0; i < 3; ++i) {
    layers.emplace_back(in, out, true, cuda);
    at::Generator gen = LayerGenerator(7, i, cuda);
    layers.back()->InitWeight(0.05, gen);
    torch::NoGradGuard no_grad;
    layers.back()->bias.fill_(static_cast<double>(i));
  }
  const torch::Tensor x = torch::randn({rows, in}, torch::TensorOptions().device(cuda)).to(torch::kBFloat16);
  const torch::Tensor skip = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> ys;
  {
    CudaBf16Autocast autocast;
    const int64_t before = LtAlgorithmTimings();
    ys.push_back(layers[0]->ForwardResidual(x, skip, ResidualGemm::kCublasLt));
    const int64_t after_first = LtAlgorithmTimings();
    EXPECT_LE(after_first - before, 1);
    for (int i = 1; i < 3; ++i) ys.push_back(layers[i]->ForwardResidual(x, skip, ResidualGemm::kCublasLt));
    EXPECT_EQ(LtAlgorithmTimings(), after_first) << "a second layer of a known shape timed again";
  }
  for (int i = 0; i < 3; ++i) {  // the fp32 reference, outside autocast (which would round its product to bf16)
    torch::Tensor ref =
        skip +
        at::matmul(x.to(torch::kFloat32), layers[i]->weight.detach().to(torch::kBFloat16).to(torch::kFloat32).t()) +
        static_cast<double>(i);
    EXPECT_LT(((ys[i] - ref).abs().max() / ref.abs().max()).item<double>(), 1e-4) << "layer " << i;
  }
}

// gelu(fc(x)) and its gradients (x, weight, bias) by plain autograd over at::linear and at::gelu, in fp32.
struct GeluReference {
  torch::Tensor y, dx, dw, db;
};

GeluReference LinearGeluReference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  const torch::Tensor& dy) {
  torch::Tensor xr = x.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor wr = w.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor br = b.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor y = at::gelu(at::linear(xr, wr, br));
  y.backward(dy.to(torch::kFloat32));
  return {y.detach(), xr.grad(), wr.grad(), br.grad()};
}

double MaxRel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max() /
          b.to(torch::kFloat32).abs().max().clamp_min(1e-12))
      .item<double>();
}

// On the CPU (fp32) ForwardGelu's own autograd function runs (the ATen fallback inside it): the same
// output and gradients as autograd over at::gelu(at::linear), for batched inputs.
TEST(DenseForwardGelu, Cpu_MatchesAutogradOfGeluOfLinear) {
  torch::manual_seed(3);
  Dense fc(24, 40, true);
  at::Generator gen = LayerGenerator(1, 1);
  fc->InitWeight(0.3, gen);
  {
    torch::NoGradGuard no_grad;
    fc->bias.normal_(0.0, 0.5, gen);
  }
  torch::Tensor x = torch::randn({3, 5, 24}).requires_grad_(true);
  torch::Tensor dy = torch::randn({3, 5, 40});
  const GeluReference ref = LinearGeluReference(x, fc->weight, fc->bias, dy);
  torch::Tensor y = fc->ForwardGelu(x, /*fused=*/true);
  ASSERT_EQ(y.sizes(), ref.y.sizes());
  EXPECT_TRUE(torch::allclose(y, ref.y, 1e-5, 1e-6));
  y.backward(dy);
  EXPECT_TRUE(torch::allclose(x.grad(), ref.dx, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->weight.grad(), ref.dw, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->bias.grad(), ref.db, 1e-4, 1e-6));
  // Without grad the same values (the forward-only path), and unfused the same too.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(fc->ForwardGelu(x, true), ref.y, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->ForwardGelu(x, false), ref.y, 1e-5, 1e-6));
}

// Under DeferWeightGrads the weight's gradient goes to the queue as (weight, dh, x) and reaches .grad only
// at Apply; the input's and the bias's arrive at once.
TEST(DenseForwardGelu, Cpu_DeferredWeightGradIsQueuedUntilApply) {
  torch::manual_seed(4);
  Dense fc(16, 32, true);
  at::Generator gen = LayerGenerator(2, 1);
  fc->InitWeight(0.3, gen);
  torch::Tensor x = torch::randn({2, 7, 16}).requires_grad_(true);
  torch::Tensor dy = torch::randn({2, 7, 32});
  const GeluReference ref = LinearGeluReference(x, fc->weight, fc->bias, dy);
  WeightGradQueue queue;
  {
    DeferWeightGrads route(&queue);
    fc->ForwardGelu(x, true).backward(dy);
  }
  EXPECT_FALSE(fc->weight.grad().defined());
  ASSERT_EQ(queue.size(), 1u);
  EXPECT_TRUE(torch::allclose(x.grad(), ref.dx, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->bias.grad(), ref.db, 1e-4, 1e-6));
  queue.Apply();
  ASSERT_TRUE(fc->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(fc->weight.grad(), ref.dw, 1e-4, 1e-6));
}

// The fused forward and backward under bf16 autocast against fp32 autograd of linear + gelu, on
// gpt-1.3b's training shape (8 x 1024 tokens, 2048 -> 8192) and odd ones (rows not a multiple of a tile;
// a width the kernels do not take, which falls back): the fused path's error is no worse than the ATen
// bf16 path's (fused_gelu=false) and small in itself.
TEST(DenseForwardGeluCuda, RealAndOddShapes_MatchFp32AutogradAsWellAsAten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  struct Shape {
    int64_t b, s, in, out;
  };
  for (const Shape& sh :
       {Shape{8, 1024, 2048, 8192}, Shape{3, 37, 72, 200}, Shape{1, 5, 64, 104}, Shape{2, 9, 36, 50}}) {
    SCOPED_TRACE(absl::StrCat(sh.b, "x", sh.s, " ", sh.in, "->", sh.out));
    torch::manual_seed(5);
    Dense fc(sh.in, sh.out, true, torch::kCUDA);
    at::Generator gen = LayerGenerator(3, 1, torch::kCUDA);
    fc->InitWeight(0.02, gen);
    {
      torch::NoGradGuard no_grad;
      fc->bias.normal_(0.0, 0.5, gen);
    }
    torch::Tensor x0 = torch::randn({sh.b, sh.s, sh.in}, torch::kCUDA).to(torch::kBFloat16).to(torch::kFloat32);
    torch::Tensor dy = (torch::randn({sh.b, sh.s, sh.out}, torch::kCUDA) * 1e-2).to(torch::kBFloat16);
    const GeluReference ref =
        LinearGeluReference(x0, fc->weight.to(torch::kBFloat16), fc->bias.to(torch::kBFloat16), dy);
    auto run = [&](bool fused) {
      fc->weight.mutable_grad().reset();
      fc->bias.mutable_grad().reset();
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        CudaBf16Autocast autocast;
        y = fc->ForwardGelu(x, fused);
      }
      EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
      y.backward(dy);
      torch::Tensor y_nograd;
      {
        torch::NoGradGuard no_grad;
        CudaBf16Autocast autocast;
        y_nograd = fc->ForwardGelu(x0, fused);
      }
      // The forward-only kernel (no pre-activation output) has another cluster shape: the same sums, a
      // bf16 rounding apart at most.
      EXPECT_TRUE(torch::allclose(y_nograd, y.detach(), 8e-3, 1e-3)) << "the forward-only path's output";
      return GeluReference{y.detach(), x.grad(), fc->weight.grad().clone(), fc->bias.grad().clone()};
    };
    const GeluReference fused = run(true), aten = run(false);
    const double tol[] = {1e-2, 2e-2, 2e-2, 2e-2};
    const torch::Tensor* f[] = {&fused.y, &fused.dx, &fused.dw, &fused.db};
    const torch::Tensor* a[] = {&aten.y, &aten.dx, &aten.dw, &aten.db};
    const torch::Tensor* r[] = {&ref.y, &ref.dx, &ref.dw, &ref.db};
    const char* names[] = {"y", "dx", "dweight", "dbias"};
    for (int i = 0; i < 4; ++i) {
      const double ef = MaxRel(*f[i], *r[i]), ea = MaxRel(*a[i], *r[i]);
      EXPECT_LT(ef, tol[i]) << names[i] << " (ATen's bf16 path: " << ea << ")";
      EXPECT_LE(ef, 2 * ea + 1e-3) << names[i];
    }
  }
}

// When an inference stage keeps only bf16 weights: inference on CUDA under autocast, no saved
// parameters, the option not "false".
TEST(LowersDenseWeights, OnlyForInferenceUnderAutocastOnCuda) {
  JobSpec job;
  job.mutable_pipeline()->set_inference(true);
  const torch::Device cuda(torch::kCUDA, 0), cpu(torch::kCPU);
  EXPECT_TRUE(LowersDenseWeights(job, cuda, true));
  EXPECT_FALSE(LowersDenseWeights(job, cpu, true));
  EXPECT_FALSE(LowersDenseWeights(job, cuda, false));
  JobSpec saves = job;
  saves.set_save_params(true);
  EXPECT_FALSE(LowersDenseWeights(saves, cuda, true));
  JobSpec off = job;
  (*off.mutable_model_spec()->mutable_options())["inference_bf16_weights"] = "false";
  EXPECT_FALSE(LowersDenseWeights(off, cuda, true));
  JobSpec training = job;
  training.mutable_pipeline()->set_inference(false);
  EXPECT_FALSE(LowersDenseWeights(training, cuda, true));
}

// "flash" keeps cuDNN's attention out even where LibTorch would put it first (Hopper): it is switched
// off; any other choice puts LibTorch's setting back. No GPU needed: the switch is LibTorch's global.
TEST(SelectAttentionKernel, Flash_SwitchesCudnnOffAndTheOthersBackOn) {
  const bool initially = at::globalContext().userEnabledCuDNNSDP();
  ASSERT_TRUE(SelectAttentionKernel("flash").ok());
  EXPECT_FALSE(at::globalContext().userEnabledCuDNNSDP());
  ASSERT_TRUE(SelectAttentionKernel("cudnn").ok());
  EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), initially);
  ASSERT_TRUE(SelectAttentionKernel("flash").ok());
  ASSERT_TRUE(SelectAttentionKernel("torch").ok());
  EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), initially);
  EXPECT_FALSE(SelectAttentionKernel("fa3").ok());
}

}  // namespace
}  // namespace stagehand
