// Summaries of GPU samples (see aggregate.h).
#include "telemetry/aggregate.h"

#include <algorithm>
#include <limits>

#include "telemetry/throttle.h"

namespace stagehand {
namespace {

// Running sums of one summary's fields; weights let a step summary stand for its samples.
struct Sums {
  double weight = 0;
  double sm = 0, mem = 0, power = 0, temperature = 0, utilization = 0;
  double power_capped = 0, thermal = 0, hw_slowdown = 0, throttled = 0;
  double sm_min = std::numeric_limits<double>::infinity();
  double power_max = 0, temperature_max = 0, power_limit = 0;
  bool any_fan = false;
  double fan_max = 0;
  uint64_t reasons = 0;

  void AddFan(bool has, double v) {
    if (!has) return;
    fan_max = any_fan ? std::max(fan_max, v) : v;
    any_fan = true;
  }

  StepTelemetry Summary(int samples) const {
    StepTelemetry t;
    t.set_samples(samples);
    if (weight <= 0) return t;
    t.set_sm_mhz_mean(sm / weight);
    t.set_sm_mhz_min(sm_min);
    t.set_mem_mhz_mean(mem / weight);
    t.set_power_w_mean(power / weight);
    t.set_power_w_max(power_max);
    t.set_power_limit_w(power_limit);
    t.set_temperature_c_mean(temperature / weight);
    t.set_temperature_c_max(temperature_max);
    if (any_fan) t.set_fan_percent_max(fan_max);
    t.set_utilization_percent_mean(utilization / weight);
    t.set_power_capped_fraction(power_capped / weight);
    t.set_thermal_fraction(thermal / weight);
    t.set_hw_slowdown_fraction(hw_slowdown / weight);
    t.set_throttled_fraction(throttled / weight);
    t.set_throttle_reasons_seen(reasons);
    return t;
  }
};

void AddSample(const GpuSample& s, Sums& sums) {
  sums.weight += 1;
  sums.sm += s.sm_mhz();
  sums.mem += s.mem_mhz();
  sums.power += s.power_w();
  sums.temperature += s.temperature_c();
  sums.utilization += s.utilization_percent();
  const uint64_t r = s.throttle_reasons();
  sums.power_capped += (r & kThrottleSwPowerCap) != 0;
  sums.thermal += (r & kThrottleThermal) != 0;
  sums.hw_slowdown += (r & kThrottleHardware) != 0;
  sums.throttled += (r & kThrottleSlowing) != 0;
  sums.sm_min = std::min(sums.sm_min, s.sm_mhz());
  sums.power_max = std::max(sums.power_max, s.power_w());
  sums.temperature_max = std::max(sums.temperature_max, s.temperature_c());
  sums.power_limit = s.power_limit_w();  // the latest: a limit changed mid-run is the one in force
  sums.AddFan(s.has_fan_percent(), s.fan_percent());
  sums.reasons |= r;
}

}  // namespace

StepTelemetry SummarizeStep(const std::vector<GpuSample>& samples, const GpuSample* latest, bool raw) {
  Sums sums;
  for (const GpuSample& s : samples) AddSample(s, sums);
  if (samples.empty() && latest != nullptr) AddSample(*latest, sums);
  StepTelemetry t = sums.Summary(static_cast<int>(samples.size()));
  if (raw) {
    for (const GpuSample& s : samples) *t.add_raw() = s;
  }
  return t;
}

StepTelemetry CombineSteps(const std::vector<const StepTelemetry*>& steps) {
  Sums sums;
  int samples = 0;
  for (const StepTelemetry* t : steps) {
    if (t->sm_mhz_mean() <= 0 && t->samples() == 0) continue;  // nothing was read in this step
    const double w = std::max(1, t->samples());
    samples += t->samples();
    sums.weight += w;
    sums.sm += w * t->sm_mhz_mean();
    sums.mem += w * t->mem_mhz_mean();
    sums.power += w * t->power_w_mean();
    sums.temperature += w * t->temperature_c_mean();
    sums.utilization += w * t->utilization_percent_mean();
    sums.power_capped += w * t->power_capped_fraction();
    sums.thermal += w * t->thermal_fraction();
    sums.hw_slowdown += w * t->hw_slowdown_fraction();
    sums.throttled += w * t->throttled_fraction();
    sums.sm_min = std::min(sums.sm_min, t->sm_mhz_min());
    sums.power_max = std::max(sums.power_max, t->power_w_max());
    sums.temperature_max = std::max(sums.temperature_max, t->temperature_c_max());
    sums.power_limit = t->power_limit_w();
    sums.AddFan(t->has_fan_percent_max(), t->fan_percent_max());
    sums.reasons |= t->throttle_reasons_seen();
  }
  return sums.Summary(samples);
}

}  // namespace stagehand
