// The backward of y = gelu(h) (exact, erf) fused with the column sums that are its linear layer's bias
// gradient. Plain CUDA (no LibTorch headers): compiled by nvcc in a genrule (kernels/BUILD.bazel) and
// called from nn/nn.cc's LinearGeluFunction.
#ifndef STAGEHAND_KERNELS_GELU_KERNELS_H_
#define STAGEHAND_KERNELS_GELU_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Whether GeluBackwardBias takes rows of `cols` elements: a positive multiple of 8.
bool GeluBackwardSupports(int64_t cols);

// The number of partial rows GeluBackwardBias writes for `rows` rows (the caller sums them).
int64_t GeluBackwardPartials(int64_t rows);

// dh = bf16(da * gelu'(h)) with gelu'(h) = Phi(h) + h phi(h), the erf GELU's derivative as ATen's
// GeluBackward computes it (fp32 math), and partial_db[p][c] = the fp32 sum of the unrounded da * gelu'(h)
// over part p's rows of column c, each part's sum in a fixed order (deterministic). da, h, dh: [rows,
// cols] bf16 (uint16 bits), row-major, 16-byte aligned; partial_db: [GeluBackwardPartials(rows), cols]
// fp32. cudaErrorInvalidValue for a row length it does not take or a misaligned pointer; otherwise the
// launch's error.
cudaError_t GeluBackwardBias(const uint16_t* da, const uint16_t* h, uint16_t* dh, float* partial_db, int64_t rows,
                             int64_t cols, cudaStream_t stream);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_GELU_KERNELS_H_
