// Microbenchmark (GPU only): the fused fc1 + bias + GELU GEMM's tile configurations (gemm_gelu.h) and the
// fused GELU + bias-gradient backward (gelu_kernels.h) against cuBLAS (at::linear) + ATen's GELU, on
// gpt-1.3b's MLP shapes. CUDA events, fixed columns, the ratio to ATen's time last.
// Each kernel runs back to back for heat_ms first (bench_timing.h: the clock under the power limit).
// `interleave`: the inference shape's kernels timed in turn, the median of `rounds` (BenchInterleavedMs).
// Usage: gemm_gelu_bench [iterations] [heat_ms]  |  gemm_gelu_bench interleave [rounds]
#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_timing.h"
#include "kernels/gelu_kernels.h"
#include "kernels/gemm_gelu.h"

namespace {

uint16_t* Bits(const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); }

using stagehand::BenchCheck;

double heat_ms = 150;  // main's second argument: bench_timing.h

double TimeMs(const std::function<void()>& f, int iters) { return stagehand::BenchTimeMs(f, iters, heat_ms); }

// One line; max_err < 0: not measured ("-").
void Row(const char* kind, int64_t m, int64_t n, int64_t k, const std::string& what, double ms, double base_ms,
         double max_err) {
  const double tflops = 2.0 * m * n * k / (ms * 1e-3) / 1e12;
  char err[32] = "-";
  if (max_err >= 0) std::snprintf(err, sizeof(err), "%.2e", max_err);
  std::printf("%-9s %6lld %6lld %6lld  %-34s %9.3f %8.1f %8.3f %10s\n", kind, static_cast<long long>(m),
              static_cast<long long>(n), static_cast<long long>(k), what.c_str(), ms, tflops, base_ms / ms, err);
}

void Forward(int64_t m, int64_t n, int64_t k, bool aux, int iters) {
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::Tensor x = torch::randn({m, k}, o), w = torch::randn({n, k}, o) * 0.02, b = torch::randn({n}, o) * 0.1;
  torch::Tensor ref_h = at::linear(x, w, b), ref = at::gelu(ref_h);
  const char* kind = aux ? "fwd+h" : "fwd";
  const double gemm_ms = TimeMs([&] { at::linear(x, w, b); }, iters);
  // The GPU's clock drifts down under back-to-back GEMMs: ATen's time is taken before and after the
  // variants, and each ratio is to their mean.
  const double base_before = TimeMs([&] { at::gelu(at::linear(x, w, b)); }, iters);
  torch::Tensor a = torch::empty_like(ref), h = torch::empty_like(ref);
  std::vector<std::pair<double, double>> times;  // (ms, error) per variant
  for (int v = 0; v < stagehand::GemmGeluVariants(); ++v) {
    auto run = [&] {
      BenchCheck(stagehand::GemmBiasGelu(Bits(x), Bits(w), Bits(b), Bits(a), aux ? Bits(h) : nullptr, m, n, k,
                                         at::cuda::getCurrentCUDAStream(), v),
                 stagehand::GemmGeluVariantName(v));
    };
    run();
    double err = (a.to(torch::kFloat32) - ref.to(torch::kFloat32)).abs().max().item<double>();
    if (aux) err = std::max(err, (h.to(torch::kFloat32) - ref_h.to(torch::kFloat32)).abs().max().item<double>());
    times.emplace_back(TimeMs(run, iters), err);
  }
  const double base_after = TimeMs([&] { at::gelu(at::linear(x, w, b)); }, iters);
  const double base_ms = (base_before + base_after) / 2;
  Row(kind, m, n, k, "cuBLAS linear alone", gemm_ms, base_ms, 0);
  Row(kind, m, n, k, "cuBLAS linear + ATen gelu (before)", base_before, base_ms, 0);
  Row(kind, m, n, k, "cuBLAS linear + ATen gelu (after)", base_after, base_ms, 0);
  for (size_t v = 0; v < times.size(); ++v) {
    Row(kind, m, n, k, stagehand::GemmGeluVariantName(static_cast<int>(v)), times[v].first, base_ms, times[v].second);
  }
}

