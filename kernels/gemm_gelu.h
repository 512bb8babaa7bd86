// fc1 + bias + exact (erf) GELU as one GEMM on Hopper: a CUTLASS 3.x SM90 kernel whose epilogue adds the
// bias and applies GELU, and optionally writes the pre-activation for the backward. Plain CUDA (no
// LibTorch headers): compiled by nvcc for sm_90a only (kernels/BUILD.bazel); the caller checks
// GemmGeluAvailable() and falls back to a GEMM and a separate GELU elsewhere.
#ifndef STAGEHAND_KERNELS_GEMM_GELU_H_
#define STAGEHAND_KERNELS_GEMM_GELU_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace stagehand {

// Whether the current device runs the kernel (compute capability 9.0: the kernel is sm_90a code).
bool GemmGeluAvailable();

// Whether the kernel takes an [m, k] x [n, k]^T problem: k and n multiples of 8 (TMA wants 16-byte
// strides), all positive and below 2^31.
bool GemmGeluSupports(int64_t m, int64_t n, int64_t k);

// a = gelu(x W^T + b) in bf16 (as uint16 bits), row-major: x [m, k], w [n, k], bias [n], a [m, n]; with
// `h` non-null, the pre-activation h = x W^T + b is written there too (bf16, [m, n]). The GEMM
// accumulates in fp32; bias and GELU (erf) are applied to the fp32 sum, and a and h are rounded to bf16
// once. Every pointer 16-byte aligned. `variant` picks a tile configuration (0: the default; others for
// the microbenchmark, GemmGeluVariants() of them). cudaErrorInvalidValue for a shape or pointer it does
// not take, cudaErrorNotSupported off sm_90 (or for a schedule that would need a workspace); in both
// cases nothing was queued. Otherwise the launch's outcome (cudaErrorUnknown for a failed launch:
// cutlass_launch.cuh).
cudaError_t GemmBiasGelu(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* a, uint16_t* h,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant = 0);

// How many tile configurations GemmBiasGelu has, and a name for each (for the microbenchmark).
int GemmGeluVariants();
const char* GemmGeluVariantName(int variant);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_GEMM_GELU_H_
