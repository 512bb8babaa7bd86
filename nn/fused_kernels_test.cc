// Our fused kernels (kernels/) against ATen: the LayerNorm to bf16, the norms' backward, and the
// CUTLASS fc1 + GELU GEMM with its fused GELU backward. GPU only: each case skips without one.
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <iostream>
#include <vector>

#include "kernels/fused_backward_kernels.h"
#include "kernels/fused_kernels.h"
#include "kernels/gelu_kernels.h"
#include "kernels/gemm_gelu.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

// The fused kernel writes what autocast computes for a LayerNorm feeding a GEMM (ATen's fp32
// LayerNorm, then a cast to bf16): every element within a bf16 ulp, the mean and rstd ATen's backward
// takes, rows that do not fill a block, and a refusal of row lengths it does not take.
TEST(FusedKernelsCuda, LayerNormToBf16_MatchesLayerNormThenCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t cols : {128, 2048, 4096}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 1001;
    torch::Tensor x = torch::randn({rows, cols}, f32) * 3 + 1;
    torch::Tensor gamma = torch::randn({cols}, f32), beta = torch::randn({cols}, f32);
    torch::Tensor y = torch::empty({rows, cols}, f32.dtype(torch::kBFloat16));
    torch::Tensor mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
    ASSERT_EQ(LayerNormToBf16(x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                              reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), mean.data_ptr<float>(),
                              rstd.data_ptr<float>(), rows, cols, 1e-5f, at::cuda::getCurrentCUDAStream()),
              cudaSuccess);
    auto [ref, ref_mean, ref_rstd] = at::native_layer_norm(x, {cols}, gamma, beta, 1e-5);
    const torch::Tensor expected = ref.to(torch::kBFloat16).to(torch::kFloat32), got = y.to(torch::kFloat32);
    // A bf16 ulp is at most 2^-7 of the value: the fp32 results may round to neighbouring bf16 values.
    const torch::Tensor off = (got - expected).abs() > expected.abs() * std::ldexp(1.0, -7) + 1e-6;
    EXPECT_EQ(off.sum().item<int64_t>(), 0);
    EXPECT_LT((got - expected).ne(0).to(torch::kFloat32).mean().item<double>(), 0.01);
    EXPECT_TRUE(torch::allclose(mean, ref_mean.view({rows}), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(rstd, ref_rstd.view({rows}), 1e-5, 1e-6));
  }
  EXPECT_FALSE(LayerNormToBf16Supports(100));
  EXPECT_EQ(LayerNormToBf16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, 1e-5f, nullptr),
            cudaErrorInvalidValue);
  // A row start that is not 16-byte aligned (a view one element in) is refused, not read out of line.
  torch::Tensor x = torch::randn({4 * 128 + 1}, f32), g = torch::ones({128}, f32), b = torch::zeros({128}, f32);
  torch::Tensor y = torch::empty({4, 128}, f32.dtype(torch::kBFloat16)), stats = torch::empty({8}, f32);
  EXPECT_EQ(LayerNormToBf16(x.data_ptr<float>() + 1, g.data_ptr<float>(), b.data_ptr<float>(),
                            reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), stats.data_ptr<float>(),
                            stats.data_ptr<float>() + 4, 4, 128, 1e-5f, at::cuda::getCurrentCUDAStream()),
            cudaErrorInvalidValue);
}

