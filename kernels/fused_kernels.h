// CUDA kernels of our own, for what LibTorch does in several passes over memory. Plain CUDA (no
// LibTorch headers): compiled by nvcc in a genrule (kernels/BUILD.bazel) and called from the models' LibTorch code.
#ifndef STAGEHAND_KERNELS_FUSED_KERNELS_H_
#define STAGEHAND_KERNELS_FUSED_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Whether LayerNormToBf16 takes rows of `cols` elements: a multiple of 128, at most 4096.
bool LayerNormToBf16Supports(int64_t cols);

// LayerNorm of fp32 rows, written as bf16: y = bf16((x - mean) * rstd * gamma + beta), with
// rstd = 1 / sqrt(var + eps) and the biased variance, as torch.nn.functional.layer_norm followed by a
// cast to bf16 computes it, in one pass over memory instead of three (read x, write fp32 y, read it,
// write bf16). mean and rstd (fp32, one per row) are what at::native_layer_norm_backward takes.
// x: [rows, cols] contiguous; gamma, beta: [cols]; y: [rows, cols] bf16 (as uint16 bits); x, gamma, beta
// and y 16-byte aligned (the kernel moves four elements at a time). cudaErrorInvalidValue for a row
// length it does not take or a misaligned pointer; otherwise the launch's error (cudaSuccess when it
// was queued on `stream`).
cudaError_t LayerNormToBf16(const float* x, const float* gamma, const float* beta, uint16_t* y, float* mean,
                            float* rstd, int64_t rows, int64_t cols, float eps, cudaStream_t stream);

// RMSNorm of fp32 rows, written as bf16: y = bf16(x * rstd * gamma), rstd = 1 / sqrt(mean(x^2) + eps),
// as Llama's RMSNorm in fp32 followed by a cast to bf16 computes it, in one pass over memory. rstd
// (fp32, one per row) is kept for the backward. The same row lengths, layout and alignment as
// LayerNormToBf16 (LayerNormToBf16Supports), and the same errors.
cudaError_t RmsNormToBf16(const float* x, const float* gamma, uint16_t* y, float* rstd, int64_t rows, int64_t cols,
                          float eps, cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_FUSED_KERNELS_H_
