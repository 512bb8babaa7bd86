// Our NVML declarations (nvml_api.h) against NVIDIA's nvml.h, when a toolkit on the include path has
// one (the build machines' CUDA 13 toolkit does not: then only the loader's behaviour without a
// driver is checked). Checked by hand against nvml.h 13.0.87.
#include "telemetry/nvml_api.h"

#include <type_traits>

#include "gtest/gtest.h"

#if __has_include(<nvml.h>)
#include <nvml.h>
#define STAGEHAND_HAVE_NVML_H 1
namespace stagehand::nvml {
static_assert(kSuccess == NVML_SUCCESS);
static_assert(kErrorNotSupported == NVML_ERROR_NOT_SUPPORTED);
static_assert(kClockSm == NVML_CLOCK_SM && kClockMem == NVML_CLOCK_MEM);
static_assert(kTemperatureGpu == NVML_TEMPERATURE_GPU);
static_assert(kMemoryErrorUncorrected == NVML_MEMORY_ERROR_TYPE_UNCORRECTED && kVolatileEcc == NVML_VOLATILE_ECC);
static_assert(kP2pCapsRead == NVML_P2P_CAPS_INDEX_READ && kP2pCapsNvlink == NVML_P2P_CAPS_INDEX_NVLINK);
static_assert(kP2pStatusOk == NVML_P2P_STATUS_OK && kFeatureEnabled == NVML_FEATURE_ENABLED);
static_assert(kUuidBufferSize == NVML_DEVICE_UUID_V2_BUFFER_SIZE && kNameBufferSize == NVML_DEVICE_NAME_V2_BUFFER_SIZE);
static_assert(sizeof(Utilization) == sizeof(nvmlUtilization_t));
static_assert(sizeof(nvmlReturn_t) == sizeof(Return) && sizeof(nvmlClockType_t) == sizeof(int));
static_assert(sizeof(nvmlEnableState_t) == sizeof(int) && sizeof(nvmlGpuP2PStatus_t) == sizeof(int));
static_assert(sizeof(nvmlGpuTopologyLevel_t) == sizeof(int));
static_assert(std::is_same_v<decltype(Api::clock), Return (*)(Device, int, unsigned int*)>);
// The clocks-event bits telemetry/throttle.h names.
static_assert(nvmlClocksEventReasonSwPowerCap == 0x4 && nvmlClocksThrottleReasonHwSlowdown == 0x8);
static_assert(nvmlClocksEventReasonSwThermalSlowdown == 0x20 && nvmlClocksThrottleReasonHwThermalSlowdown == 0x40);
static_assert(nvmlClocksThrottleReasonHwPowerBrakeSlowdown == 0x80 && nvmlClocksEventReasonSyncBoost == 0x10);
}  // namespace stagehand::nvml
#else
#define STAGEHAND_HAVE_NVML_H 0
#endif

namespace stagehand::nvml {
namespace {

TEST(NvmlApi, DeclarationsAgreeWithNvmlHeader) {
  if (!STAGEHAND_HAVE_NVML_H) GTEST_SKIP() << "no nvml.h on the include path; the static_asserts did not run";
}

// Without a driver (CI) the loader says what is missing rather than crashing; with one it initialises.
TEST(NvmlApi, LoadNvml_WithoutDriver_SaysWhichLibrary) {
  absl::StatusOr<const Api*> api = LoadNvml();
  if (api.ok()) {
    EXPECT_NE((*api)->init, nullptr);
    GTEST_SKIP() << "this machine has an NVIDIA driver";
  }
  EXPECT_EQ(api.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(api.status().message().find("libnvidia-ml.so.1"), absl::string_view::npos) << api.status();
}

}  // namespace
}  // namespace stagehand::nvml
