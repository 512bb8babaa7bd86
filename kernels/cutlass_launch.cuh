// What the CUTLASS 3.x SM90 GEMMs of gemm_gelu.cu and gemm_residual.cu share: the device check and the
// launch of a configured GemmUniversalAdapter (no workspace, the caller's stream). CUDA only (nvcc).
#ifndef STAGEHAND_WORKER_CUTLASS_LAUNCH_CUH_
#define STAGEHAND_WORKER_CUTLASS_LAUNCH_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "cutlass/cutlass.h"

namespace stagehand {
namespace cutlass_launch {

// Whether the current device (the first one asked about: the answer is kept) is compute capability 9.0,
// which the sm_90a kernels need.
inline bool Sm90Available() {
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return available;
}

// Whether m, n and k are positive and fit CUTLASS's int problem shape.
inline bool ProblemFits(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  return m > 0 && n > 0 && k > 0 && m <= kMax && n <= kMax && k <= kMax;
}

// The persistent scheduler's SM count (of the first device asked about; an H100/H200's 132 if unknown).
inline int SmCount() {
  static const int sms = [] {
    int device = 0, n = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return 132;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0) return 132;
    return n;
  }();
  return sms;
}

// Launches `args` (problem, operands and epilogue filled in by the caller) on `stream` with the given
// raster swizzle. cudaErrorInvalidValue where CUTLASS refuses the problem and cudaErrorNotSupported where
// the schedule would need a workspace (one would need memory ordered with the stream and legal under
// graph capture, the caller's allocator's: refused rather than improvised here); nothing was queued in
// either case. A failed launch gives the device's sticky error where there is one, else cudaErrorUnknown
// (the adapter has already taken a launch error from cudaGetLastError; it logs it only in CUTLASS's
// debug builds).
template <class Gemm>
cudaError_t Launch(typename Gemm::Arguments& args, int swizzle, cudaStream_t stream) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaErrorInvalidDevice;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = SmCount();
  args.scheduler.max_swizzle_size = swizzle;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (Gemm::get_workspace_size(args) != 0) return cudaErrorNotSupported;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.run(stream) == cutlass::Status::kSuccess) return cudaSuccess;
  const cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? e : cudaErrorUnknown;
}

}  // namespace cutlass_launch
}  // namespace stagehand

#endif  // STAGEHAND_WORKER_CUTLASS_LAUNCH_CUH_
