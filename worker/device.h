// Brings up the worker's device: the one GPU the launcher pinned it to (CUDA_VISIBLE_DEVICES), or the CPU.
#ifndef STAGEHAND_WORKER_DEVICE_H_
#define STAGEHAND_WORKER_DEVICE_H_

#include "absl/status/statusor.h"
#include "protos/job.pb.h"

namespace stagehand {

// Creates the CUDA context on device 0 and describes the device (UUID, name, memory).
absl::StatusOr<DeviceInfo> InitCudaDevice();

DeviceInfo CpuDeviceInfo();

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_DEVICE_H_
