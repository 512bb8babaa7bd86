// What a worker reads of its GPU: a sample (clocks, power, temperature, throttling) many times a run,
// and the pre-flight health readings once. The seam between NVML (nvml_monitor.h) and the logic that
// uses the readings (sampler.h, health.h); fake_gpu_monitor.h serves tests.
#ifndef STAGEHAND_TELEMETRY_GPU_MONITOR_H_
#define STAGEHAND_TELEMETRY_GPU_MONITOR_H_

#include "absl/status/statusor.h"
#include "protos/telemetry.pb.h"

namespace stagehand {

class GpuMonitor {
 public:
  virtual ~GpuMonitor() = default;
  // One reading now (unix_micros set by the caller's clock or the monitor's). Thread-compatible: the
  // sampler calls it from its own thread only.
  virtual absl::StatusOr<GpuSample> Sample() = 0;
  // The pre-flight readings; what the GPU does not report is left unset. Never fails: a reading NVML
  // refuses outright makes available false with the error.
  virtual GpuHealth ReadHealth() = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_GPU_MONITOR_H_
