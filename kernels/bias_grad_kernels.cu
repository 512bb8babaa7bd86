// See bias_grad_kernels.h.
#include "kernels/bias_grad_kernels.h"

#include <cuda_bf16.h>

#include <type_traits>

namespace stagehand {
namespace {

// A block is kColThreads x kRowThreads threads: a warp across 256 columns (8 per thread, one 16-byte
// vector of bf16: 512 contiguous bytes per warp and row), kRowThreads warps down the block's rows.
constexpr int kColThreads = 32;
constexpr int kRowThreads = 8;
constexpr int kVec = 8;
constexpr int kBlockCols = kColThreads * kVec;

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 132;
  return sms;
}

int64_t ColBlocks(int64_t cols) { return (cols + kBlockCols - 1) / kBlockCols; }

// Blocks of 256 threads resident on a multiprocessor: __launch_bounds__ holds the batched-load kernel's
// registers to 64 (the loads in flight need them); its grid is one wave of them.
constexpr int kBlocksPerSm = 4;

// Rows per block: enough blocks for one full wave of `blocks_per_sm` blocks a multiprocessor, at least 32
// rows each so that the partial sums stay a small fraction of the traffic.
int64_t RowsPerChunk(int64_t rows, int64_t cols, int blocks_per_sm) {
  static const int sms = SmCount();
  const int64_t want = (static_cast<int64_t>(blocks_per_sm) * sms + ColBlocks(cols) - 1) / ColBlocks(cols);
  int64_t per = (rows + want - 1) / want;
  per = (per + kRowThreads - 1) / kRowThreads * kRowThreads;
  return per < 32 ? 32 : per;
}

bool Aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

__device__ __forceinline__ void Unpack(const uint4& u, float (&f)[kVec]) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

// The values to sum at (row r, columns c..c+7) in two steps, so that the kernel can have several rows'
// loads in flight: Load (the memory read; Column is what the thread's column fixes, set up once) and
// Use (written where the op makes an output, and unpacked to fp32). kLoads rows are loaded at a time.
struct Bf16Source {
  static constexpr int kBlocksPerSm = stagehand::kBlocksPerSm;
  static constexpr int kLoads = 8;
  using Raw = uint4;
  using Column = int64_t;
  const uint16_t* x;
  int64_t cols;
  __device__ __forceinline__ Column At(int64_t c) const { return c; }
  __device__ __forceinline__ Raw Load(Column c, int64_t r) const {
    return __ldg(reinterpret_cast<const uint4*>(x + r * cols + c));
  }
  __device__ __forceinline__ void Use(Column, int64_t, const Raw& u, float (&f)[kVec]) const { Unpack(u, f); }
};

struct CastSource {
  static constexpr int kBlocksPerSm = stagehand::kBlocksPerSm;
  static constexpr int kLoads = 4;
  struct Raw {
    float4 a, b;
  };
  using Column = int64_t;
  const float* x;
  uint16_t* y;
  int64_t cols;
  __device__ __forceinline__ Column At(int64_t c) const { return c; }
  __device__ __forceinline__ Raw Load(Column c, int64_t r) const {
    const float4* p = reinterpret_cast<const float4*>(x + r * cols + c);
    return {__ldcs(p), __ldcs(p + 1)};  // read once: streamed past the caches
  }
  __device__ __forceinline__ void Use(Column c, int64_t r, const Raw& v, float (&f)[kVec]) const {
    uint4 u;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
    h[0] = __floats2bfloat162_rn(v.a.x, v.a.y);
    h[1] = __floats2bfloat162_rn(v.a.z, v.a.w);
    h[2] = __floats2bfloat162_rn(v.b.x, v.b.y);
    h[3] = __floats2bfloat162_rn(v.b.z, v.b.w);
    *reinterpret_cast<uint4*>(y + r * cols + c) = u;
    Unpack(u, f);  // the sums are of the rounded values, as a sum of the cast copy's
  }
};

// The q, k, v assembly runs RowByRowPartialsKernel (8 blocks a multiprocessor): the batched-load kernel
// with this source takes 67.8 us against its 60.9 (gpt-1.3b, H200, bench/results/2026-12-01-backward-kernels.md).
struct HeadsSource {
  static constexpr int kBlocksPerSm = 8;
  HeadsGradView g[3];
  int64_t seq, heads, head_dim, cols;  // cols = 3 * heads * head_dim
  uint16_t* out;
  __device__ __forceinline__ void operator()(int64_t r, int64_t c, float (&f)[kVec]) const {
    const int64_t hidden = heads * head_dim;
    const int which = static_cast<int>(c / hidden);
    const int64_t within = c - which * hidden, h = within / head_dim, d = within - h * head_dim;
    const int64_t b = r / seq, s = r - b * seq;
    const HeadsGradView& v = g[which];
    const uint4 u =
        __ldg(reinterpret_cast<const uint4*>(v.data + b * v.stride_b + h * v.stride_h + s * v.stride_s + d));
    *reinterpret_cast<uint4*>(out + r * cols + c) = u;
    Unpack(u, f);
  }
};

// The end of both partial-sum kernels below: the block's kRowThreads rows of per-thread sums (acc, 8
// columns each) added in shared memory, row 0 first, into row blockIdx.y of `partial`.
__device__ __forceinline__ void BlockPartialRow(const float (&acc)[kVec], float (&shared)[kRowThreads][kBlockCols],
                                                float* __restrict__ partial, int64_t cols) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) shared[threadIdx.y][threadIdx.x * kVec + i] = acc[i];
  __syncthreads();
  const int q = threadIdx.y * kColThreads + threadIdx.x;  // the block's column this thread finishes
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kBlockCols + q;
  if (col < cols) {
    float s = shared[0][q];
#pragma unroll
    for (int w = 1; w < kRowThreads; ++w) s += shared[w][q];
    partial[static_cast<int64_t>(blockIdx.y) * cols + col] = s;
  }
}

