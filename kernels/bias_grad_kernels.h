// CUDA kernels for the linear layers' bias gradients (column sums of dy) fused with the pass that makes
// dy: the cast of an fp32 gradient to bf16, or the assembly of attention's q, k, v gradients into the
// qkv projection's [B, S, 3H] gradient. Plain CUDA (no LibTorch headers), compiled by nvcc in a genrule
// (kernels/BUILD.bazel); the LibTorch wrappers are in nn/nn.cc (ColumnSums, CastWithColumnSums,
// AssembleHeadsGrad).
#ifndef STAGEHAND_KERNELS_BIAS_GRAD_KERNELS_H_
#define STAGEHAND_KERNELS_BIAS_GRAD_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Whether the kernels take rows of `cols` columns: a positive multiple of 8 (16-byte vectors of bf16).
bool ColumnSumsSupports(int64_t cols);

// How many rows of partial sums the kernels write for a [rows, cols] input: the caller passes a
// workspace of [ColumnSumPartials(rows, cols), cols] fp32 (16-byte aligned).
int64_t ColumnSumPartials(int64_t rows, int64_t cols);

// Every kernel below sums its bf16 values over rows in fp32: each block sums a fixed chunk of rows into
// one row of `partial`, and a second, short kernel adds the partial rows in order into sums[cols]. The
// summation order is fixed, so the results are deterministic. Pointers 16-byte aligned, rows >= 1;
// cudaErrorInvalidValue for columns ColumnSumsSupports refuses or a misaligned pointer, else the
// launch's error. With `accumulate`, sums[c] += the column's sum (what autograd's add of the sums into
// a parameter's .grad gives, without its kernel) instead of sums[c] = it.

// sums[c] = sum over r of x[r, c], x [rows, cols] bf16 contiguous.
cudaError_t ColumnSumsBf16(const uint16_t* x, float* partial, float* sums, int64_t rows, int64_t cols,
                           cudaStream_t stream, bool accumulate = false);

// y = bf16(x) (round to nearest even, as .to(bf16)) and sums[c] = sum over r of y[r, c] (of the rounded
// values: what summing the cast copy gives), x [rows, cols] fp32 contiguous, y bf16 contiguous.
cudaError_t CastBf16WithColumnSums(const float* x, uint16_t* y, float* partial, float* sums, int64_t rows, int64_t cols,
                                   cudaStream_t stream, bool accumulate = false);

// One of q, k, v as [B, NH, S, D] bf16 with the last dimension contiguous: element (b, h, s, d) at
// data[b * stride_b + h * stride_h + s * stride_s + d] (strides in elements, multiples of 8).
struct HeadsGradView {
  const uint16_t* data;
  int64_t stride_b, stride_h, stride_s;
};

// dqkv [B * S, 3 * NH * D] bf16 contiguous (the gradient of the qkv projection's output [B, S, 3H] that
// is viewed as [B, S, 3, NH, D]): dqkv[b * S + s, i * H + h * D + d] = grads[i](b, h, s, d), and
// sums[c] = sum over rows of dqkv[., c] (the qkv bias's gradient), in one pass. head_dim a multiple of 8.
cudaError_t AssembleHeadsGradWithColumnSums(const HeadsGradView grads[3], int64_t batch, int64_t heads, int64_t seq,
                                            int64_t head_dim, uint16_t* dqkv, float* partial, float* sums,
                                            cudaStream_t stream, bool accumulate = false);

// sums[c] (+)= the sum of partial[p, c] over p = 0 .. parts - 1, in that order (the second pass above, for
// partial rows another kernel wrote: the norm and GELU backward's), partial [parts, cols] fp32 contiguous.
cudaError_t SumPartialRows(const float* partial, float* sums, int64_t parts, int64_t cols, bool accumulate,
                           cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_BIAS_GRAD_KERNELS_H_
