// Microbenchmark (GPU only): the residual GEMM d = x W^T + b + c (bf16 operands, fp32 bias, addend and
// output) on gpt-1.3b's proj and fc2 shapes: the model's cuBLASLt choice (LtLinearAddFp32), every
// algorithm cuBLASLt's heuristic offers (up to 32), the CUTLASS kernels of gemm_residual.h, and ATen's
// bf16 GEMM + a separate add. Each candidate runs back to back for --heat_ms first, so that it is timed
// at the clock the power limit holds it to (a step of inference is power-capped on an H200), then
// `iters` calls are timed with CUDA events (bench_timing.h). Fixed columns: ms, TFLOP/s, the ratio of the
// model's choice's time to this one's, and the largest error against an fp32 reference.
// `interleave`: on each of the four shapes the model's cuBLASLt choice and the CUTLASS kernels timed in
// turn, the median of `rounds` (BenchInterleavedMs; no error column).
// Usage: residual_gemm_bench [iters] [heat_ms]  |  residual_gemm_bench interleave [rounds]
#include <ATen/cuda/CUDAContext.h>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_timing.h"
#include "kernels/gemm_residual.h"
#include "kernels/lt_gemm.h"

namespace {

using stagehand::BenchCheck;

double TimeMs(const std::function<void()>& f, int iters, double heat_ms) {
  return stagehand::BenchTimeMs(f, iters, heat_ms);
}

template <typename F>
F Sym(const char* name) {
  F f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  if (f == nullptr) {
    std::fprintf(stderr, "no %s in the process\n", name);
    std::exit(1);
  }
  return f;
}

struct Problem {
  const char* name;
  int64_t m, n, k;
};

// One line; `err` < 0: not measured ("-").
void Row(const Problem& p, const std::string& what, double ms, double base_ms, double err) {
  const double tflops = 2.0 * p.m * p.n * p.k / (ms * 1e-3) / 1e12;
  char err_text[32] = "-";
  if (err >= 0) std::snprintf(err_text, sizeof(err_text), "%.2e", err);
  std::printf("%-10s %6lld %5lld %5lld  %-58s %8.3f %7.1f %7.3f %9s\n", p.name, static_cast<long long>(p.m),
              static_cast<long long>(p.n), static_cast<long long>(p.k), what.c_str(), ms, tflops, base_ms / ms,
              err_text);
  std::fflush(stdout);
}

// The algorithm's configuration as cuBLASLt reports it (tile, stages, cluster, split-K, swizzle, CTA order).
std::string AlgoName(const cublasLtMatmulAlgo_t& algo) {
  auto get = Sym<decltype(&cublasLtMatmulAlgoConfigGetAttribute)>("cublasLtMatmulAlgoConfigGetAttribute");
  auto attr = [&](cublasLtMatmulAlgoConfigAttributes_t a) {
    uint32_t v = 0;
    size_t written = 0;
    get(&algo, a, &v, sizeof(v), &written);
    return v;
  };
  int32_t id = 0;
  size_t written = 0;
  get(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
  char buf[160];
  std::snprintf(buf, sizeof(buf), "lt id %d tile %u stages %u cluster %u splitk %u swz %u cta %u", id,
                attr(CUBLASLT_ALGO_CONFIG_TILE_ID), attr(CUBLASLT_ALGO_CONFIG_STAGES_ID),
                attr(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID), attr(CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                attr(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING), attr(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION));
  return buf;
}

// d = x w^T + bias + c by the model's path (LtLinearAddFp32: cuBLASLt's algorithm, timed once per shape).
void ModelChoice(const Problem& p, const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& bias,
                 const torch::Tensor& c, torch::Tensor& d) {
  const std::string e = stagehand::LtLinearAddFp32(
      at::cuda::getCurrentCUDABlasLtHandle(), at::cuda::getCUDABlasLtWorkspace(),
      at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream(), x.data_ptr(), w.data_ptr(),
      bias.data_ptr<float>(), c.data_ptr<float>(), d.data_ptr<float>(), p.m, p.n, p.k);
  if (!e.empty()) {
    std::fprintf(stderr, "LtLinearAddFp32: %s\n", e.c_str());
    std::exit(1);
  }
}

void Bench(const Problem& p, int iters, double heat_ms) {
  auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  torch::Tensor x = torch::randn({p.m, p.k}, bf), w = torch::randn({p.n, p.k}, bf) * 0.02;
  torch::Tensor bias = torch::randn({p.n}, f32) * 0.1, c = torch::randn({p.m, p.n}, f32);
  torch::Tensor d = torch::empty({p.m, p.n}, f32);
  at::globalContext().setAllowTF32CuBLAS(false);
  const torch::Tensor ref = c + bias + at::matmul(x.to(torch::kFloat32), w.to(torch::kFloat32).t());
  auto err = [&] { return (d - ref).abs().max().item<double>(); };
  auto bits = [](const torch::Tensor& t) { return t.data_ptr(); };
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  void* handle = at::cuda::getCurrentCUDABlasLtHandle();
  void* workspace = at::cuda::getCUDABlasLtWorkspace();
  const size_t ws = at::cuda::getCUDABlasLtWorkspaceSize();

  auto model = [&] { ModelChoice(p, x, w, bias, c, d); };
  const double base = TimeMs(model, iters, heat_ms);
  Row(p, "model's choice (LtLinearAddFp32)", base, base, err());
  const double aten =
      TimeMs([&] { at::add_out(d, c, at::linear(x, w).to(torch::kFloat32)).add_(bias); }, iters, heat_ms);
  Row(p, "ATen bf16 GEMM + adds", aten, base, err());

  for (int v = 0; v < stagehand::GemmResidualVariants(); ++v) {
    auto run = [&] {
      BenchCheck(stagehand::GemmResidualFp32(static_cast<const uint16_t*>(bits(x)),
                                             static_cast<const uint16_t*>(bits(w)), bias.data_ptr<float>(),
                                             c.data_ptr<float>(), d.data_ptr<float>(), p.m, p.n, p.k, stream, v),
                 stagehand::GemmResidualVariantName(v));
    };
    d.zero_();
    run();
    const double e = err();
    Row(p, std::string("cutlass ") + stagehand::GemmResidualVariantName(v), TimeMs(run, iters, heat_ms), base, e);
  }

  // Every algorithm cuBLASLt's heuristic offers for the same descriptors as lt_gemm.cc's.
  auto desc_create = Sym<decltype(&cublasLtMatmulDescCreate)>("cublasLtMatmulDescCreate");
  auto desc_set = Sym<decltype(&cublasLtMatmulDescSetAttribute)>("cublasLtMatmulDescSetAttribute");
  auto layout_create = Sym<decltype(&cublasLtMatrixLayoutCreate)>("cublasLtMatrixLayoutCreate");
  auto pref_create = Sym<decltype(&cublasLtMatmulPreferenceCreate)>("cublasLtMatmulPreferenceCreate");
  auto pref_set = Sym<decltype(&cublasLtMatmulPreferenceSetAttribute)>("cublasLtMatmulPreferenceSetAttribute");
  auto heuristic = Sym<decltype(&cublasLtMatmulAlgoGetHeuristic)>("cublasLtMatmulAlgoGetHeuristic");
  auto matmul = Sym<decltype(&cublasLtMatmul)>("cublasLtMatmul");
  cublasLtMatmulDesc_t desc;
  desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
  const cudaDataType_t bias_type = CUDA_R_32F;
  desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
  const float* bias_ptr = bias.data_ptr<float>();
  desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias_ptr, sizeof(bias_ptr));
  cublasLtMatrixLayout_t la, lb, lcd;
  layout_create(&la, CUDA_R_16BF, p.k, p.n, p.k);
  layout_create(&lb, CUDA_R_16BF, p.k, p.m, p.k);
  layout_create(&lcd, CUDA_R_32F, p.n, p.m, p.n);
  cublasLtMatmulPreference_t pref;
  pref_create(&pref);
  const uint64_t ws64 = ws;
  pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws64, sizeof(ws64));
  std::vector<cublasLtMatmulHeuristicResult_t> results(32);
  int found = 0;
  heuristic(static_cast<cublasLtHandle_t>(handle), desc, la, lb, lcd, lcd, pref, 32, results.data(), &found);
  const float alpha = 1, beta = 1;
  for (int i = 0; i < found; ++i) {
    auto run = [&] {
      return matmul(static_cast<cublasLtHandle_t>(handle), desc, &alpha, bits(w), la, bits(x), lb, &beta,
                    c.data_ptr<float>(), lcd, d.data_ptr<float>(), lcd, &results[i].algo, workspace, ws, stream);
    };
    d.zero_();
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    const double e = err();
    Row(p, "#" + std::to_string(i) + " " + AlgoName(results[i].algo), TimeMs([&] { run(); }, iters, heat_ms), base, e);
  }
  Row(p, "model's choice again", TimeMs(model, iters, heat_ms), base, -1);
  Sym<decltype(&cublasLtMatmulPreferenceDestroy)>("cublasLtMatmulPreferenceDestroy")(pref);
  auto layout_destroy = Sym<decltype(&cublasLtMatrixLayoutDestroy)>("cublasLtMatrixLayoutDestroy");
  for (cublasLtMatrixLayout_t l : {la, lb, lcd}) layout_destroy(l);
  Sym<decltype(&cublasLtMatmulDescDestroy)>("cublasLtMatmulDescDestroy")(desc);
}

// The model's cuBLASLt choice and every CUTLASS variant on one shape, interleaved.
void Interleaved(const Problem& p, int rounds) {
  auto bf = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  torch::Tensor x = torch::randn({p.m, p.k}, bf), w = torch::randn({p.n, p.k}, bf) * 0.02;
  torch::Tensor bias = torch::randn({p.n}, f32) * 0.1, c = torch::randn({p.m, p.n}, f32), d = torch::empty_like(c);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  std::vector<std::function<void()>> fs;
  std::vector<std::string> names;
  fs.emplace_back([&] { ModelChoice(p, x, w, bias, c, d); });
  names.push_back("model's cuBLASLt choice (LtLinearAddFp32)");
  for (int v = 0; v < stagehand::GemmResidualVariants(); ++v) {
    fs.emplace_back([&, v] {
      BenchCheck(stagehand::GemmResidualFp32(static_cast<const uint16_t*>(x.data_ptr()),
                                             static_cast<const uint16_t*>(w.data_ptr()), bias.data_ptr<float>(),
                                             c.data_ptr<float>(), d.data_ptr<float>(), p.m, p.n, p.k, stream, v),
                 stagehand::GemmResidualVariantName(v));
    });
    names.push_back(std::string("cutlass ") + stagehand::GemmResidualVariantName(v));
  }
  const std::vector<double> ms = stagehand::BenchInterleavedMs(fs, rounds, 10, 150);
  for (size_t i = 0; i < ms.size(); ++i) Row(p, names[i] + " (median)", ms[i], ms[0], -1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool interleave = argc > 1 && std::string(argv[1]) == "interleave";
  const int iters = argc > 1 && !interleave ? std::atoi(argv[1]) : 20;
  const double heat_ms = argc > 2 && !interleave ? std::atof(argv[2]) : 150;
  if (!torch::cuda::is_available() || !stagehand::GemmResidualAvailable()) {
    std::fprintf(stderr, "residual_gemm_bench: needs an sm_90 GPU\n");
    return 1;
  }
  torch::NoGradGuard no_grad;
  std::printf("%-10s %6s %5s %5s  %-58s %8s %7s %7s %9s\n", "shape", "m", "n", "k", "kernel", "ms", "TFLOP/s",
              "vs model", "max err");
  const std::vector<Problem> problems = {{"proj infer", 16384, 2048, 2048},
                                         {"fc2 infer", 16384, 2048, 8192},
                                         {"proj train", 8192, 2048, 2048},
                                         {"fc2 train", 8192, 2048, 8192}};
  if (interleave) {
    const int rounds = argc > 2 ? std::atoi(argv[2]) : 7;
    for (const Problem& p : problems) Interleaved(p, rounds);
    return 0;
  }
  for (const Problem& p : problems) Bench(p, iters, heat_ms);
  return 0;
}
