// One cuBLASLt matrix product that ATen does not offer: bf16 inputs, an fp32 bias and an fp32 addend,
// accumulated and written in fp32. It is the residual block's "x + proj(h)" in one GEMM: the epilogue
// reads the fp32 residual stream and writes the new stream, where a bf16 GEMM output and a separate add
// would write the branch, read it back with the stream and write the sum (gpt-1.3b on an H200: the add
// is 66 us per block half and micro-batch of 8, 12.6 ms of a 0.51 s training step; 134 us and 26 ms of
// a 0.32 s inference step of 4 x 16 sequences).
//
// No LibTorch here: the caller passes LibTorch's cuBLASLt handle, workspace and stream. The functions
// come from the cuBLASLt that LibTorch already loaded (found by symbol, so the process holds one copy
// of the library, the one LibTorch's cuBLAS was built with); where there is none, LtAvailable() is false.
#ifndef STAGEHAND_KERNELS_LT_GEMM_H_
#define STAGEHAND_KERNELS_LT_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace stagehand {

// Whether this process has cuBLASLt's functions (LibTorch's CUDA libraries are loaded).
bool LtAvailable();

// d[m, n] = x[m, k] w[n, k]^T + bias[n] + c[m, n], row-major and contiguous: x and w bf16 (as raw
// bits), bias (may be null), c and d fp32; d may equal c. Computed in fp32 (CUBLAS_COMPUTE_32F).
// Returns "" when the product was queued on `stream`, else why not (nothing was queued then: the
// caller computes the sum another way; DenseImpl::ForwardResidual's falls back to ATen). Plans
// (descriptors) are cached per shape, alignment and bias pointer; the algorithm, the fastest of the
// heuristic's first eight timed on the first call's operands outside graph capture, per shape and
// alignment, so layers of one shape share one timing and one algorithm (the timing holds a process-wide
// lock, a few tens of ms once per shape); a shape cuBLASLt refuses is refused again without asking.
std::string LtLinearAddFp32(void* lt_handle, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            const void* x, const void* w, const float* bias, const float* c, float* d, int64_t m,
                            int64_t n, int64_t k);

// How many times this process has chosen an algorithm by timing the heuristic's (a test's view of the
// cache LtLinearAddFp32 keeps: a second layer of a known shape adds none; a shape is timed again only
// after the cache was cleared or when the heuristic no longer offers the cached choice).
int64_t LtAlgorithmTimings();

}  // namespace stagehand

#endif  // STAGEHAND_KERNELS_LT_GEMM_H_
