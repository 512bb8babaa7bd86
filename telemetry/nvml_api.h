// The part of NVML (the NVIDIA Management Library) that telemetry/ calls, declared here and resolved
// at run time from the driver's libnvidia-ml.so.1 with dlopen, so that a machine without a driver still
// runs CPU jobs and links nothing of NVIDIA's.
//
// Why our own declarations and not nvml.h: the CUDA 13 toolkit on the build machines ships no nvml.h
// (it comes with the driver's development files), and NVML is a C ABI whose functions are versioned
// by name (nvmlInit_v2, ..._v2). Every type, value and signature below is copied from nvml.h of NVML
// 13.0.87 (NVML_API_VERSION 13, the pip package nvidia-nvml-dev==13.0.87); telemetry/nvml_api_test.cc
// checks them against that header wherever it is on the include path.
#ifndef STAGEHAND_TELEMETRY_NVML_API_H_
#define STAGEHAND_TELEMETRY_NVML_API_H_

#include "absl/status/statusor.h"

namespace stagehand {
namespace nvml {

using Return = int;                              // nvmlReturn_t
inline constexpr Return kSuccess = 0;            // NVML_SUCCESS
inline constexpr Return kErrorNotSupported = 3;  // NVML_ERROR_NOT_SUPPORTED

using Device = struct nvmlDevice_st*;  // nvmlDevice_t

inline constexpr int kClockSm = 1;                 // NVML_CLOCK_SM
inline constexpr int kClockMem = 2;                // NVML_CLOCK_MEM
inline constexpr int kTemperatureGpu = 0;          // NVML_TEMPERATURE_GPU
inline constexpr int kMemoryErrorUncorrected = 1;  // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
inline constexpr int kVolatileEcc = 0;             // NVML_VOLATILE_ECC
inline constexpr int kP2pCapsRead = 0;             // NVML_P2P_CAPS_INDEX_READ
inline constexpr int kP2pCapsNvlink = 2;           // NVML_P2P_CAPS_INDEX_NVLINK
inline constexpr int kP2pStatusOk = 0;             // NVML_P2P_STATUS_OK
inline constexpr int kFeatureEnabled = 1;          // NVML_FEATURE_ENABLED
inline constexpr unsigned kUuidBufferSize = 96;    // NVML_DEVICE_UUID_V2_BUFFER_SIZE
inline constexpr unsigned kNameBufferSize = 96;    // NVML_DEVICE_NAME_V2_BUFFER_SIZE

// nvmlUtilization_t
struct Utilization {
  unsigned int gpu;
  unsigned int memory;
};

// The functions telemetry/ uses, as pointers: resolved from the driver's library (LoadNvml), or fakes
// in tests. Enum parameters are int, as the C ABI passes them.
struct Api {
  Return (*init)();                                   // nvmlInit_v2
  const char* (*error_string)(Return);                // nvmlErrorString
  Return (*device_count)(unsigned int*);              // nvmlDeviceGetCount_v2
  Return (*handle_by_index)(unsigned int, Device*);   // nvmlDeviceGetHandleByIndex_v2
  Return (*handle_by_uuid)(const char*, Device*);     // nvmlDeviceGetHandleByUUID
  Return (*uuid)(Device, char*, unsigned int);        // nvmlDeviceGetUUID
  Return (*name)(Device, char*, unsigned int);        // nvmlDeviceGetName
  Return (*clock)(Device, int, unsigned int*);        // nvmlDeviceGetClockInfo
  Return (*max_clock)(Device, int, unsigned int*);    // nvmlDeviceGetMaxClockInfo
  Return (*power_usage)(Device, unsigned int*);       // nvmlDeviceGetPowerUsage (mW)
  Return (*power_limit)(Device, unsigned int*);       // nvmlDeviceGetEnforcedPowerLimit (mW)
  Return (*temperature)(Device, int, unsigned int*);  // nvmlDeviceGetTemperature (deprecated, exported)
  Return (*fan_speed)(Device, unsigned int*);         // nvmlDeviceGetFanSpeed (%)
  Return (*utilization)(Device, Utilization*);        // nvmlDeviceGetUtilizationRates
  // nvmlDeviceGetCurrentClocksEventReasons, or on drivers before 535 the same function under its old
  // name, nvmlDeviceGetCurrentClocksThrottleReasons.
  Return (*clocks_event_reasons)(Device, unsigned long long*);
  Return (*ecc_errors)(Device, int, int, unsigned long long*);  // nvmlDeviceGetTotalEccErrors
  Return (*retired_pages_pending)(Device, int*);                // nvmlDeviceGetRetiredPagesPendingStatus
  // nvmlDeviceGetRemappedRows(device, corrRows, uncRows, isPending, failureOccurred)
  Return (*remapped_rows)(Device, unsigned int*, unsigned int*, unsigned int*, unsigned int*);
  Return (*pcie_gen)(Device, unsigned int*);          // nvmlDeviceGetCurrPcieLinkGeneration
  Return (*pcie_width)(Device, unsigned int*);        // nvmlDeviceGetCurrPcieLinkWidth
  Return (*pcie_gen_max)(Device, unsigned int*);      // nvmlDeviceGetMaxPcieLinkGeneration
  Return (*pcie_gen_gpu_max)(Device, unsigned int*);  // nvmlDeviceGetGpuMaxPcieLinkGeneration
  Return (*pcie_width_max)(Device, unsigned int*);    // nvmlDeviceGetMaxPcieLinkWidth
  Return (*p2p_status)(Device, Device, int, int*);    // nvmlDeviceGetP2PStatus
  Return (*topology)(Device, Device, int*);           // nvmlDeviceGetTopologyCommonAncestor
};

// dlopens libnvidia-ml.so.1 (once per process), resolves the functions above and calls nvmlInit_v2.
// Functions a driver lacks are left null (callers treat them as not supported), except nvmlInit_v2,
// nvmlErrorString and nvmlDeviceGetHandleByUUID, without which nothing works. FAILED_PRECONDITION
// naming the library and dlerror's text, or the error nvmlInit_v2 returned.
absl::StatusOr<const Api*> LoadNvml();

}  // namespace nvml
}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_NVML_API_H_
