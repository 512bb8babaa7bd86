// See gelu_kernels.h.
#include "kernels/gelu_kernels.h"

#include <cuda_bf16.h>

namespace stagehand {
namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 8;                 // warps per block: each takes every kWarps-th row of the part
constexpr int kVec = 8;                   // bf16 columns per thread (16 bytes)
constexpr int kBlockCols = kWarp * kVec;  // 256 columns per block
constexpr int kBlocksPerSm = 4;           // 64 registers and 24 KiB of shared memory a block
constexpr int64_t kMaxParts = 64;
constexpr int64_t kRowsPerPart = 128;

// gelu'(x) for the bf16 values 2^-12 <= |x| < 2^4 (exponent fields 115 .. 130, both signs: 4096), looked
// up in shared memory by the value's bits; every other value (zero, tiny, large, inf, NaN) computed.
constexpr unsigned kTableExpLo = 115;
constexpr unsigned kTableHalf = 16 * 128;  // 16 exponents x 128 mantissas of one sign
constexpr unsigned kTable = 2 * kTableHalf;

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 132;
  return sms;
}

__device__ __forceinline__ unsigned int PackBf16x2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&h);
}

// ATen's GeluCUDAKernelImpl backward (approximate='none') is dy * (cdf + x * pdf): this is the
// (cdf + x * pdf) factor with the same fp32 operations (erff, expf), so dy times it is ATen's value.
__device__ __forceinline__ float GeluFactor(float x) {
  constexpr float kAlpha = 0.70710678118654752440f;                 // 1/sqrt(2)
  constexpr float kBeta = 1.12837916709551257390f * kAlpha * 0.5f;  // 1/sqrt(2 pi)
  const float cdf = 0.5f * (1.f + erff(x * kAlpha));
  const float pdf = expf(-0.5f * x * x) * kBeta;
  return cdf + x * pdf;
}

__device__ __forceinline__ float Bf16BitsToFloat(unsigned bits) { return __uint_as_float(bits << 16); }

// The rare values outside the table, out of line (inlined at each of a row's eight values, the erff and
// expf sequences would crowd the registers that keep the loads in flight).
__device__ __noinline__ float GeluFactorOfBits(unsigned b) { return GeluFactor(Bf16BitsToFloat(b)); }

// The table entry of bf16 bits b, or kTable for a value outside the table.
__device__ __forceinline__ unsigned TableIndex(unsigned b) {
  const unsigned rel = (b & 0x7fffu) - (kTableExpLo << 7);  // wraps for values below the table
  return rel < kTableHalf ? rel | ((b >> 4) & kTableHalf) : kTable;
}

// gelu'(x) of bf16 bits b (the low 16 bits): the table's, or computed where the table has none (a rare
// branch: the warp runs it only where one of its lanes has such a value).
__device__ __forceinline__ float Factor(const float* table, unsigned b) {
  const unsigned i = TableIndex(b);
  float f = table[i & (kTable - 1)];
  if (i == kTable) f = GeluFactorOfBits(b & 0xffffu);
  return f;
}

// One row's eight columns: dh = bf16(da * gelu'(h)) written, the unrounded products added to acc.
__device__ __forceinline__ void GeluRow(const float* table, const uint4& ga, const uint4& hx, uint4* out,
                                        float (&acc)[kVec]) {
  const unsigned g[4] = {ga.x, ga.y, ga.z, ga.w}, x[4] = {hx.x, hx.y, hx.z, hx.w};
  unsigned o[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const float lo = Bf16BitsToFloat(g[q] & 0xffffu) * Factor(table, x[q] & 0xffffu);
    const float hi = __uint_as_float(g[q] & 0xffff0000u) * Factor(table, x[q] >> 16);
    acc[2 * q] += lo;
    acc[2 * q + 1] += hi;
    o[q] = PackBf16x2(lo, hi);
  }
  *out = make_uint4(o[0], o[1], o[2], o[3]);
}