void Backward(int64_t m, int64_t n, int iters) {
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::Tensor da = torch::randn({m, n}, o) * 1e-3, h = torch::randn({m, n}, o);
  torch::Tensor ref_dh = at::gelu_backward(da, h), ref_db = ref_dh.sum(0, false, torch::kFloat32);
  const double base_ms = TimeMs(
      [&] {
        torch::Tensor d = at::gelu_backward(da, h);
        d.sum(0, false, torch::kFloat32);
      },
      iters);
  Row("bwd", m, n, 0, "ATen gelu_backward + bias sum", base_ms, base_ms, 0);
  torch::Tensor dh = torch::empty_like(h);
  torch::Tensor partial = torch::empty({stagehand::GeluBackwardPartials(m), n}, o.dtype(torch::kFloat32));
  torch::Tensor db;
  auto run = [&] {
    BenchCheck(stagehand::GeluBackwardBias(Bits(da), Bits(h), Bits(dh), partial.data_ptr<float>(), m, n,
                                           at::cuda::getCurrentCUDAStream()),
               "GeluBackwardBias");
    db = partial.sum(0);
  };
  run();
  const double err_dh = (dh.to(torch::kFloat32) - ref_dh.to(torch::kFloat32)).abs().max().item<double>();
  const double err_db = (db - ref_db).abs().max().item<double>();
  std::printf("# bwd max |dh - ATen| %.2e, max |db - ATen| %.2e (|db| max %.2e)\n", err_dh, err_db,
              ref_db.abs().max().item<double>());
  Row("bwd", m, n, 0, "fused gelu' + bias partials + sum", TimeMs(run, iters), base_ms, err_dh);
}

// fc1 + GELU of an inference micro-batch (16 sequences): every variant and cuBLAS's GEMM alone, interleaved.
void Interleaved(int rounds) {
  const int64_t m = 16384, n = 8192, k = 2048;
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  torch::Tensor x = torch::randn({m, k}, o), w = torch::randn({n, k}, o) * 0.02, b = torch::randn({n}, o) * 0.1;
  torch::Tensor a = torch::empty({m, n}, o), y = torch::empty({m, n}, o);
  std::vector<std::function<void()>> fs;
  std::vector<std::string> names;
  for (int v = 0; v < stagehand::GemmGeluVariants(); ++v) {
    fs.emplace_back([&, v] {
      BenchCheck(stagehand::GemmBiasGelu(Bits(x), Bits(w), Bits(b), Bits(a), nullptr, m, n, k,
                                         at::cuda::getCurrentCUDAStream(), v),
                 stagehand::GemmGeluVariantName(v));
    });
    names.push_back(stagehand::GemmGeluVariantName(v));
  }
  fs.emplace_back([&] { at::addmm_out(y, b, x, w.t()); });
  names.push_back("cuBLAS linear alone (no GELU)");
  const std::vector<double> ms = stagehand::BenchInterleavedMs(fs, rounds, 10, heat_ms);
  for (size_t i = 0; i < ms.size(); ++i) Row("fwd-med", m, n, k, names[i], ms[i], ms[0], -1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool interleave = argc > 1 && std::string(argv[1]) == "interleave";
  const int iters = argc > 1 && !interleave ? std::atoi(argv[1]) : 20;
  if (argc > 2 && !interleave) heat_ms = std::atof(argv[2]);
  if (!torch::cuda::is_available() || !stagehand::GemmGeluAvailable()) {
    std::fprintf(stderr, "gemm_gelu_bench: needs an sm_90 GPU\n");
    return 1;
  }
  torch::NoGradGuard no_grad;
  if (interleave) {
    std::printf("%-9s %6s %6s %6s  %-34s %9s %8s %8s %10s\n", "kind", "M", "N", "K", "kernel (median)", "ms", "TFLOP/s",
                "vs_v0", "max_err");
    Interleaved(argc > 2 ? std::atoi(argv[2]) : 7);
    return 0;
  }
  std::printf("%-9s %6s %6s %6s  %-34s %9s %8s %8s %10s\n", "kind", "M", "N", "K", "kernel", "ms", "TFLOP/s", "vs_ATen",
              "max_err");
  Forward(8192, 8192, 2048, /*aux=*/true, iters);    // training: a micro-batch of 8 x 1024 tokens
  Forward(16384, 8192, 2048, /*aux=*/false, iters);  // inference: 16 sequences
  Forward(8192, 8192, 2048, /*aux=*/false, iters);
  Backward(8192, 8192, iters);
  return 0;
}
