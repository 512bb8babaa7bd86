// CUDA kernels for the backward passes and the loss that LibTorch runs in many passes over memory: the
// LayerNorm and RMSNorm backward from a bf16 gradient, and the token cross-entropy over bf16 logits
// without an fp32 copy of them. Plain CUDA (no LibTorch headers), compiled by nvcc in a genrule
// (kernels/BUILD.bazel); the LibTorch code around them is in nn/nn.cc, models/llama and engine/stage.cc.
#ifndef STAGEHAND_KERNELS_FUSED_BACKWARD_KERNELS_H_
#define STAGEHAND_KERNELS_FUSED_BACKWARD_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Whether NormBackward takes rows of `cols` elements: 128 times 1, 2, 4, 6, 8, 12, 16, 24 or 32 (the
// lengths compiled; the callers fall back to ATen for others).
bool NormBackwardSupports(int64_t cols);

// How many rows of partial weight (and bias) gradients NormBackward writes for `rows` rows of `cols`:
// the caller allocates [NormBackwardPartials(rows, cols), cols] fp32 and sums it over its first dimension.
int64_t NormBackwardPartials(int64_t rows, int64_t cols);

// The backward of y = xhat * gamma (+ beta) over fp32 rows x, from dy in bf16 (the gradient of the
// norm's bf16 output, as the GEMM it feeds gives it), in one pass over dy and x:
//   LayerNorm (mean != nullptr): xhat = (x - mean) rstd, g = dy gamma,
//     dx = rstd (g - mean(g) - xhat mean(g xhat));
//   RMSNorm (mean == nullptr): xhat = x rstd, dx = rstd (g - xhat mean(g xhat)).
// dx: [rows, cols] fp32, plus `residual` [rows, cols] fp32 where given (not null, 16-byte aligned): the
// gradient that reaches x around the norm (the residual stream's), added in the same pass instead of
// autograd's separate add. partial_dgamma[p, c] (and partial_dbeta, LayerNorm only; may be null) hold the
// sums of dy xhat (and dy) over disjoint sets of rows, p < NormBackwardPartials(rows, cols): their sum over p
// is dgamma (dbeta). The summation order is fixed, so the results are deterministic. x, gamma, dy and
// dx and dy 16-byte aligned (eight bf16 at a time). cudaErrorInvalidValue for a row length
// it does not take or a misaligned pointer, else the launch's error.
cudaError_t NormBackward(const uint16_t* dy, const float* x, const float* gamma, const float* mean, const float* rstd,
                         const float* residual, float* dx, float* partial_dgamma, float* partial_dbeta, int64_t rows,
                         int64_t cols, cudaStream_t stream);

// Token cross-entropy over bf16 logits [rows, vocab] (contiguous), targets [rows] int64:
// row_loss[r] = logsumexp(logits[r]) - logits[r, targets[r]], in fp32 (the value of an fp32 upcast and
// torch's cross_entropy, without the upcast's copy), and lse[r] the log-sum-exp for the backward. A row
// whose target is `ignore_index` gets 0; a target out of [0, vocab) otherwise gets NaN (torch raises;
// a kernel cannot, and NaN cannot go unseen in the loss).
cudaError_t CrossEntropyForward(const uint16_t* logits, const int64_t* targets, float* row_loss, float* lse,
                                int64_t rows, int64_t vocab, int64_t ignore_index, cudaStream_t stream);

// dlogits[r, j] = bf16((softmax(logits[r])_j - [j == targets[r]]) * scale[0]), 0 for ignored rows:
// the gradient of scale x (the sum of row_loss), with `scale` one fp32 on the device (the loss's
// incoming gradient over the token count, read there so that nothing waits for the host).
cudaError_t CrossEntropyBackward(const uint16_t* logits, const int64_t* targets, const float* lse, const float* scale,
                                 uint16_t* dlogits, int64_t rows, int64_t vocab, int64_t ignore_index,
                                 cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_FUSED_BACKWARD_KERNELS_H_