// The fused norm backward (LayerNorm and RMSNorm) from a bf16 gradient against ATen's backward of the
// upcast gradient (LayerNorm) and the formula in double (RMSNorm): fp32 arithmetic in another order,
// so within 1e-4 relative; rows that do not fill a block or the grid; row lengths it refuses.
TEST(FusedKernelsCuda, NormBackward_MatchesAten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm()).item<double>();
  };
  // Every row-length shape of the kernel (threads per row 16 .. 512: rows per block 64 .. 2), rows that
  // fill a block, leave one part-full, outnumber the blocks, and leave the last sweep part-full.
  for (int64_t cols : {128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096}) {
    for (int64_t rows : {1, 3, 1001, 8192, 8197}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      torch::Tensor x = torch::randn({rows, cols}, f32) * 3 + 1;
      torch::Tensor gamma = torch::randn({cols}, f32), beta = torch::randn({cols}, f32);
      torch::Tensor dy = torch::randn({rows, cols}, f32).to(torch::kBFloat16);
      auto [y, mean, rstd] = at::native_layer_norm(x, {cols}, gamma, beta, 1e-5);
      std::vector<torch::Tensor> got = NormBackwardFromBf16(dy, x, gamma, mean, rstd);
      ASSERT_EQ(got.size(), 3u);
      auto [dx, dgamma, dbeta] = at::native_layer_norm_backward(dy.to(torch::kFloat32), x, {cols}, mean, rstd, gamma,
                                                                beta, {true, true, true});
      EXPECT_LT(rel(got[0], dx), 1e-4);
      EXPECT_LT(rel(got[1], dgamma), 1e-4);
      EXPECT_LT(rel(got[2], dbeta), 1e-4);
      EXPECT_TRUE(got[0].isfinite().all().item<bool>());
      // The residual stream's gradient added in the same pass.
      const torch::Tensor skip = torch::randn({rows, cols}, f32);
      std::vector<torch::Tensor> with_skip = NormBackwardFromBf16(dy, x, gamma, mean, rstd, skip);
      ASSERT_EQ(with_skip.size(), 3u);
      EXPECT_LT(rel(with_skip[0], dx + skip), 1e-4);
      EXPECT_TRUE(torch::equal(with_skip[1], got[1])) << "deterministic dgamma";
      EXPECT_TRUE(torch::equal(with_skip[2], got[2])) << "deterministic dbeta";
      EXPECT_LE(NormBackwardPartials(rows, cols), rows) << "no more partial rows than rows";

      // RMSNorm: y = x rstd w.
      const torch::Tensor xd = x.to(torch::kFloat64), dyd = dy.to(torch::kFloat64), wd = gamma.to(torch::kFloat64);
      const torch::Tensor rstd_d = torch::rsqrt(xd.pow(2).mean(-1, true) + 1e-5);
      const torch::Tensor g = dyd * wd;
      const torch::Tensor dx_ref = rstd_d * g - xd * rstd_d.pow(3) * (g * xd).mean(-1, true);
      const torch::Tensor dw_ref = (dyd * xd * rstd_d).sum(0);
      std::vector<torch::Tensor> rms =
          NormBackwardFromBf16(dy, x, gamma, torch::Tensor(), rstd_d.to(torch::kFloat32).contiguous());
      ASSERT_EQ(rms.size(), 3u);
      EXPECT_LT(rel(rms[0], dx_ref), 1e-4);
      EXPECT_LT(rel(rms[1], dw_ref), 1e-4);
      EXPECT_FALSE(rms[2].defined());
    }
  }
  // What the kernel does not take comes back empty, for the caller's own backward.
  torch::Tensor x = torch::randn({4, 100}, f32), w = torch::ones({100}, f32), r = torch::ones({4, 1}, f32);
  EXPECT_TRUE(NormBackwardFromBf16(x.to(torch::kBFloat16), x, w, torch::Tensor(), r).empty());
  torch::Tensor x2 = torch::randn({4, 128}, f32), w2 = torch::ones({128}, f32);
  EXPECT_TRUE(NormBackwardFromBf16(x2, x2, w2, torch::Tensor(), r).empty());  // an fp32 gradient
  EXPECT_EQ(
      NormBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, nullptr),
      cudaErrorInvalidValue);
}

