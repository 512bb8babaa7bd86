// See fused_kernels.h.
#include "kernels/fused_kernels.h"

#include <cuda_bf16.h>

namespace stagehand {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 4;  // a warp per row

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// One warp normalises one row of kVecs * 128 floats, held in registers (kVecs float4 per lane): the
// row is read once, its mean and variance come from warp shuffles (two passes over the registers, so
// the variance is the mean of squared deviations, as exact as a Welford pass), and it is written once.
template <int kVecs>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    LayerNormToBf16Kernel(const float4* __restrict__ x, const float4* __restrict__ gamma,
                          const float4* __restrict__ beta, uint2* __restrict__ y, float* __restrict__ mean_out,
                          float* __restrict__ rstd_out, int64_t rows, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  constexpr int kCols = kVecs * 4 * kWarp;
  const float4* in = x + row * (kCols / 4);
  float4 v[kVecs];
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    v[i] = in[i * kWarp + lane];
    sum += (v[i].x + v[i].y) + (v[i].z + v[i].w);
  }
  const float mean = WarpSum(sum) / kCols;
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const float a = v[i].x - mean, b = v[i].y - mean, c = v[i].z - mean, d = v[i].w - mean;
    sq += (a * a + b * b) + (c * c + d * d);
  }
  const float rstd = rsqrtf(WarpSum(sq) / kCols + eps);
  if (lane == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }
  uint2* out = y + row * (kCols / 4);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int k = i * kWarp + lane;
    const float4 g = gamma[k], b = beta[k];
    const __nv_bfloat162 lo =
        __floats2bfloat162_rn((v[i].x - mean) * rstd * g.x + b.x, (v[i].y - mean) * rstd * g.y + b.y);
    const __nv_bfloat162 hi =
        __floats2bfloat162_rn((v[i].z - mean) * rstd * g.z + b.z, (v[i].w - mean) * rstd * g.w + b.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const unsigned int*>(&lo);
    packed.y = *reinterpret_cast<const unsigned int*>(&hi);
    out[k] = packed;
  }
}

template <int kVecs>
cudaError_t Launch(const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean, float* rstd,
                   int64_t rows, float eps, cudaStream_t stream) {
  const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  LayerNormToBf16Kernel<kVecs><<<static_cast<unsigned int>(blocks), kWarp * kRowsPerBlock, 0, stream>>>(
      reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(gamma), reinterpret_cast<const float4*>(beta),
      reinterpret_cast<uint2*>(y), mean, rstd, rows, eps);
  return cudaGetLastError();
}

// Launch<kVecs> for kVecs = cols / 128, found by recursion over 1..32.
template <int kVecs>
cudaError_t Dispatch(int vecs, const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean,
                     float* rstd, int64_t rows, float eps, cudaStream_t stream) {
  if (vecs == kVecs) return Launch<kVecs>(x, gamma, beta, y, mean, rstd, rows, eps, stream);
  if constexpr (kVecs < 32) {
    return Dispatch<kVecs + 1>(vecs, x, gamma, beta, y, mean, rstd, rows, eps, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

// One warp per row of kVecs * 128 floats held in registers, as LayerNormToBf16Kernel, without the mean.
template <int kVecs>
__global__ void __launch_bounds__(kWarp* kRowsPerBlock)
    RmsNormToBf16Kernel(const float4* __restrict__ x, const float4* __restrict__ gamma, uint2* __restrict__ y,
                        float* __restrict__ rstd_out, int64_t rows, float eps) {
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (row >= rows) return;
  constexpr int kCols = kVecs * 4 * kWarp;
  const float4* in = x + row * (kCols / 4);
  float4 v[kVecs];
  float sq = 0.f;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    v[i] = in[i * kWarp + lane];
    sq += (v[i].x * v[i].x + v[i].y * v[i].y) + (v[i].z * v[i].z + v[i].w * v[i].w);
  }
  const float rstd = rsqrtf(WarpSum(sq) / kCols + eps);
  if (lane == 0) rstd_out[row] = rstd;
  uint2* out = y + row * (kCols / 4);
#pragma unroll
  for (int i = 0; i < kVecs; ++i) {
    const int k = i * kWarp + lane;
    const float4 g = gamma[k];
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[i].x * rstd * g.x, v[i].y * rstd * g.y);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v[i].z * rstd * g.z, v[i].w * rstd * g.w);
    uint2 packed;
    packed.x = *reinterpret_cast<const unsigned int*>(&lo);
    packed.y = *reinterpret_cast<const unsigned int*>(&hi);
    out[k] = packed;
  }
}

template <int kVecs>
cudaError_t DispatchRms(int vecs, const float* x, const float* gamma, uint16_t* y, float* rstd, int64_t rows, float eps,
                        cudaStream_t stream) {
  if (vecs == kVecs) {
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    RmsNormToBf16Kernel<kVecs><<<static_cast<unsigned int>(blocks), kWarp * kRowsPerBlock, 0, stream>>>(
        reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(gamma), reinterpret_cast<uint2*>(y), rstd,
        rows, eps);
    return cudaGetLastError();
  }
  if constexpr (kVecs < 32) {
    return DispatchRms<kVecs + 1>(vecs, x, gamma, y, rstd, rows, eps, stream);
  } else {
    return cudaErrorInvalidValue;
  }
}

}  // namespace

bool LayerNormToBf16Supports(int64_t cols) { return cols > 0 && cols % 128 == 0 && cols <= 32 * 128; }

cudaError_t LayerNormToBf16(const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean,
                            float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!LayerNormToBf16Supports(cols) || rows < 0) return cudaErrorInvalidValue;
  if (!aligned(x) || !aligned(gamma) || !aligned(beta) || !aligned(y)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return Dispatch<1>(static_cast<int>(cols / 128), x, gamma, beta, y, mean, rstd, rows, eps, stream);
}

cudaError_t RmsNormToBf16(const float* x, const float* gamma, uint16_t* y, float* rstd, int64_t rows, int64_t cols,
                          float eps, cudaStream_t stream) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!LayerNormToBf16Supports(cols) || rows < 0) return cudaErrorInvalidValue;
  if (!aligned(x) || !aligned(gamma) || !aligned(y)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  return DispatchRms<1>(static_cast<int>(cols / 128), x, gamma, y, rstd, rows, eps, stream);
}

}  // namespace stagehand
