// See fused_backward_kernels.h.
#include "kernels/fused_backward_kernels.h"

#include <cuda_bf16.h>

#include <cmath>

namespace stagehand {
namespace {

constexpr int kWarp = 32;
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

__device__ __forceinline__ void Bf16x8ToFloat(uint4 u, float (&f)[8]) {
  const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float2 t = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[q]));
    f[2 * q] = t.x;
    f[2 * q + 1] = t.y;
  }
}

// Row groups a norm-backward block holds for rows of threads_per_row threads: up to 1024 threads, and
// at most 15 groups when a row spans warps (each such group syncs on its own named barrier, 1 .. 15).
__host__ __device__ constexpr int NormRowsPerBlock(int threads_per_row) {
  return threads_per_row <= kWarp ? 1024 / threads_per_row
                                  : (1024 / threads_per_row < 15 ? 1024 / threads_per_row : 15);
}

// The norm backward's shape for rows of kVecs * 128 elements: a group of kCols / 8 threads takes a row,
// eight columns a thread (one 16-byte load of dy, two of x); kRows groups make a block of 768 to 1024
// threads, one block a multiprocessor, so one row of partial sums a multiprocessor for the caller.
template <int kVecs>
struct NormBackwardShape {
  static constexpr int kCols = kVecs * 128;
  static constexpr int kThreadsPerRow = kCols / 8;  // 16 .. 512
  static constexpr int kRows = NormRowsPerBlock(kThreadsPerRow);
  static constexpr int kThreads = kRows * kThreadsPerRow;  // 768 .. 1024
  static constexpr int kWarpsPerRow = kThreadsPerRow >= kWarp ? kThreadsPerRow / kWarp : 1;
  // Blocks resident on a multiprocessor (about 1024 threads): __launch_bounds__ keeps the registers
  // low enough for them, and the grid is that many blocks per multiprocessor, one wave.
  static constexpr int kBlocksPerSm = 1024 / kThreads > 1 ? 1024 / kThreads : 1;
};

// NormBackwardShape<kVecs>::kBlocksPerSm and ::kRows for a row length (host side).
int NormBlocksPerSm(int64_t cols) {
  if (cols < 8) return 1;  // a length the kernel does not take (NormBackwardSupports)
  const int threads = NormRowsPerBlock(static_cast<int>(cols / 8)) * static_cast<int>(cols / 8);
  return 1024 / threads > 1 ? 1024 / threads : 1;
}
int NormRows(int64_t cols) { return cols < 8 ? 1 : NormRowsPerBlock(static_cast<int>(cols / 8)); }

// Barrier `id` (1 .. 15) of `threads` threads (a multiple of 32): one row group's, so that the groups
// of a block do not wait for each other.
__device__ __forceinline__ void GroupSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// The sum over the kThreadsPerRow threads of a row's group, in a fixed order: shuffles within a warp
// (or half a warp for 16 threads), then the group's warps through shared memory (two slots a warp,
// alternating with `parity`, so one barrier a row suffices). Every thread of the group calls it.
template <int kVecs>
__device__ __forceinline__ float2 RowSum(float2 v, float2* shared, int parity) {
  using S = NormBackwardShape<kVecs>;
  constexpr int kLanes = S::kThreadsPerRow < kWarp ? S::kThreadsPerRow : kWarp;
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, offset);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, offset);
  }
  if (S::kWarpsPerRow == 1) return v;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float2* slots = shared + parity * (S::kThreads / kWarp);
  if (lane == 0) slots[warp] = v;
  const int group = threadIdx.x / S::kThreadsPerRow;
  GroupSync(1 + group, S::kThreadsPerRow);
  const int first = group * S::kWarpsPerRow;
  float2 sum = slots[first];
#pragma unroll
  for (int w = 1; w < S::kWarpsPerRow; ++w) {
    sum.x += slots[first + w].x;
    sum.y += slots[first + w].y;
  }
  return sum;
}