// The kernels themselves on an sm_90 GPU: the one-GEMM forward writes gelu(h) and h as cuBLAS + ATen
// do (to a bf16 rounding), refuses what it does not take; the fused backward is deterministic and
// matches ATen's gelu_backward and the fp32 column sums.
TEST(GemmGeluCuda, KernelsMatchAtenAndRefuseWhatTheyDoNotTake) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  torch::manual_seed(6);
  if (GemmGeluAvailable()) {
    for (int64_t m : {8192, 300, 1}) {
      const int64_t n = 8192 / (m == 8192 ? 1 : 32), k = 2048 / (m == 8192 ? 1 : 16);
      torch::Tensor x = torch::randn({m, k}, o), w = torch::randn({n, k}, o) * 0.05, b = torch::randn({n}, o);
      torch::Tensor h_ref = at::linear(x.to(torch::kFloat32), w.to(torch::kFloat32), b.to(torch::kFloat32));
      torch::Tensor a_ref = at::gelu(h_ref);
      torch::Tensor a = torch::empty({m, n}, o), h = torch::empty({m, n}, o), a2 = torch::empty({m, n}, o);
      ASSERT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a), bits(h), m, n, k, stream), cudaSuccess);
      ASSERT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a2), nullptr, m, n, k, stream), cudaSuccess);
      // bf16 rounding of the outputs (2^-8 relative) plus the fp32 sum's order.
      EXPECT_TRUE(torch::allclose(h.to(torch::kFloat32), h_ref, 8e-3, 1e-2)) << m;
      EXPECT_TRUE(torch::allclose(a.to(torch::kFloat32), a_ref, 8e-3, 1e-2)) << m;
      EXPECT_TRUE(torch::allclose(a, a2, 8e-3, 1e-3)) << "with and without the pre-activation output";
      std::cerr << "m=" << m << ": with and without h bitwise equal: " << torch::equal(a, a2) << "\n";
    }
    torch::Tensor x = torch::randn({16, 36}, o), w = torch::randn({64, 36}, o), b = torch::randn({64}, o);
    torch::Tensor a = torch::empty({16, 64}, o);
    EXPECT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a), nullptr, 16, 64, 36, stream), cudaErrorInvalidValue)
        << "k not a multiple of 8";
  } else {
    std::cerr << "not sm_90: GemmBiasGelu not tested\n";
  }
  // The real shape, rows that leave parts and a block's batch of loads part-full, a last column chunk
  // of one thread; h with values outside the kernel's gelu' table (zeros, tiny, large).
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{8192, 8192}, Shape{129, 264}, Shape{3, 264}, Shape{1001, 8192}, Shape{300, 2056},
                          Shape{1, 8}, Shape{8197, 3072}}) {
    const int64_t rows = sh.rows, cols = sh.cols;
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    torch::Tensor da = torch::randn({rows, cols}, o) * 1e-2, h = torch::randn({rows, cols}, o) * 2;
    {
      torch::Tensor flat = h.view({-1});
      const int64_t n = flat.numel();
      const std::vector<float> special = {0.f,  -0.f,  1e-5f, -3e-6f, 2.4e-4f, 15.9f, -15.9f,
                                          16.f, -16.f, 40.f,  -40.f,  300.f,   -7e4f, 3e38f};
      for (size_t i = 0; i < special.size() && static_cast<int64_t>(i) * 7 < n; ++i) flat[i * 7].fill_(special[i]);
    }
    torch::Tensor dh = torch::empty_like(h), dh2 = torch::empty_like(h);
    const int64_t parts = GeluBackwardPartials(rows);
    torch::Tensor p = torch::empty({parts, cols}, o.dtype(torch::kFloat32)), p2 = torch::empty_like(p);
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh), p.data_ptr<float>(), rows, cols, stream), cudaSuccess);
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh2), p2.data_ptr<float>(), rows, cols, stream), cudaSuccess);
    EXPECT_TRUE(torch::equal(dh, dh2) && torch::equal(p, p2)) << "deterministic";
    torch::Tensor ref = at::gelu_backward(da.to(torch::kFloat32), h.to(torch::kFloat32));
    EXPECT_TRUE(torch::allclose(dh.to(torch::kFloat32), ref, 8e-3, 1e-6)) << rows;
    EXPECT_TRUE(torch::allclose(p.sum(0), ref.sum(0), 1e-4, 1e-4)) << rows;
    // The same fp32 math as ATen's: its bf16 result, but for the rare rounding where the two builds'
    // erff or expf differ in the last fp32 bit.
    const int64_t differ = dh.ne(ref.to(torch::kBFloat16)).sum().item<int64_t>();
    std::cerr << rows << " x " << cols << ": " << differ << " of " << dh.numel() << " dh differ from ATen's bf16\n";
    EXPECT_LE(differ, dh.numel() / 10000) << rows;
  }
  // Every finite bf16 value of h (da = 1): dh is gelu'(h) rounded, table or not.
  {
    torch::Tensor all = torch::arange(0, 65536, torch::TensorOptions().dtype(torch::kInt32)).to(torch::kInt16);
    torch::Tensor h = all.view(torch::kBFloat16).to(torch::kCUDA).view({256, 256});
    h = torch::where(h.isfinite(), h, torch::zeros_like(h)).contiguous();
    torch::Tensor da = torch::ones_like(h), dh = torch::empty_like(h);
    torch::Tensor p = torch::empty({GeluBackwardPartials(256), 256}, o.dtype(torch::kFloat32));
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh), p.data_ptr<float>(), 256, 256, stream), cudaSuccess);
    torch::Tensor ref = at::gelu_backward(da.to(torch::kFloat32), h.to(torch::kFloat32)).to(torch::kBFloat16);
    const int64_t differ = dh.ne(ref).sum().item<int64_t>();
    std::cerr << "every bf16 h: " << differ << " of 65536 differ from ATen's\n";
    EXPECT_LE(differ, 16);
    EXPECT_TRUE(torch::allclose(dh.to(torch::kFloat32), ref.to(torch::kFloat32), 8e-3, 1e-30));
  }
  torch::Tensor t = torch::zeros({4, 12}, o);
  float partial[12];
  EXPECT_EQ(GeluBackwardBias(bits(t), bits(t), bits(t), partial, 4, 12, stream), cudaErrorInvalidValue)
      << "cols not a multiple of 8";
}

}  // namespace
}  // namespace stagehand
