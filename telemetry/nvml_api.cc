// Loads NVML from the driver at run time (see nvml_api.h): one dlopen and one nvmlInit_v2 per process.
#include "telemetry/nvml_api.h"

#include <dlfcn.h>

#include <mutex>

#include "absl/strings/str_cat.h"

namespace stagehand {
namespace nvml {
namespace {

constexpr char kLibrary[] = "libnvidia-ml.so.1";

template <typename Fn>
void Resolve(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(lib, name));
}

absl::StatusOr<const Api*> Load() {
  void* lib = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return absl::FailedPreconditionError(absl::StrCat("no NVML (", why != nullptr ? why : kLibrary,
                                                      "): GPU telemetry and health checks need the "
                                                      "NVIDIA driver's ",
                                                      kLibrary));
  }
  // Never dlclosed: the process uses NVML until it exits, from more than one thread.
  static Api api;
  Resolve(lib, "nvmlInit_v2", api.init);
  Resolve(lib, "nvmlErrorString", api.error_string);
  Resolve(lib, "nvmlDeviceGetCount_v2", api.device_count);
  Resolve(lib, "nvmlDeviceGetHandleByIndex_v2", api.handle_by_index);
  Resolve(lib, "nvmlDeviceGetHandleByUUID", api.handle_by_uuid);
  Resolve(lib, "nvmlDeviceGetUUID", api.uuid);
  Resolve(lib, "nvmlDeviceGetName", api.name);
  Resolve(lib, "nvmlDeviceGetClockInfo", api.clock);
  Resolve(lib, "nvmlDeviceGetMaxClockInfo", api.max_clock);
  Resolve(lib, "nvmlDeviceGetPowerUsage", api.power_usage);
  Resolve(lib, "nvmlDeviceGetEnforcedPowerLimit", api.power_limit);
  Resolve(lib, "nvmlDeviceGetTemperature", api.temperature);
  Resolve(lib, "nvmlDeviceGetFanSpeed", api.fan_speed);
  Resolve(lib, "nvmlDeviceGetUtilizationRates", api.utilization);
  Resolve(lib, "nvmlDeviceGetCurrentClocksEventReasons", api.clocks_event_reasons);
  if (api.clocks_event_reasons == nullptr) {
    Resolve(lib, "nvmlDeviceGetCurrentClocksThrottleReasons", api.clocks_event_reasons);
  }
  Resolve(lib, "nvmlDeviceGetTotalEccErrors", api.ecc_errors);
  Resolve(lib, "nvmlDeviceGetRetiredPagesPendingStatus", api.retired_pages_pending);
  Resolve(lib, "nvmlDeviceGetRemappedRows", api.remapped_rows);
  Resolve(lib, "nvmlDeviceGetCurrPcieLinkGeneration", api.pcie_gen);
  Resolve(lib, "nvmlDeviceGetCurrPcieLinkWidth", api.pcie_width);
  Resolve(lib, "nvmlDeviceGetMaxPcieLinkGeneration", api.pcie_gen_max);
  Resolve(lib, "nvmlDeviceGetGpuMaxPcieLinkGeneration", api.pcie_gen_gpu_max);
  Resolve(lib, "nvmlDeviceGetMaxPcieLinkWidth", api.pcie_width_max);
  Resolve(lib, "nvmlDeviceGetP2PStatus", api.p2p_status);
  Resolve(lib, "nvmlDeviceGetTopologyCommonAncestor", api.topology);
  if (api.init == nullptr || api.error_string == nullptr || api.handle_by_uuid == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kLibrary,
                     " lacks nvmlInit_v2, nvmlErrorString or nvmlDeviceGetHandleByUUID: a driver too old "
                     "for GPU telemetry"));
  }
  if (const Return r = api.init(); r != kSuccess) {
    return absl::FailedPreconditionError(absl::StrCat("nvmlInit_v2: ", api.error_string(r)));
  }
  return &api;
}

}  // namespace

absl::StatusOr<const Api*> LoadNvml() {
  static std::once_flag once;
  static absl::StatusOr<const Api*>* loaded = nullptr;
  std::call_once(once, [] { loaded = new absl::StatusOr<const Api*>(Load()); });
  return *loaded;
}

}  // namespace nvml
}  // namespace stagehand