// Each block takes kRows rows at a time (rows blockIdx.x * kRows + group, then a grid's worth further
// on); thread t of a row's group owns columns 8t .. 8t + 7, keeps dy and x of them in registers for
// dx, and its share of dgamma and dbeta in registers across rows. Then the block's groups add those in
// shared memory, group 0 first, and the block writes one row of partial sums. Few registers a thread,
// so many rows are in flight on each multiprocessor (a one-warp-a-row kernel keeps 128 accumulators a
// thread and runs at about half the H200's memory bandwidth).
template <int kVecs, bool kCentered>
__global__ void __launch_bounds__(NormBackwardShape<kVecs>::kThreads, NormBackwardShape<kVecs>::kBlocksPerSm)
    NormBackwardKernel(const uint4* __restrict__ dy, const float4* __restrict__ x, const float4* __restrict__ gamma,
                       const float* __restrict__ mean, const float* __restrict__ rstd,
                       const float4* __restrict__ residual, float4* __restrict__ dx,
                       float4* __restrict__ partial_dgamma, float4* __restrict__ partial_dbeta, int64_t rows) {
  using S = NormBackwardShape<kVecs>;
  constexpr int kCols8 = S::kCols / 8;  // uint4 of dy (and pairs of float4 of x) per row
  static_assert(S::kWarpsPerRow == 1 || S::kRows <= 15, "one named barrier a row group");
  __shared__ float2 sums[2 * (S::kThreads / kWarp > 0 ? S::kThreads / kWarp : 1)];
  __shared__ float4 part[S::kRows > 1 ? S::kRows * S::kCols / 4 : 1];
  const int t = threadIdx.x % S::kThreadsPerRow, group = threadIdx.x / S::kThreadsPerRow;
  float acc_g[8], acc_b[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) acc_g[i] = acc_b[i] = 0.f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * S::kRows;
  // Every thread of a group runs the same iterations (RowSum synchronises the group); rows past the
  // end read nothing.
  int parity = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * S::kRows; base < rows; base += stride, parity ^= 1) {
    const int64_t row = base + group;
    const bool live = row < rows;
    float d[8], v[8];
    float4 r0 = make_float4(0.f, 0.f, 0.f, 0.f), r1 = r0;  // the residual's, loaded with dy and x
    float mu = 0.f, rs = 0.f;
    float2 local = make_float2(0.f, 0.f);  // (sum g, sum g xhat) of this thread's columns
    if (live) {
      mu = kCentered ? mean[row] : 0.f;
      rs = rstd[row];
      Bf16x8ToFloat(dy[row * kCols8 + t], d);
      const float4 x0 = x[row * 2 * kCols8 + 2 * t], x1 = x[row * 2 * kCols8 + 2 * t + 1];
      if (residual != nullptr) {
        r0 = residual[row * 2 * kCols8 + 2 * t];
        r1 = residual[row * 2 * kCols8 + 2 * t + 1];
      }
      v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w, v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
      // gamma from L1 each row (not kept in registers: those keep the residual's load in flight); d
      // becomes dy gamma once the sums of dy have it.
      const float4 g0 = __ldg(gamma + 2 * t), g1 = __ldg(gamma + 2 * t + 1);
      const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float h = (v[i] - mu) * rs, dg = d[i] * g[i];
        local.x += dg;
        local.y += dg * h;
        acc_g[i] += d[i] * h;
        if (kCentered) acc_b[i] += d[i];
        d[i] = dg;
      }
    }
    const float2 total = RowSum<kVecs>(local, sums, parity);
    if (live) {
      const float mean_g = kCentered ? total.x / S::kCols : 0.f, mean_gx = total.y / S::kCols;
      float out[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) out[i] = rs * (d[i] - mean_g - (v[i] - mu) * rs * mean_gx);
      if (residual != nullptr) {
        out[0] += r0.x, out[1] += r0.y, out[2] += r0.z, out[3] += r0.w;
        out[4] += r1.x, out[5] += r1.y, out[6] += r1.z, out[7] += r1.w;
      }
      dx[row * 2 * kCols8 + 2 * t] = make_float4(out[0], out[1], out[2], out[3]);
      dx[row * 2 * kCols8 + 2 * t + 1] = make_float4(out[4], out[5], out[6], out[7]);
    }
  }
  // The block's partial sums, its groups added in order (group 0 first).
  float4* pg = partial_dgamma + static_cast<int64_t>(blockIdx.x) * (S::kCols / 4);
  float4* pb = kCentered ? partial_dbeta + static_cast<int64_t>(blockIdx.x) * (S::kCols / 4) : nullptr;
  auto write = [&](const float(&acc)[8], float4* out) {
    if constexpr (S::kRows == 1) {
      out[2 * t] = make_float4(acc[0], acc[1], acc[2], acc[3]);
      out[2 * t + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
      return;
    }
    part[group * (S::kCols / 4) + 2 * t] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    part[group * (S::kCols / 4) + 2 * t + 1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    __syncthreads();
    if (group == 0) {
      for (int h = 0; h < 2; ++h) {
        float4 s = part[2 * t + h];
        for (int r = 1; r < S::kRows; ++r) {
          const float4 q = part[r * (S::kCols / 4) + 2 * t + h];
          s.x += q.x, s.y += q.y, s.z += q.z, s.w += q.w;
        }
        out[2 * t + h] = s;
      }
    }
    __syncthreads();
  };
  write(acc_g, pg);
  if (kCentered) write(acc_b, pb);
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
  const int64_t blocks = NormBackwardPartials(rows, kVecs * 128);
  NormBackwardKernel<kVecs, kCentered>
      <<<static_cast<unsigned int>(blocks), NormBackwardShape<kVecs>::kThreads, 0, stream>>>(
          reinterpret_cast<const uint4*>(dy), reinterpret_cast<const float4*>(x),
          reinterpret_cast<const float4*>(gamma), mean, rstd, reinterpret_cast<const float4*>(residual),
          reinterpret_cast<float4*>(dx), reinterpret_cast<float4*>(pg), reinterpret_cast<float4*>(pb), rows);
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
  case V:                               \
    return LaunchEither<V>(dy, x, gamma, mean, rstd, res, dx, pg, pb, rows, stream);
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
    default:
      return cudaErrorInvalidValue;
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
    case 1:
    case 2:
    case 4:
    case 6:
    case 8:
    case 12:
    case 16:
    case 24:
    case 32:
      return true;
    default:
      return false;
  }
}

// One wave of blocks (about 1024 threads per multiprocessor): enough rows in flight to keep the memory
// busy, and few partial rows for the caller's sum (one a multiprocessor for most lengths: the caller's
// sum over 528 rows of 2048 took 11 us). A block may get no row (it writes zeros).
int64_t NormBackwardPartials(int64_t rows, int64_t cols) {
  static const int sms = SmCount();
  const int64_t cap = static_cast<int64_t>(NormBlocksPerSm(cols)) * sms;
  const int64_t need = (rows + NormRows(cols) - 1) / NormRows(cols);
  return rows < 1 ? 1 : need < cap ? need : cap;
}

cudaError_t NormBackward(const uint16_t* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* residual, float* dx, float* partial_dgamma, float* partial_dbeta, int64_t rows,
                         int64_t cols, cudaStream_t stream) {
  if (!NormBackwardSupports(cols) || rows < 0) return cudaErrorInvalidValue;
  if (!Aligned(dy, 16) || !Aligned(x, 16) || !Aligned(gamma, 16) || !Aligned(dx, 16) || !Aligned(partial_dgamma, 16)) {
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