// Block (column chunk blockIdx.x, blockIdx.y) first fills the gelu' table (every thread some entries),
// then takes parts blockIdx.y, + gridDim.y, ...: lane l of every warp owns columns chunk * 256 + 8 l .. + 7
// and sums them over the warp's rows of the part (every kWarps-th, ascending) in registers; kLoads rows'
// da and h are loaded before any is used (loads in flight). The warps' sums are then added in shared
// memory in warp order, so every run adds in the same order (and as the one-part-a-block kernel did).
constexpr int kLoads = 4;
__global__ void __launch_bounds__(kWarp* kWarps, kBlocksPerSm)
    GeluBackwardBiasKernel(const uint4* __restrict__ da, const uint4* __restrict__ h, uint4* __restrict__ dh,
                           float* __restrict__ partial, int64_t rows, int64_t cols, int64_t rows_per_part,
                           int64_t parts) {
  __shared__ float sums[kWarps][kBlockCols];
  __shared__ float table[kTable];
  for (unsigned i = threadIdx.x; i < kTable; i += kWarp * kWarps) {
    const unsigned b = ((i & kTableHalf) << 4) | ((i & (kTableHalf - 1)) + (kTableExpLo << 7));
    table[i] = GeluFactor(Bf16BitsToFloat(b));
  }
  __syncthreads();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kBlockCols + lane * kVec;
  const int64_t cols8 = cols / kVec, c8 = col / kVec;
  for (int64_t part = blockIdx.y; part < parts; part += gridDim.y) {
    const int64_t begin = part * rows_per_part;
    const int64_t end = begin + rows_per_part < rows ? begin + rows_per_part : rows;
    float acc[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) acc[i] = 0.f;
    if (col < cols) {
      int64_t r = begin + warp;
      for (; r + (kLoads - 1) * kWarps < end; r += kLoads * kWarps) {
        uint4 ga[kLoads], hx[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int64_t at = (r + u * kWarps) * cols8 + c8;
          ga[u] = __ldg(da + at);
          hx[u] = __ldg(h + at);
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) GeluRow(table, ga[u], hx[u], dh + (r + u * kWarps) * cols8 + c8, acc);
      }
      for (; r < end; r += kWarps) {
        const int64_t at = r * cols8 + c8;
        GeluRow(table, __ldg(da + at), __ldg(h + at), dh + at, acc);
      }
    }
#pragma unroll
    for (int i = 0; i < kVec; ++i) sums[warp][lane * kVec + i] = acc[i];
    __syncthreads();
    const int c = threadIdx.x;  // kWarp * kWarps == kBlockCols: one column per thread
    const int64_t out_col = static_cast<int64_t>(blockIdx.x) * kBlockCols + c;
    if (out_col < cols) {
      float s = sums[0][c];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) s += sums[w][c];
      partial[part * cols + out_col] = s;
    }
    __syncthreads();  // sums[] is written again for the next part
  }
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
  if (!GeluBackwardSupports(cols) || rows < 0 || !Aligned(da) || !Aligned(h) || !Aligned(dh) || partial_db == nullptr) {
    return cudaErrorInvalidValue;
  }
  const int64_t parts = GeluBackwardPartials(rows);
  const int64_t rows_per_part = (rows + parts - 1) / parts;
  const int64_t chunks = (cols + kBlockCols - 1) / kBlockCols;
  if (chunks > 0x7fffffff) return cudaErrorInvalidValue;
  // One wave of blocks, each taking an equal number of parts (so that it fills its gelu' table once
  // for several parts): parts / ceil(parts / want) blocks down the rows.
  static const int sms = SmCount();
  const int64_t want = (kBlocksPerSm * sms + chunks - 1) / chunks;
  const int64_t per_block = (parts + want - 1) / want;
  const int64_t blocks_down = (parts + per_block - 1) / per_block;
  const dim3 grid(static_cast<unsigned int>(chunks), static_cast<unsigned int>(blocks_down));
  GeluBackwardBiasKernel<<<grid, kWarp * kWarps, 0, stream>>>(
      reinterpret_cast<const uint4*>(da), reinterpret_cast<const uint4*>(h), reinterpret_cast<uint4*>(dh), partial_db,
      rows, cols, rows_per_part < 1 ? 1 : rows_per_part, parts);
  return cudaGetLastError();
}

}  // namespace stagehand