// One row at a time (Source's operator() loads, writes and unpacks it), otherwise as ColumnPartialsKernel.
template <class Source>
__global__ void __launch_bounds__(kColThreads* kRowThreads)
    RowByRowPartialsKernel(Source source, float* __restrict__ partial, int64_t rows, int64_t cols,
                           int64_t rows_per_chunk) {
  __shared__ float shared[kRowThreads][kBlockCols];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[kVec] = {};
  if (c < cols) {
#pragma unroll 4
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowThreads) {
      float f[kVec];
      source(r, c, f);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += f[i];
    }
  }
  BlockPartialRow(acc, shared, partial, cols);
}

// Block (x, y) sums rows [y * rows_per_chunk, ...) of columns [x * 256, x * 256 + 256) into row y of
// `partial`: each thread keeps its 8 columns' sums in registers over its rows (every kRowThreads-th,
// ascending; Source::kLoads rows' loads issued before any is used), then the block adds its kRowThreads
// rows of sums in shared memory, row 0 first.
template <class Source>
__global__ void __launch_bounds__(kColThreads* kRowThreads, kBlocksPerSm)
    ColumnPartialsKernel(Source source, float* __restrict__ partial, int64_t rows, int64_t cols,
                         int64_t rows_per_chunk) {
  constexpr int kLoads = Source::kLoads;
  __shared__ float shared[kRowThreads][kBlockCols];
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x) * kVec;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc[kVec] = {};
  if (c < cols) {
    const typename Source::Column col = source.At(c);
    int64_t r = r0 + threadIdx.y;
    for (; r + (kLoads - 1) * kRowThreads < r1; r += kLoads * kRowThreads) {
      typename Source::Raw raw[kLoads];
#pragma unroll
      for (int u = 0; u < kLoads; ++u) raw[u] = source.Load(col, r + u * kRowThreads);
#pragma unroll
      for (int u = 0; u < kLoads; ++u) {
        float f[kVec];
        source.Use(col, r + u * kRowThreads, raw[u], f);
#pragma unroll
        for (int i = 0; i < kVec; ++i) acc[i] += f[i];
      }
    }
    for (; r < r1; r += kRowThreads) {
      float f[kVec];
      source.Use(col, r, source.Load(col, r), f);
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[i] += f[i];
    }
  }
  BlockPartialRow(acc, shared, partial, cols);
}

// sums[c] = the partial rows' sum for column c: a block takes 32 columns (128 contiguous bytes per row
// for a warp), its kRowThreads warps every kRowThreads-th partial row, then warp 0 adds the warps' sums
// in order. One thread per column summing every row in turn took 7.5 us per call (gpt-1.3b's shapes).
__global__ void __launch_bounds__(kColThreads* kRowThreads)
    FinishSumsKernel(const float* __restrict__ partial, float* __restrict__ sums, int64_t parts, int64_t cols,
                     bool accumulate) {
  __shared__ float shared[kRowThreads][kColThreads];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kColThreads + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    for (int64_t p = threadIdx.y; p < parts; p += kRowThreads) s += partial[p * cols + c];
  }
  shared[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
#pragma unroll
  for (int w = 1; w < kRowThreads; ++w) s += shared[w][threadIdx.x];
  sums[c] = accumulate ? sums[c] + s : s;  // accumulate: what autograd's add of the sums into .grad gives
}

