// AdamW over many fp32 tensors in one launch that also writes each parameter's bf16 copy (the one the
// linear layers' forward reads) and, if asked, zeroes its gradient: the step ATen's _fused_adamw_
// takes, the cast pass the next forward would make, and the zeroing the next step's accumulation needs,
// in one pass over the parameters. Plain CUDA (no LibTorch headers), compiled by nvcc in a genrule
// (kernels/BUILD.bazel); the LibTorch side is FusedAdamW::Step in nn/nn.cc.
#ifndef STAGEHAND_KERNELS_ADAMW_KERNELS_H_
#define STAGEHAND_KERNELS_ADAMW_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Elements [begin, end) of one parameter: its fp32 value, gradient and moments (contiguous, 16-byte
// aligned), its bf16 copy (may be null: none written), and its step count (one fp32 on the device,
// already advanced for this step, as ATen's kernel reads it).
struct AdamWSlice {
  float* param;
  float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* copy;
  const float* step;
  int64_t begin, end;
};

// How many elements a slice holds at most (the caller cuts tensors into slices of this size).
constexpr int64_t kAdamWSliceElements = 65536;

// One block per slice (slices: a device array of `count`). The update is ATen's fused AdamW's formula
// (mode ADAMW, no amsgrad, no maximize, no grad scaling): the bias corrections in double from the step
// count then rounded to float, the moments and the decay in double arithmetic rounded to float, the
// step in float. It agrees with ATen's kernel within a few float ulps, not bit for bit (adamw_test). The bf16 copy
// rounds the new parameter to nearest even (what .to(bf16) gives); zero_grad writes 0 to the gradient after reading it.
cudaError_t AdamWStep(const AdamWSlice* slices, int64_t count, double lr, double beta1, double beta2,
                      double weight_decay, double eps, bool zero_grad, cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_ADAMW_KERNELS_H_
