// See embedding_kernels.h.
#include "kernels/embedding_kernels.h"

#include <cstdint>

namespace stagehand {
namespace {

constexpr int kThreads = 256;

// Block b: position b of the sorted ids. Only the first position of a run of equal ids works: it sums
// the run's rows of g (float4 per thread, columns strided by the block) in position order and adds the
// sums to the id's row of grad.
__global__ void __launch_bounds__(kThreads)
    EmbeddingGradKernel(const int64_t* __restrict__ sorted_ids, const int64_t* __restrict__ order,
                        const float4* __restrict__ g, float4* __restrict__ grad, int64_t n, int64_t cols4) {
  const int64_t begin = blockIdx.x;
  const int64_t id = sorted_ids[begin];
  if (begin > 0 && sorted_ids[begin - 1] == id) return;
  int64_t end = begin + 1;
  while (end < n && sorted_ids[end] == id) ++end;
  float4* row = grad + id * cols4;
  for (int64_t c = threadIdx.x; c < cols4; c += kThreads) {
    float4 acc = g[order[begin] * cols4 + c];
    for (int64_t k = begin + 1; k < end; ++k) {
      const float4 v = g[order[k] * cols4 + c];
      acc.x += v.x;
      acc.y += v.y;
      acc.z += v.z;
      acc.w += v.w;
    }
    float4 r = row[c];
    r.x += acc.x;
    r.y += acc.y;
    r.z += acc.z;
    r.w += acc.w;
    row[c] = r;
  }
}

bool Aligned(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

cudaError_t EmbeddingGradAccumulate(const int64_t* sorted_ids, const int64_t* order, const float* g, float* grad,
                                    int64_t n, int64_t cols, cudaStream_t stream) {
  if (n < 0 || n > INT32_MAX || cols <= 0 || cols % 4 != 0 || !Aligned(g) || !Aligned(grad)) {
    return cudaErrorInvalidValue;
  }
  if (n == 0) return cudaSuccess;
  EmbeddingGradKernel<<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
      sorted_ids, order, reinterpret_cast<const float4*>(g), reinterpret_cast<float4*>(grad), n, cols / 4);
  return cudaGetLastError();
}

}  // namespace stagehand
