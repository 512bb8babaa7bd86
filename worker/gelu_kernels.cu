// See gelu_kernels.h.
#include "worker/gelu_kernels.h"

#include <cuda_bf16.h>

namespace stagehand {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 8;                 // warps per block: each takes every kWarps-th row of the part
constexpr int kVec = 8;                   // bf16 columns per thread (16 bytes)
constexpr int kBlockCols = kWarp * kVec;  // 256 columns per block
constexpr int64_t kMaxParts = 64;
constexpr int64_t kRowsPerPart = 128;

__device__ __forceinline__ void Unpack(const uint4& u, float (&v)[kVec]) {
  const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]));
    v[2 * q] = f.x;
    v[2 * q + 1] = f.y;
  }
}

__device__ __forceinline__ unsigned int PackBf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&h);
}

// ATen's GeluCUDAKernelImpl backward (approximate='none'): dy * (cdf + x * pdf).
__device__ __forceinline__ float GeluGrad(float dy, float x) {
  constexpr float kAlpha = 0.70710678118654752440f;                 // 1/sqrt(2)
  constexpr float kBeta = 1.12837916709551257390f * kAlpha * 0.5f;  // 1/sqrt(2 pi)
  const float cdf = 0.5f * (1.f + erff(x * kAlpha));
  const float pdf = expf(-0.5f * x * x) * kBeta;
  return dy * (cdf + x * pdf);
}

// Block (column chunk blockIdx.x, part blockIdx.y): lane l of every warp owns columns
// chunk * 256 + 8 l .. + 7 and sums them over the warp's rows of the part in registers; the warps' sums
// are then added in shared memory in warp order, so every run adds in the same order.
__global__ void __launch_bounds__(kWarp * kWarps)
    GeluBackwardBiasKernel(const uint4* __restrict__ da, const uint4* __restrict__ h, uint4* __restrict__ dh,
                           float* __restrict__ partial, int64_t rows, int64_t cols, int64_t rows_per_part) {
  __shared__ float sums[kWarps][kBlockCols];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kBlockCols + lane * kVec;
  const int64_t cols8 = cols / kVec;
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * rows_per_part;
  const int64_t end = begin + rows_per_part < rows ? begin + rows_per_part : rows;
  float acc[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
  if (col < cols) {
    const int64_t c8 = col / kVec;
#pragma unroll 2
    for (int64_t r = begin + warp; r < end; r += kWarps) {
      const int64_t at = r * cols8 + c8;
      float g[kVec], x[kVec], d[kVec];
      Unpack(da[at], g);
      Unpack(h[at], x);
#pragma unroll
      for (int i = 0; i < kVec; ++i) {
        d[i] = GeluGrad(g[i], x[i]);
        acc[i] += d[i];
      }
      dh[at] = make_uint4(PackBf16x2(d[0], d[1]), PackBf16x2(d[2], d[3]), PackBf16x2(d[4], d[5]),
                          PackBf16x2(d[6], d[7]));
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) sums[warp][lane * kVec + i] = acc[i];
  __syncthreads();
  const int c = threadIdx.x;  // kWarp * kWarps == kBlockCols: one column per thread
  const int64_t out_col = static_cast<int64_t>(blockIdx.x) * kBlockCols + c;
  if (out_col >= cols) return;
  float s = sums[0][c];
#pragma unroll
  for (int w = 1; w < kWarps; ++w) s += sums[w][c];
  partial[static_cast<int64_t>(blockIdx.y) * cols + out_col] = s;
}

static_assert(kWarp * kWarps == kBlockCols, "one output column per thread");

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool GeluBackwardSupports(int64_t cols) { return cols > 0 && cols % kVec == 0; }

int64_t GeluBackwardPartials(int64_t rows) {
  const int64_t parts = (rows + kRowsPerPart - 1) / kRowsPerPart;
  return parts < 1 ? 1 : parts > kMaxParts ? kMaxParts : parts;
}

cudaError_t GeluBackwardBias(const uint16_t* da, const uint16_t* h, uint16_t* dh, float* partial_db, int64_t rows,
                             int64_t cols, cudaStream_t stream) {
  if (!GeluBackwardSupports(cols) || rows < 0 || !Aligned(da) || !Aligned(h) || !Aligned(dh) ||
      partial_db == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t parts = GeluBackwardPartials(rows);
  const int64_t rows_per_part = (rows + parts - 1) / parts;
  const int64_t chunks = (cols + kBlockCols - 1) / kBlockCols;
  if (chunks > 0x7fffffff) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned int>(chunks), static_cast<unsigned int>(parts));
  GeluBackwardBiasKernel<<<grid, kWarp * kWarps, 0, stream>>>(
      reinterpret_cast<const uint4*>(da), reinterpret_cast<const uint4*>(h), reinterpret_cast<uint4*>(dh), partial_db,
      rows, cols, rows_per_part < 1 ? 1 : rows_per_part);
  return cudaGetLastError();
}

}  // namespace stagehand
