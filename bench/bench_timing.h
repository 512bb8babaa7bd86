// The GPU microbenchmarks' timer (gemm_gelu_bench, residual_gemm_bench): header-only, LibTorch's current
// stream, CUDA events.
#ifndef STAGEHAND_BENCH_BENCH_TIMING_H_
#define STAGEHAND_BENCH_BENCH_TIMING_H_

#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace stagehand {

inline void BenchCheck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Milliseconds per call of f: two warm-up calls, then calls back to back for at least heat_ms (so that
// a kernel is timed at the clock the power limit holds it to under sustained load, as in a step of
// inference on an H200, not at the boost clock of a short burst), then the mean of `iters` calls.
inline double BenchTimeMs(const std::function<void()>& f, int iters, double heat_ms) {
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  cudaEvent_t start, stop;
  BenchCheck(cudaEventCreate(&start), "cudaEventCreate");
  BenchCheck(cudaEventCreate(&stop), "cudaEventCreate");
  auto timed = [&](int n) {
    BenchCheck(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int i = 0; i < n; ++i) f();
    BenchCheck(cudaEventRecord(stop, stream), "cudaEventRecord");
    BenchCheck(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    BenchCheck(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    return static_cast<double>(ms);
  };
  const double per_call = std::max(1e-3, timed(2) / 2);
  for (double heated = 0; heated < heat_ms;) heated += timed(std::max(1, static_cast<int>(20.0 / per_call)));
  const double ms = timed(iters) / iters;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// Median milliseconds per call of each of `fs`, timed in turn: the GPU heated by fs[0] for heat_ms, then
// `rounds` rounds, each timing every function for `iters` calls (after two warm-up calls) in an order
// rotated by one per round. Neighbours in time share the clock and the temperature, so kernels a few
// per cent apart are told apart where one after the other (BenchTimeMs each) they drift by as much.
inline std::vector<double> BenchInterleavedMs(const std::vector<std::function<void()>>& fs, int rounds, int iters,
                                              double heat_ms) {
  const size_t n = fs.size();
  std::vector<std::vector<double>> samples(n);
  if (n == 0) return {};
  BenchTimeMs(fs[0], 1, heat_ms);
  for (int r = 0; r < rounds; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const size_t i = (j + r) % n;
      samples[i].push_back(BenchTimeMs(fs[i], iters, 0));
    }
  }
  std::vector<double> medians;
  for (std::vector<double>& s : samples) {
    std::sort(s.begin(), s.end());
    medians.push_back(s.empty() ? 0 : s[s.size() / 2]);
  }
  return medians;
}

}  // namespace stagehand

#endif  // STAGEHAND_BENCH_BENCH_TIMING_H_