template <class Source>
cudaError_t Launch(const Source& source, float* partial, float* sums, int64_t rows, int64_t cols, cudaStream_t stream,
                   bool accumulate) {
  if (rows < 1 || !ColumnSumsSupports(cols) || !Aligned(partial)) return cudaErrorInvalidValue;
  const int64_t per = RowsPerChunk(rows, cols, Source::kBlocksPerSm), parts = (rows + per - 1) / per;
  const dim3 grid(static_cast<unsigned>(ColBlocks(cols)), static_cast<unsigned>(parts));
  if constexpr (std::is_same_v<Source, HeadsSource>) {
    RowByRowPartialsKernel<Source>
        <<<grid, dim3(kColThreads, kRowThreads), 0, stream>>>(source, partial, rows, cols, per);
  } else {
    ColumnPartialsKernel<Source><<<grid, dim3(kColThreads, kRowThreads), 0, stream>>>(source, partial, rows, cols, per);
  }
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  FinishSumsKernel<<<static_cast<unsigned>((cols + kColThreads - 1) / kColThreads), dim3(kColThreads, kRowThreads), 0,
                     stream>>>(partial, sums, parts, cols, accumulate);
  return cudaGetLastError();
}

}  // namespace

bool ColumnSumsSupports(int64_t cols) { return cols > 0 && cols % kVec == 0; }

// Room for either grid (Launch's: 4 or 8 blocks a multiprocessor); FinishSums adds the rows written.
int64_t ColumnSumPartials(int64_t rows, int64_t cols) {
  if (rows < 1 || cols < 1) return 1;
  int64_t most = 1;
  for (int blocks_per_sm : {kBlocksPerSm, HeadsSource::kBlocksPerSm}) {
    const int64_t per = RowsPerChunk(rows, cols, blocks_per_sm), parts = (rows + per - 1) / per;
    most = parts > most ? parts : most;
  }
  return most;
}

cudaError_t ColumnSumsBf16(const uint16_t* x, float* partial, float* sums, int64_t rows, int64_t cols,
                           cudaStream_t stream, bool accumulate) {
  if (!Aligned(x)) return cudaErrorInvalidValue;
  return Launch(Bf16Source{x, cols}, partial, sums, rows, cols, stream, accumulate);
}

cudaError_t CastBf16WithColumnSums(const float* x, uint16_t* y, float* partial, float* sums, int64_t rows, int64_t cols,
                                   cudaStream_t stream, bool accumulate) {
  if (!Aligned(x) || !Aligned(y)) return cudaErrorInvalidValue;
  return Launch(CastSource{x, y, cols}, partial, sums, rows, cols, stream, accumulate);
}

cudaError_t AssembleHeadsGradWithColumnSums(const HeadsGradView grads[3], int64_t batch, int64_t heads, int64_t seq,
                                            int64_t head_dim, uint16_t* dqkv, float* partial, float* sums,
                                            cudaStream_t stream, bool accumulate) {
  if (head_dim <= 0 || head_dim % kVec != 0 || heads <= 0 || seq <= 0 || !Aligned(dqkv)) return cudaErrorInvalidValue;
  HeadsSource source{{grads[0], grads[1], grads[2]}, seq, heads, head_dim, 3 * heads * head_dim, dqkv};
  for (const HeadsGradView& v : source.g) {
    if (!Aligned(v.data) || v.stride_b % kVec != 0 || v.stride_h % kVec != 0 || v.stride_s % kVec != 0) {
      return cudaErrorInvalidValue;
    }
  }
  return Launch(source, partial, sums, batch * seq, source.cols, stream, accumulate);
}

cudaError_t SumPartialRows(const float* partial, float* sums, int64_t parts, int64_t cols, bool accumulate,
                           cudaStream_t stream) {
  if (parts < 1 || cols < 1 || cols > (int64_t{1} << 36)) return cudaErrorInvalidValue;
  FinishSumsKernel<<<static_cast<unsigned>((cols + kColThreads - 1) / kColThreads), dim3(kColThreads, kRowThreads), 0,
                     stream>>>(partial, sums, parts, cols, accumulate);
  return cudaGetLastError();
}

}  // namespace stagehand
