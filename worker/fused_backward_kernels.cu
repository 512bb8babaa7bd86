// See fused_backward_kernels.h.
#include "worker/fused_backward_kernels.h"

#include <cuda_bf16.h>

#include <cmath>

namespace stagehand {
namespace {

constexpr int kWarp = 32;
constexpr int kNormWarps = 4;  // warps per block of the norm backward, a row per warp at a time
constexpr int kCeThreads = 256;

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float4 Bf16x4ToFloat4(uint2 u) {
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
  return make_float4(lo.x, lo.y, hi.x, hi.y);
}

// Adds the block's warps' register sums (each lane's own columns) in shared memory, warp 0 first, and
// writes them as one row of partial sums.
template <int kVecs>
__device__ __forceinline__ void BlockPartial(float4* shared, const float4 (&acc)[kVecs], float4* out) {
  constexpr int kCols4 = kVecs * kWarp;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
#pragma unroll
  for (int i = 0; i < kVecs; ++i) shared[warp * kCols4 + i * kWarp + lane] = acc[i];
  __syncthreads();
  for (int q = threadIdx.x; q < kCols4; q += kWarp * kNormWarps) {
    float4 s = shared[q];
    for (int w = 1; w < kNormWarps; ++w) {
      const float4 t = shared[w * kCols4 + q];
      s.x += t.x;
      s.y += t.y;
      s.z += t.z;
      s.w += t.w;
    }
    out[q] = s;
  }
  __syncthreads();
}

// Each warp takes rows warp, warp + W, ... (W = all warps of the grid) of kVecs * 128 elements; lane l
// owns the float4 columns i * 32 + l, so its share of dgamma and dbeta stays in its registers across
// rows. Two passes over each row: the first for the row's two sums, the second (from L1/L2) for dx. At
// the end the block's warps add their sums in shared memory and the block writes one partial row.
template <int kVecs, bool kCentered>
__global__ void __launch_bounds__(kWarp * kNormWarps)
    NormBackwardKernel(const uint2* __restrict__ dy, const float4* __restrict__ x, const float4* __restrict__ gamma,
                       const float* __restrict__ mean, const float* __restrict__ rstd,
                       const float4* __restrict__ residual, float4* __restrict__ dx,
                       float4* __restrict__ partial_dgamma, float4* __restrict__ partial_dbeta, int64_t rows) {
  constexpr int kCols = kVecs * 4 * kWarp, kCols4 = kCols / 4;
  extern __shared__ float4 shared[];  // [kNormWarps][kCols4]
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  float4 acc_g[kVecs], acc_b[kVecs];
#pragma unroll
  for (int i = 0; i < kVecs; ++i) acc_g[i] = acc_b[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kNormWarps;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kNormWarps + warp; row < rows; row += stride) {
    const float mu = kCentered ? mean[row] : 0.f, rs = rstd[row];
    const uint2* dyr = dy + row * kCols4;
    const float4* xr = x + row * kCols4;
    float sum_g = 0.f, sum_gx = 0.f;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int k = i * kWarp + lane;
      const float4 d = Bf16x4ToFloat4(dyr[k]), v = xr[k], g = gamma[k];
      const float4 h = make_float4((v.x - mu) * rs, (v.y - mu) * rs, (v.z - mu) * rs, (v.w - mu) * rs);
      const float4 dg = make_float4(d.x * g.x, d.y * g.y, d.z * g.z, d.w * g.w);
      sum_g += (dg.x + dg.y) + (dg.z + dg.w);
      sum_gx += (dg.x * h.x + dg.y * h.y) + (dg.z * h.z + dg.w * h.w);
      acc_g[i].x += d.x * h.x;
      acc_g[i].y += d.y * h.y;
      acc_g[i].z += d.z * h.z;
      acc_g[i].w += d.w * h.w;
      if (kCentered) {
        acc_b[i].x += d.x;
        acc_b[i].y += d.y;
        acc_b[i].z += d.z;
        acc_b[i].w += d.w;
      }
    }
    const float mean_g = kCentered ? WarpSum(sum_g) / kCols : 0.f;
    const float mean_gx = WarpSum(sum_gx) / kCols;
    float4* dxr = dx + row * kCols4;
    const float4* rr = residual == nullptr ? nullptr : residual + row * kCols4;
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      const int k = i * kWarp + lane;
      const float4 d = Bf16x4ToFloat4(dyr[k]), v = xr[k], g = gamma[k];
      float4 out;
      out.x = rs * (d.x * g.x - mean_g - (v.x - mu) * rs * mean_gx);
      out.y = rs * (d.y * g.y - mean_g - (v.y - mu) * rs * mean_gx);
      out.z = rs * (d.z * g.z - mean_g - (v.z - mu) * rs * mean_gx);
      out.w = rs * (d.w * g.w - mean_g - (v.w - mu) * rs * mean_gx);
      if (rr != nullptr) {
        const float4 r = rr[k];
        out.x += r.x;
        out.y += r.y;
        out.z += r.z;
        out.w += r.w;
      }
      dxr[k] = out;
    }
  }
  // The block's partial sums: warps 0..3 in order, the same order every run.
  BlockPartial<kVecs>(shared, acc_g, partial_dgamma + static_cast<int64_t>(blockIdx.x) * kCols4);
  if (kCentered) BlockPartial<kVecs>(shared, acc_b, partial_dbeta + static_cast<int64_t>(blockIdx.x) * kCols4);
}

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 132;
  return sms;
}

