// Device bring-up through the CUDA runtime API (no LibTorch headers here).
#include "worker/device.h"

#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/gpu_uuid.h"

namespace stagehand {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<DeviceInfo> InitCudaDevice() {
  if (cudaError_t e = cudaSetDevice(0); e != cudaSuccess) return CudaError(e, "cudaSetDevice(0)");
  if (cudaError_t e = cudaFree(nullptr); e != cudaSuccess) return CudaError(e, "creating the CUDA context");
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, 0); e != cudaSuccess) {
    return CudaError(e, "cudaGetDeviceProperties");
  }
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes); e != cudaSuccess) {
    return CudaError(e, "cudaMemGetInfo");
  }
  DeviceInfo info;
  info.set_kind(DEVICE_KIND_CUDA);
  info.set_ordinal(0);
  info.set_uuid(FormatGpuUuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes)));
  info.set_name(prop.name);
  info.set_total_bytes(static_cast<int64_t>(total_bytes));
  info.set_free_bytes(static_cast<int64_t>(free_bytes));
  return info;
}

DeviceInfo CpuDeviceInfo() {
  DeviceInfo info;
  info.set_kind(DEVICE_KIND_CPU);
  info.set_name("cpu");
  return info;
}

}  // namespace stagehand
