// The sampler's thread over a fake monitor: steps get the samples taken since the last one.
#include "telemetry/sampler.h"

#include "gtest/gtest.h"
#include "telemetry/fake_gpu_monitor.h"

namespace stagehand {
namespace {

GpuSample Sample(double sm) {
  GpuSample s;
  s.set_sm_mhz(sm);
  return s;
}

TEST(TelemetrySampler, TakeStep_SamplesSinceLastTake) {
  TelemetrySampler sampler(
      std::make_unique<FakeGpuMonitor>(std::vector<GpuSample>{Sample(1700), Sample(1800), Sample(1900)}),
      absl::Milliseconds(1));
  ASSERT_TRUE(sampler.AwaitSamples(3, absl::Seconds(30)));
  const StepTelemetry first = sampler.TakeStep();
  EXPECT_GE(first.samples(), 3);
  EXPECT_DOUBLE_EQ(first.sm_mhz_min(), 1700);
  EXPECT_EQ(first.raw_size(), first.samples());
  // Later samples repeat the script's last; the second step has none of the first's.
  ASSERT_TRUE(sampler.AwaitSamples(first.samples() + 2, absl::Seconds(30)));
  const StepTelemetry second = sampler.TakeStep();
  EXPECT_GE(second.samples(), 1);
  EXPECT_DOUBLE_EQ(second.sm_mhz_min(), 1900);
  EXPECT_EQ(sampler.errors(), 0);
}

TEST(TelemetrySampler, FirstSampleAtOnce_ThenLatestStandsIn) {
  // An interval far beyond the test: only the first, immediate sample is taken.
  TelemetrySampler sampler(std::make_unique<FakeGpuMonitor>(std::vector<GpuSample>{Sample(1500)}), absl::Hours(1));
  ASSERT_TRUE(sampler.AwaitSamples(1, absl::Seconds(30)));
  EXPECT_EQ(sampler.TakeStep().samples(), 1);
  const StepTelemetry carried = sampler.TakeStep();
  EXPECT_EQ(carried.samples(), 0);
  EXPECT_DOUBLE_EQ(carried.sm_mhz_mean(), 1500);
}

TEST(TelemetrySampler, MonitorFails_CountedAndSkipped) {
  auto monitor = std::make_unique<FakeGpuMonitor>(std::vector<GpuSample>{});
  FakeGpuMonitor* fake = monitor.get();
  TelemetrySampler sampler(std::move(monitor), absl::Milliseconds(1));
  ASSERT_TRUE(fake->AwaitCalls(3, absl::Seconds(30)));
  EXPECT_GE(sampler.errors(), 2);
  EXPECT_EQ(sampler.TakeStep().samples(), 0);
}

}  // namespace
}  // namespace stagehand
