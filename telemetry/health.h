// The pre-flight GPU health gate: given every rank's readings (GpuHealth, from its registration),
// which GPUs to refuse and what to warn about. A pure function, unit-tested on fake readings; the
// launcher calls it once every worker has registered, before the first step.
//
//   off     the gate is skipped (workers take no readings)
//   warn    the default: a GPU whose memory gives bad data (uncorrected ECC errors since the driver
//           loaded, retired pages or a row remap waiting for a reset, a failed remap) is refused; the
//           rest (throttled at rest, a PCIe link below its maximum, no peer access between pipeline
//           neighbours, a GPU NVML could not read) is a warning
//   strict  every warning refuses too
#ifndef STAGEHAND_TELEMETRY_HEALTH_H_
#define STAGEHAND_TELEMETRY_HEALTH_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "protos/telemetry.pb.h"

namespace stagehand {

enum class HealthMode { kOff, kWarn, kStrict };

// "off", "warn", "strict"; "" is warn. nullopt for anything else.
std::optional<HealthMode> ParseHealthMode(absl::string_view text);

struct HealthVerdict {
  std::vector<std::string> refusals;  // each names the rank and GPU and says what to do
  std::vector<std::string> warnings;
  std::string summary;  // one line of what was checked, for the launcher to print
  bool refused() const { return !refusals.empty(); }
};

// `gpus[r]` is rank r's readings; pipeline neighbours are ranks r and r + 1.
HealthVerdict JudgeHealth(const std::vector<GpuHealth>& gpus, HealthMode mode);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_HEALTH_H_