template <int kVecs, bool kCentered>
cudaError_t LaunchNormBackward(const uint16_t* dy, const float* x, const float* gamma, const float* mean,
                               const float* rstd, const float* residual, float* dx, float* pg, float* pb, int64_t rows,
                               cudaStream_t stream) {
  constexpr int kCols = kVecs * 128;
  const size_t shared = sizeof(float) * kNormWarps * kCols;
  auto kernel = NormBackwardKernel<kVecs, kCentered>;
  if (shared > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared));
    if (e != cudaSuccess) return e;
  }
  const int64_t blocks = NormBackwardPartials(rows);
  kernel<<<static_cast<unsigned int>(blocks), kWarp * kNormWarps, shared, stream>>>(
      reinterpret_cast<const uint2*>(dy), reinterpret_cast<const float4*>(x), reinterpret_cast<const float4*>(gamma),
      mean, rstd, reinterpret_cast<const float4*>(residual), reinterpret_cast<float4*>(dx), reinterpret_cast<float4*>(pg), reinterpret_cast<float4*>(pb), rows);
  return cudaGetLastError();
}

template <int kVecs>
cudaError_t LaunchEither(const uint16_t* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* res, float* dx, float* pg, float* pb, int64_t rows, cudaStream_t stream) {
  return mean != nullptr ? LaunchNormBackward<kVecs, true>(dy, x, gamma, mean, rstd, res, dx, pg, pb, rows, stream)
                         : LaunchNormBackward<kVecs, false>(dy, x, gamma, mean, rstd, res, dx, pg, pb, rows, stream);
}

// The row lengths compiled (kVecs x 128 elements): each is two fully unrolled kernels for three
// architectures, so every length of 128..4096 would add 13 MB to each binary that links this.
cudaError_t DispatchNormBackward(int vecs, const uint16_t* dy, const float* x, const float* gamma, const float* mean,
                                 const float* rstd, const float* res, float* dx, float* pg, float* pb, int64_t rows,
                                 cudaStream_t stream) {
  switch (vecs) {
#define STAGEHAND_NORM_BACKWARD_CASE(V) \
  case V: return LaunchEither<V>(dy, x, gamma, mean, rstd, res, dx, pg, pb, rows, stream);
    STAGEHAND_NORM_BACKWARD_CASE(1)
    STAGEHAND_NORM_BACKWARD_CASE(2)
    STAGEHAND_NORM_BACKWARD_CASE(4)
    STAGEHAND_NORM_BACKWARD_CASE(6)
    STAGEHAND_NORM_BACKWARD_CASE(8)
    STAGEHAND_NORM_BACKWARD_CASE(12)
    STAGEHAND_NORM_BACKWARD_CASE(16)
    STAGEHAND_NORM_BACKWARD_CASE(24)
    STAGEHAND_NORM_BACKWARD_CASE(32)
#undef STAGEHAND_NORM_BACKWARD_CASE
    default: return cudaErrorInvalidValue;
  }
}

// (max, sum of exp(v - max)) pairs, merged.
__device__ __forceinline__ void Merge(float& m, float& s, float m2, float s2) {
  const float mm = fmaxf(m, m2);
  if (mm == -INFINITY) return;  // both empty
  s = s * __expf(m - mm) + s2 * __expf(m2 - mm);
  m = mm;
}

__device__ __forceinline__ float Bf16At(const uint16_t* p, int64_t i) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p + i));
}

// One block per row: an online log-sum-exp over the row (eight bf16 at a time where the row allows).
__global__ void __launch_bounds__(kCeThreads)
    CrossEntropyForwardKernel(const uint16_t* __restrict__ logits, const int64_t* __restrict__ targets,
                              float* __restrict__ row_loss, float* __restrict__ lse_out, int64_t vocab,
                              int64_t ignore_index, bool vectors) {
  const int64_t row = blockIdx.x;
  const uint16_t* p = logits + row * vocab;
  float m = -INFINITY, s = 0.f;
  if (vectors) {
    const uint4* p8 = reinterpret_cast<const uint4*>(p);
    for (int64_t j = threadIdx.x; j < vocab / 8; j += kCeThreads) {
      const uint4 u = p8[j];
      const unsigned int w[4] = {u.x, u.y, u.z, u.w};
      float v[8];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]));
        v[2 * q] = f.x;
        v[2 * q + 1] = f.y;
      }
      float local = v[0];
