// The GpuMonitor of a real GPU, through NVML (nvml_api.h), found by its UUID (the form CUDA and
// nvidia-smi print, "GPU-xxxxxxxx-..."). NVML sees every GPU of the host whatever
// CUDA_VISIBLE_DEVICES says, so a worker pinned to one GPU can still read its links to the others.
#ifndef STAGEHAND_TELEMETRY_NVML_MONITOR_H_
#define STAGEHAND_TELEMETRY_NVML_MONITOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "telemetry/gpu_monitor.h"
#include "telemetry/nvml_api.h"

namespace stagehand {

// The monitor of the GPU with `uuid`, over `api` (LoadNvml(), or fake functions in tests).
// NOT_FOUND when NVML has no such GPU; FAILED_PRECONDITION when NVML cannot be loaded.
absl::StatusOr<std::unique_ptr<GpuMonitor>> OpenNvmlMonitor(const nvml::Api& api, const std::string& uuid);
absl::StatusOr<std::unique_ptr<GpuMonitor>> OpenNvmlMonitor(const std::string& uuid);

// The pre-flight readings of the GPU with `uuid`; available=false with the reason where NVML cannot
// be loaded or does not know the GPU (so that the gate can say so rather than the worker fail).
GpuHealth ReadGpuHealth(const std::string& uuid);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_NVML_MONITOR_H_
