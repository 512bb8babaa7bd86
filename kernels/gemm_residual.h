// The residual block's "c + x W^T + b" with an fp32 addend and output as one CUTLASS 3.x SM90 GEMM (bf16
// operands, fp32 accumulation, an epilogue that adds the fp32 bias and the fp32 stream): the same product
// as LtLinearAddFp32 (lt_gemm.h), in a tile schedule cuBLASLt's heuristic does not offer for it (a
// ping-pong kernel, whose one warp group's fp32 epilogue overlaps the other's MMAs). Plain CUDA (no
// LibTorch headers), sm_90a only; the caller checks GemmResidualAvailable().
#ifndef STAGEHAND_KERNELS_GEMM_RESIDUAL_H_
#define STAGEHAND_KERNELS_GEMM_RESIDUAL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace stagehand {

// Whether the current device runs the kernels (compute capability 9.0: sm_90a code).
bool GemmResidualAvailable();

// Whether the kernels take an [m, k] x [n, k]^T problem: k a multiple of 8 and n of 4 (TMA wants
// 16-byte strides), all positive and below 2^31.
bool GemmResidualSupports(int64_t m, int64_t n, int64_t k);

// d[m, n] = x[m, k] w[n, k]^T + bias[n] + c[m, n], row-major and contiguous: x and w bf16 (as raw bits),
// bias fp32 (may be null), c and d fp32, not overlapping. Every pointer 16-byte aligned. `variant` picks
// a tile configuration: 0 the model's, the others for the microbenchmark (GemmResidualVariants() in
// all). cudaErrorInvalidValue for a shape or pointer it does not take; cudaErrorNotSupported off sm_90
// or for a schedule that would need a workspace; nothing was queued in those cases. Otherwise the
// launch's outcome (cudaErrorUnknown for a failed launch: cutlass_launch.cuh).
cudaError_t GemmResidualFp32(const uint16_t* x, const uint16_t* w, const float* bias, const float* c, float* d,
                             int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant = 0);

// How many tile configurations there are, and a name for each (for the microbenchmark).
int GemmResidualVariants();
const char* GemmResidualVariantName(int variant);

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_GEMM_RESIDUAL_H_