#pragma unroll
      for (int q = 1; q < 8; ++q) local = fmaxf(local, v[q]);
      if (local > m) {
        s *= __expf(m - local);
        m = local;
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) s += __expf(v[q] - m);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kCeThreads) {
      const float v = Bf16At(p, j);
      if (v > m) {
        s *= __expf(m - v);
        m = v;
      }
      s += __expf(v - m);
    }
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, offset), s2 = __shfl_xor_sync(0xffffffffu, s, offset);
    Merge(m, s, m2, s2);
  }
  __shared__ float ms[kCeThreads / kWarp], ss[kCeThreads / kWarp];
  if (threadIdx.x % kWarp == 0) {
    ms[threadIdx.x / kWarp] = m;
    ss[threadIdx.x / kWarp] = s;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kCeThreads / kWarp; ++w) Merge(m, s, ms[w], ss[w]);
  const float lse = m + logf(s);
  lse_out[row] = lse;
  const int64_t t = targets[row];
  row_loss[row] = t == ignore_index ? 0.f : (t < 0 || t >= vocab) ? NAN : lse - Bf16At(p, t);
}

__device__ __forceinline__ unsigned int PackBf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&h);
}

__global__ void __launch_bounds__(kCeThreads)
    CrossEntropyBackwardKernel(const uint16_t* __restrict__ logits, const int64_t* __restrict__ targets,
                               const float* __restrict__ lse, const float* __restrict__ scale,
                               uint16_t* __restrict__ dlogits, int64_t vocab, int64_t ignore_index, bool vectors) {
  const int64_t row = blockIdx.x;
  const uint16_t* p = logits + row * vocab;
  uint16_t* g = dlogits + row * vocab;
  const int64_t t = targets[row];
  const float sc = t == ignore_index ? 0.f : scale[0], l = lse[row];
  if (vectors) {
    const uint4* p8 = reinterpret_cast<const uint4*>(p);
    uint4* g8 = reinterpret_cast<uint4*>(g);
    for (int64_t j = threadIdx.x; j < vocab / 8; j += kCeThreads) {
      const uint4 u = p8[j];
      const unsigned int w[4] = {u.x, u.y, u.z, u.w};
      unsigned int o[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]));
        const int64_t c = 8 * j + 2 * q;
        const float a = (__expf(f.x - l) - (c == t ? 1.f : 0.f)) * sc;
        const float b = (__expf(f.y - l) - (c + 1 == t ? 1.f : 0.f)) * sc;
        o[q] = PackBf16x2(a, b);
      }
      g8[j] = make_uint4(o[0], o[1], o[2], o[3]);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += kCeThreads) {
      const float v = (__expf(Bf16At(p, j) - l) - (j == t ? 1.f : 0.f)) * sc;
      *reinterpret_cast<__nv_bfloat16*>(g + j) = __float2bfloat16_rn(v);
    }
  }
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool NormBackwardSupports(int64_t cols) {
  if (cols <= 0 || cols % 128 != 0) return false;
  switch (cols / 128) {
    case 1: case 2: case 4: case 6: case 8: case 12: case 16: case 24: case 32: return true;
    default: return false;
  }
}

int64_t NormBackwardPartials(int64_t rows) {
  static const int sms = SmCount();
  const int64_t by_rows = (rows + kNormWarps - 1) / kNormWarps;
  const int64_t cap = 2LL * sms;
  return by_rows < 1 ? 1 : by_rows < cap ? by_rows : cap;
}

cudaError_t NormBackward(const uint16_t* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* residual, float* dx, float* partial_dgamma, float* partial_dbeta, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  if (!NormBackwardSupports(cols) || rows < 0) return cudaErrorInvalidValue;
  if (!Aligned(dy, 8) || !Aligned(x, 16) || !Aligned(gamma, 16) || !Aligned(dx, 16) || !Aligned(partial_dgamma, 16)) {
    return cudaErrorInvalidValue;
  }
  if (mean != nullptr && (partial_dbeta == nullptr || !Aligned(partial_dbeta, 16))) return cudaErrorInvalidValue;
  if (residual != nullptr && !Aligned(residual, 16)) return cudaErrorInvalidValue;
  return DispatchNormBackward(static_cast<int>(cols / 128), dy, x, gamma, mean, rstd, residual, dx, partial_dgamma,
                                 partial_dbeta, rows, stream);
}

cudaError_t CrossEntropyForward(const uint16_t* logits, const int64_t* targets, float* row_loss, float* lse,
                                int64_t rows, int64_t vocab, int64_t ignore_index, cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const bool vectors = vocab % 8 == 0 && Aligned(logits, 16);
  CrossEntropyForwardKernel<<<static_cast<unsigned int>(rows), kCeThreads, 0, stream>>>(logits, targets, row_loss, lse,
                                                                                      vocab, ignore_index, vectors);
  return cudaGetLastError();
}

cudaError_t CrossEntropyBackward(const uint16_t* logits, const int64_t* targets, const float* lse, const float* scale,
                                 uint16_t* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream) {
  if (rows < 0 || vocab <= 0 || rows > 0x7fffffff) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  const bool vectors = vocab % 8 == 0 && Aligned(logits, 16) && Aligned(dlogits, 16);
  CrossEntropyBackwardKernel<<<static_cast<unsigned int>(rows), kCeThreads, 0, stream>>>(
      logits, targets, lse, scale, dlogits, vocab, ignore_index, vectors);
  return cudaGetLastError();
}

}  // namespace stagehand
