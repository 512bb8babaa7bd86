// NVML's clocks-event ("throttle") reasons: the bits, their names, and which of them mean the GPU runs
// slower than it could. Values as nvml.h's nvmlClocksEventReason* (13.0).
#ifndef STAGEHAND_TELEMETRY_THROTTLE_H_
#define STAGEHAND_TELEMETRY_THROTTLE_H_

#include <cstdint>
#include <string>

namespace stagehand {

inline constexpr uint64_t kThrottleGpuIdle = 0x1;
inline constexpr uint64_t kThrottleApplicationsClocks = 0x2;
inline constexpr uint64_t kThrottleSwPowerCap = 0x4;
inline constexpr uint64_t kThrottleHwSlowdown = 0x8;
inline constexpr uint64_t kThrottleSyncBoost = 0x10;
inline constexpr uint64_t kThrottleSwThermal = 0x20;
inline constexpr uint64_t kThrottleHwThermal = 0x40;
inline constexpr uint64_t kThrottleHwPowerBrake = 0x80;
inline constexpr uint64_t kThrottleDisplayClocks = 0x100;

inline constexpr uint64_t kThrottleThermal = kThrottleSwThermal | kThrottleHwThermal;
inline constexpr uint64_t kThrottleHardware = kThrottleHwSlowdown | kThrottleHwPowerBrake;
// The reasons that hold clocks below what the GPU could run: not idling, not the clocks an
// application asked for, not the display's.
inline constexpr uint64_t kThrottleSlowing =
    kThrottleSwPowerCap | kThrottleHwSlowdown | kThrottleSyncBoost | kThrottleThermal | kThrottleHwPowerBrake;

// "sw_power_cap|hw_thermal" (the set bits, lowest first; unknown bits as "0x..."); "" for none.
std::string ThrottleNames(uint64_t reasons);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_THROTTLE_H_
