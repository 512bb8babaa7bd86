// CUDA kernels for elementwise parts of a decoder that eager LibTorch runs as several passes (each a
// kernel, most in fp32): rotary position embeddings and SwiGLU, forward and backward, in bf16 with fp32
// arithmetic. Plain CUDA (no LibTorch headers), compiled by nvcc in a genrule (kernels/BUILD.bazel); the
// autograd functions around them are in models/llama/llama_stage.cc.
#ifndef STAGEHAND_KERNELS_FUSED_ELEMENTWISE_KERNELS_H_
#define STAGEHAND_KERNELS_FUSED_ELEMENTWISE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Rotary embeddings on x [batch, seq, heads, dim] bf16 contiguous (dim even), Hugging Face's rotate_half
// pairing: with h = dim / 2, for j < h
//   y[j]     = x[j] cos[p, j]         - x[j + h] sin[p, j]
//   y[j + h] = x[j + h] cos[p, j + h] + x[j] sin[p, j + h]
// where p is the token's position (its index in seq) and cos, sin are [>= seq, dim] fp32 tables. In
// fp32, rounded to bf16 once (eager: x cos and rotate_half(x) sin in fp32, added, then cast).
// With `backward` it computes the transpose instead (dy in x's place, dx in y's):
//   dx[j] = dy[j] cos[p, j] + dy[j + h] sin[p, j + h],  dx[j + h] = dy[j + h] cos[p, j + h] - dy[j] sin[p, j].
// cudaErrorInvalidValue for an odd dim or 2^31 pairs (x.numel() / 2) or more, else the launch's error.
cudaError_t RotaryBf16(const uint16_t* x, const float* cos, const float* sin, uint16_t* y, int64_t batch, int64_t seq,
                       int64_t heads, int64_t dim, bool backward, cudaStream_t stream);

// SwiGLU: y = silu(gate) up, elementwise over n bf16 values, in fp32 and rounded once.
cudaError_t SwiGluForward(const uint16_t* gate, const uint16_t* up, uint16_t* y, int64_t n, cudaStream_t stream);

// Its backward from dy: dgate = dy up silu'(gate), dup = dy silu(gate), with
// silu'(g) = s (1 + g (1 - s)), s = sigmoid(g).
cudaError_t SwiGluBackward(const uint16_t* gate, const uint16_t* up, const uint16_t* dy, uint16_t* dgate, uint16_t* dup,
                           int64_t n, cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_FUSED_ELEMENTWISE_KERNELS_H_
