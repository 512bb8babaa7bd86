// Names of NVML's clocks-event reasons.
#include "telemetry/throttle.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace stagehand {

std::string ThrottleNames(uint64_t reasons) {
  static constexpr struct {
    uint64_t bit;
    const char* name;
  } kNames[] = {
      {kThrottleGpuIdle, "idle"},
      {kThrottleApplicationsClocks, "app_clocks"},
      {kThrottleSwPowerCap, "sw_power_cap"},
      {kThrottleHwSlowdown, "hw_slowdown"},
      {kThrottleSyncBoost, "sync_boost"},
      {kThrottleSwThermal, "sw_thermal"},
      {kThrottleHwThermal, "hw_thermal"},
      {kThrottleHwPowerBrake, "hw_power_brake"},
      {kThrottleDisplayClocks, "display_clocks"},
  };
  std::string out;
  uint64_t known = 0;
  for (const auto& n : kNames) {
    known |= n.bit;
    if (reasons & n.bit) absl::StrAppend(&out, out.empty() ? "" : "|", n.name);
  }
  if (const uint64_t rest = reasons & ~known; rest != 0) {
    absl::StrAppend(&out, out.empty() ? "" : "|", absl::StrFormat("0x%x", rest));
  }
  return out;
}

}  // namespace stagehand
