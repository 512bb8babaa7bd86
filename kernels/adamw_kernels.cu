// See adamw_kernels.h.
#include "kernels/adamw_kernels.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

namespace stagehand {
namespace {

constexpr int kThreads = 512;

// ATen's adam_math for one element (fused_adam_utils.cuh, ADAMW) as written there: lr, beta1, beta2,
// weight_decay and eps doubles, the values float, the bias corrections float. The compiled arithmetic
// differs from ATen's by a few ulps (contractions), which adamw_test bounds.
__device__ __forceinline__ void Update(float& param, float grad, float& exp_avg, float& exp_avg_sq, double lr,
                                       double beta1, double beta2, double weight_decay, double eps,
                                       float bias_correction1, float bias_correction2_sqrt) {
  if (weight_decay != 0) param -= lr * weight_decay * param;
  exp_avg = beta1 * exp_avg + (1 - beta1) * grad;
  exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad;
  const float step_size = lr / bias_correction1;
  const float denom = (sqrtf(exp_avg_sq) / bias_correction2_sqrt) + eps;
  param -= step_size * exp_avg / denom;
}

__global__ void __launch_bounds__(kThreads) AdamWKernel(const AdamWSlice* __restrict__ slices, double lr, double beta1,
                                                        double beta2, double weight_decay, double eps, bool zero_grad) {
  const AdamWSlice s = slices[blockIdx.x];
  const double step = *s.step;
  const float bias_correction1 = static_cast<float>(1 - pow(beta1, step));
  const float bias_correction2_sqrt = static_cast<float>(sqrt(1 - pow(beta2, step)));
  // float4 over the slice (begin is a multiple of 4: slices start at multiples of kAdamWSliceElements),
  // the last < 4 elements one by one.
  const int64_t n = s.end - s.begin, n4 = n / 4;
  float4* p4 = reinterpret_cast<float4*>(s.param + s.begin);
  float4* g4 = reinterpret_cast<float4*>(s.grad + s.begin);
  float4* m4 = reinterpret_cast<float4*>(s.exp_avg + s.begin);
  float4* v4 = reinterpret_cast<float4*>(s.exp_avg_sq + s.begin);
  for (int64_t i = threadIdx.x; i < n4; i += kThreads) {
    float4 p = p4[i], g = g4[i], m = m4[i], v = v4[i];
    Update(p.x, g.x, m.x, v.x, lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt);
    Update(p.y, g.y, m.y, v.y, lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt);
    Update(p.z, g.z, m.z, v.z, lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt);
    Update(p.w, g.w, m.w, v.w, lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt);
    p4[i] = p;
    m4[i] = m;
    v4[i] = v;
    if (zero_grad) g4[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (s.copy != nullptr) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(p.x, p.y), hi = __floats2bfloat162_rn(p.z, p.w);
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned int*>(&lo);
      packed.y = *reinterpret_cast<const unsigned int*>(&hi);
      reinterpret_cast<uint2*>(s.copy + s.begin)[i] = packed;
    }
  }
  for (int64_t i = n4 * 4 + threadIdx.x; i < n; i += kThreads) {
    const int64_t at = s.begin + i;
    float p = s.param[at], m = s.exp_avg[at], v = s.exp_avg_sq[at];
    Update(p, s.grad[at], m, v, lr, beta1, beta2, weight_decay, eps, bias_correction1, bias_correction2_sqrt);
    s.param[at] = p;
    s.exp_avg[at] = m;
    s.exp_avg_sq[at] = v;
    if (zero_grad) s.grad[at] = 0.f;
    if (s.copy != nullptr) {
      const __nv_bfloat16 b = __float2bfloat16_rn(p);
      s.copy[at] = *reinterpret_cast<const uint16_t*>(&b);
    }
  }
}

}  // namespace

cudaError_t AdamWStep(const AdamWSlice* slices, int64_t count, double lr, double beta1, double beta2,
                      double weight_decay, double eps, bool zero_grad, cudaStream_t stream) {
  if (count < 0 || count > INT32_MAX) return cudaErrorInvalidValue;
  if (count == 0) return cudaSuccess;
  AdamWKernel<<<static_cast<unsigned int>(count), kThreads, 0, stream>>>(slices, lr, beta1, beta2, weight_decay, eps,
                                                                         zero_grad);
  return cudaGetLastError();
}

}  // namespace stagehand
