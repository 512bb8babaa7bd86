// Per-step summaries and a rank's run summary from fake samples.
#include "telemetry/aggregate.h"

#include "gtest/gtest.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

GpuSample Sample(double sm, double power, double temp, uint64_t reasons, int64_t t = 0) {
  GpuSample s;
  s.set_unix_micros(t);
  s.set_sm_mhz(sm);
  s.set_mem_mhz(3200);
  s.set_power_w(power);
  s.set_power_limit_w(700);
  s.set_temperature_c(temp);
  s.set_utilization_percent(100);
  s.set_throttle_reasons(reasons);
  return s;
}

TEST(SummarizeStep, FourSamples_MeanWorstAndReasonFractions) {
  const std::vector<GpuSample> samples = {Sample(1750, 700, 70, kThrottleSwPowerCap, 1), Sample(1850, 690, 72, 0, 2),
                                          Sample(1800, 699, 74, kThrottleSwPowerCap | kThrottleSwThermal, 3),
                                          Sample(1800, 650, 71, kThrottleGpuIdle, 4)};
  const StepTelemetry t = SummarizeStep(samples, nullptr, /*raw=*/true);
  EXPECT_EQ(t.samples(), 4);
  EXPECT_DOUBLE_EQ(t.sm_mhz_mean(), 1800);
  EXPECT_DOUBLE_EQ(t.sm_mhz_min(), 1750);
  EXPECT_DOUBLE_EQ(t.power_w_mean(), (700 + 690 + 699 + 650) / 4.0);
  EXPECT_DOUBLE_EQ(t.power_w_max(), 700);
  EXPECT_DOUBLE_EQ(t.power_limit_w(), 700);
  EXPECT_DOUBLE_EQ(t.temperature_c_max(), 74);
  EXPECT_DOUBLE_EQ(t.power_capped_fraction(), 0.5);
  EXPECT_DOUBLE_EQ(t.thermal_fraction(), 0.25);
  EXPECT_DOUBLE_EQ(t.hw_slowdown_fraction(), 0);
  EXPECT_DOUBLE_EQ(t.throttled_fraction(), 0.5);  // idle does not slow a busy GPU's clocks
  EXPECT_EQ(t.throttle_reasons_seen(), kThrottleSwPowerCap | kThrottleSwThermal | kThrottleGpuIdle);
  EXPECT_FALSE(t.has_fan_percent_max());  // no sample reported a fan
  ASSERT_EQ(t.raw_size(), 4);
  EXPECT_EQ(t.raw(2).unix_micros(), 3);
}

TEST(SummarizeStep, NoSamples_LatestStandsInWithZeroCount) {
  const GpuSample latest = Sample(1980, 300, 40, 0);
  const StepTelemetry t = SummarizeStep({}, &latest, /*raw=*/true);
  EXPECT_EQ(t.samples(), 0);
  EXPECT_DOUBLE_EQ(t.sm_mhz_mean(), 1980);
  EXPECT_EQ(t.raw_size(), 0);
  EXPECT_DOUBLE_EQ(SummarizeStep({}, nullptr, true).sm_mhz_mean(), 0);
}

TEST(SummarizeStep, Fans_HighestReported) {
  GpuSample a = Sample(1800, 600, 60, 0), b = a;
  a.set_fan_percent(40);
  b.set_fan_percent(55);
  EXPECT_DOUBLE_EQ(SummarizeStep({a, b}, nullptr, false).fan_percent_max(), 55);
}

TEST(CombineSteps, WeightsBySamples_WorstOfWorst) {
  const StepTelemetry a = SummarizeStep({Sample(1700, 700, 70, kThrottleSwPowerCap)}, nullptr, false);
  const StepTelemetry b =
      SummarizeStep({Sample(1900, 600, 60, 0), Sample(1900, 600, 65, 0), Sample(1900, 600, 80, 0)}, nullptr, false);
  const StepTelemetry t = CombineSteps({&a, &b});
  EXPECT_EQ(t.samples(), 4);
  EXPECT_DOUBLE_EQ(t.sm_mhz_mean(), (1700 + 3 * 1900) / 4.0);
  EXPECT_DOUBLE_EQ(t.sm_mhz_min(), 1700);
  EXPECT_DOUBLE_EQ(t.power_w_max(), 700);
  EXPECT_DOUBLE_EQ(t.temperature_c_max(), 80);
  EXPECT_DOUBLE_EQ(t.power_capped_fraction(), 0.25);
  EXPECT_EQ(t.throttle_reasons_seen(), kThrottleSwPowerCap);
}

TEST(CombineSteps, NothingRead_Empty) {
  const StepTelemetry empty;
  EXPECT_EQ(CombineSteps({&empty}).sm_mhz_mean(), 0);
  EXPECT_EQ(CombineSteps({}).samples(), 0);
}

TEST(ThrottleNames, KnownAndUnknownBits) {
  EXPECT_EQ(ThrottleNames(0), "");
  EXPECT_EQ(ThrottleNames(kThrottleSwPowerCap | kThrottleHwThermal), "sw_power_cap|hw_thermal");
  EXPECT_EQ(ThrottleNames(kThrottleGpuIdle | 0x10000), "idle|0x10000");
}

}  // namespace
}  // namespace stagehand
