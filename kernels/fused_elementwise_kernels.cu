// See fused_elementwise_kernels.h.
#include "kernels/fused_elementwise_kernels.h"

#include <cuda_bf16.h>

namespace stagehand {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const uint16_t* p, int64_t i) {
  return __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(p + i));
}
__device__ __forceinline__ void Store(uint16_t* p, int64_t i, float v) {
  *reinterpret_cast<__nv_bfloat16*>(p + i) = __float2bfloat16_rn(v);
}

// A thread per (row, j < h) pair: it reads x[j] and x[j + h] and writes both outputs. 32-bit index
// arithmetic (the caller refuses 2^31 pairs or more): 64-bit division would cost more than the bytes.
__global__ void __launch_bounds__(kThreads)
    RotaryKernel(const uint16_t* __restrict__ x, const float* __restrict__ cos, const float* __restrict__ sin,
                 uint16_t* __restrict__ y, unsigned int pairs, unsigned int seq, unsigned int heads, unsigned int dim,
                 bool backward) {
  const unsigned int half = dim / 2;
  for (unsigned int i = blockIdx.x * kThreads + threadIdx.x; i < pairs; i += gridDim.x * kThreads) {
    const unsigned int row = i / half, j = i - row * half;  // row: (b, s, head)
    const unsigned int pos = (row / heads) % seq;
    const float* c = cos + static_cast<size_t>(pos) * dim;
    const float* s = sin + static_cast<size_t>(pos) * dim;
    const size_t base = static_cast<size_t>(row) * dim;
    const float a = Load(x, base + j), b = Load(x, base + j + half);
    if (!backward) {
      Store(y, base + j, a * c[j] - b * s[j]);
      Store(y, base + j + half, b * c[j + half] + a * s[j + half]);
    } else {
      Store(y, base + j, a * c[j] + b * s[j + half]);
      Store(y, base + j + half, b * c[j + half] - a * s[j]);
    }
  }
}

__device__ __forceinline__ float2 Unpack(unsigned int u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
__device__ __forceinline__ unsigned int Pack(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&h);
}
__device__ __forceinline__ float Sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

// Two bf16 at a time (n even and 4-byte aligned), else one.
__global__ void __launch_bounds__(kThreads)
    SwiGluForwardKernel(const uint16_t* __restrict__ gate, const uint16_t* __restrict__ up, uint16_t* __restrict__ y,
                        int64_t n, bool pairs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (pairs) {
    const unsigned int* g2 = reinterpret_cast<const unsigned int*>(gate);
    const unsigned int* u2 = reinterpret_cast<const unsigned int*>(up);
    unsigned int* y2 = reinterpret_cast<unsigned int*>(y);
    for (int64_t i = start; i < n / 2; i += stride) {
      const float2 g = Unpack(g2[i]), u = Unpack(u2[i]);
      y2[i] = Pack(g.x * Sigmoid(g.x) * u.x, g.y * Sigmoid(g.y) * u.y);
    }
  } else {
    for (int64_t i = start; i < n; i += stride) {
      const float g = Load(gate, i);
      Store(y, i, g * Sigmoid(g) * Load(up, i));
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    SwiGluBackwardKernel(const uint16_t* __restrict__ gate, const uint16_t* __restrict__ up,
                         const uint16_t* __restrict__ dy, uint16_t* __restrict__ dgate, uint16_t* __restrict__ dup,
                         int64_t n, bool pairs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  auto one = [](float g, float u, float d, float& dg, float& du) {
    const float s = Sigmoid(g);
    du = d * g * s;
    dg = d * u * s * (1.f + g * (1.f - s));
  };
  if (pairs) {
    const unsigned int* g2 = reinterpret_cast<const unsigned int*>(gate);
    const unsigned int* u2 = reinterpret_cast<const unsigned int*>(up);
    const unsigned int* d2 = reinterpret_cast<const unsigned int*>(dy);
    unsigned int* dg2 = reinterpret_cast<unsigned int*>(dgate);
    unsigned int* du2 = reinterpret_cast<unsigned int*>(dup);
    for (int64_t i = start; i < n / 2; i += stride) {
      const float2 g = Unpack(g2[i]), u = Unpack(u2[i]), d = Unpack(d2[i]);
      float ga, gb, ua, ub;
      one(g.x, u.x, d.x, ga, ua);
      one(g.y, u.y, d.y, gb, ub);
      dg2[i] = Pack(ga, gb);
      du2[i] = Pack(ua, ub);
    }
  } else {
    for (int64_t i = start; i < n; i += stride) {
      float dg, du;
      one(Load(gate, i), Load(up, i), Load(dy, i), dg, du);
      Store(dgate, i, dg);
      Store(dup, i, du);
    }
  }
}

unsigned int Blocks(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned int>(blocks < 1 ? 1 : blocks > 65536 ? 65536 : blocks);
}

bool Aligned4(const void* p) { return reinterpret_cast<uintptr_t>(p) % 4 == 0; }

}  // namespace

cudaError_t RotaryBf16(const uint16_t* x, const float* cos, const float* sin, uint16_t* y, int64_t batch, int64_t seq,
                       int64_t heads, int64_t dim, bool backward, cudaStream_t stream) {
  if (dim <= 0 || dim % 2 != 0 || batch < 0 || seq <= 0 || heads <= 0) return cudaErrorInvalidValue;
  const int64_t pairs = batch * seq * heads * (dim / 2);
  if (pairs >= (int64_t{1} << 31)) return cudaErrorInvalidValue;
  if (pairs == 0) return cudaSuccess;
  RotaryKernel<<<Blocks(pairs), kThreads, 0, stream>>>(x, cos, sin, y, static_cast<unsigned int>(pairs),
                                                       static_cast<unsigned int>(seq), static_cast<unsigned int>(heads),
                                                       static_cast<unsigned int>(dim), backward);
  return cudaGetLastError();
}

cudaError_t SwiGluForward(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool pairs = n % 2 == 0 && Aligned4(gate) && Aligned4(up) && Aligned4(y);
  SwiGluForwardKernel<<<Blocks(pairs ? n / 2 : n), kThreads, 0, stream>>>(gate, up, y, n, pairs);
  return cudaGetLastError();
}

cudaError_t SwiGluBackward(const uint16_t* gate, const uint16_t* up, const uint16_t* dy, uint16_t* dgate, uint16_t* dup,
                           int64_t n, cudaStream_t stream) {
  if (n < 0) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const bool pairs = n % 2 == 0 && Aligned4(gate) && Aligned4(up) && Aligned4(dy) && Aligned4(dgate) && Aligned4(dup);
  SwiGluBackwardKernel<<<Blocks(pairs ? n / 2 : n), kThreads, 0, stream>>>(gate, up, dy, dgate, dup, n, pairs);
  return cudaGetLastError();
}

}  // namespace stagehand
