// What GPUs this machine shows the launcher, read through the CUDA driver API loaded at run time, so
// that the launcher starts (and runs CPU workers) on machines without a GPU or driver.
#ifndef STAGEHAND_LAUNCHER_PLAN_DEVICES_H_
#define STAGEHAND_LAUNCHER_PLAN_DEVICES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace stagehand {

struct GpuInfo {
  int ordinal = 0;   // index among the visible devices
  std::string uuid;  // "GPU-xxxxxxxx-...", usable in CUDA_VISIBLE_DEVICES
  std::string name;
  int64_t total_bytes = 0;
};

struct DeviceInventory {
  std::vector<GpuInfo> gpus;
  std::string cuda_visible_devices;  // the variable as the launcher saw it ("" when unset)
  bool cuda_visible_devices_set = false;
  std::string note;  // why no GPU is visible, when none is ("no CUDA driver (libcuda.so.1)", ...)
  // The machine, for capping CPU workers (0: unknown, not capped by it).
  int cpu_cores = 0;         // cores this process may run on (sched_getaffinity)
  int64_t memory_bytes = 0;  // MemAvailable (else physical memory)
};

// Queries the driver (cuInit, cuDeviceGetCount, ...). Never fails: problems end up in `note`.
DeviceInventory QueryDevices();

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_PLAN_DEVICES_H_
