// The clock under load from fake samples, and the partition's clock weights from fake clocks.
#include "telemetry/clock_model.h"

#include "gtest/gtest.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

GpuSample Sample(double sm, double utilization, uint64_t reasons = 0) {
  GpuSample s;
  s.set_sm_mhz(sm);
  s.set_utilization_percent(utilization);
  s.set_throttle_reasons(reasons);
  return s;
}

LoadClock Clock(double mhz, int samples = 10) {
  LoadClock c;
  c.set_sm_mhz(mhz);
  c.set_samples(samples);
  return c;
}

TEST(BusyClock, IdleSamples_AreLeftOut) {
  const LoadClock c = BusyClock(
      {Sample(1980, 0), Sample(1750, 100, kThrottleSwPowerCap), Sample(1850, 90), Sample(1400, 10)}, "profile");
  EXPECT_EQ(c.samples(), 2);
  EXPECT_DOUBLE_EQ(c.sm_mhz(), 1800);
  EXPECT_DOUBLE_EQ(c.power_capped_fraction(), 0.5);
  EXPECT_EQ(c.source(), "profile");
}

TEST(BusyClock, NoBusySample_IsUnknown) {
  EXPECT_EQ(BusyClock({Sample(1980, 0)}, "profile").samples(), 0);
  EXPECT_EQ(BusyClock({}, "profile").samples(), 0);
}

TEST(BusyClock, ShortBurstsOnly_TakesTheSamplesWithAnyUtilization) {
  // A profile's bursts: no sample saw the GPU busy half the time.
  const LoadClock c = BusyClock({Sample(1980, 12), Sample(1960, 30), Sample(405, 0)}, "profile");
  EXPECT_EQ(c.samples(), 2);
  EXPECT_DOUBLE_EQ(c.sm_mhz(), 1970);
}

TEST(CombineClocks, WeightedBySamples) {
  const LoadClock c = CombineClocks(Clock(1700, 1), Clock(1800, 3));
  EXPECT_EQ(c.samples(), 4);
  EXPECT_DOUBLE_EQ(c.sm_mhz(), 1775);
  EXPECT_DOUBLE_EQ(CombineClocks(LoadClock(), Clock(1800, 3)).sm_mhz(), 1800);
  EXPECT_DOUBLE_EQ(CombineClocks(Clock(1700, 2), LoadClock()).sm_mhz(), 1700);
}

TEST(WeighClocks, EqualClocks_FactorsExactlyOne) {
  const ClockWeights w = WeighClocks({{Clock(1834.7), Clock(1834.7)}, {Clock(1834.7), LoadClock()}});
  ASSERT_TRUE(w.applied);
  EXPECT_EQ(w.speed, std::vector<double>({1.0, 1.0}));
  EXPECT_EQ(w.profile_scale, std::vector<double>({1.0, 1.0}));
}

TEST(WeighClocks, SlowerRank_SpeedBelowOne) {
  // Fresh profiles: each rank measured at its own clock, which is also its clock under load.
  const ClockWeights w = WeighClocks({{Clock(1620), Clock(1620)}, {Clock(1800), Clock(1800)}});
  ASSERT_TRUE(w.applied);
  EXPECT_DOUBLE_EQ(w.reference_mhz, 1800);
  EXPECT_DOUBLE_EQ(w.speed[0], 0.9);
  EXPECT_DOUBLE_EQ(w.speed[1], 1.0);
  EXPECT_DOUBLE_EQ(w.profile_scale[0], 0.9);  // its times at 1800 MHz are 0.9 of what it measured
  EXPECT_DOUBLE_EQ(w.load_mhz[0], 1620);
}

TEST(WeighClocks, CachedProfile_RescaledToThisRunsClock) {
  // One profile from the cache (measured at 1900 MHz) on both; the last runs of these GPUs ran at
  // 1710 and 1900 MHz.
  const ClockWeights w = WeighClocks({{Clock(1900), Clock(1710)}, {Clock(1900), Clock(1900)}});
  ASSERT_TRUE(w.applied);
  EXPECT_DOUBLE_EQ(w.profile_scale[0], 1.0);
  EXPECT_DOUBLE_EQ(w.speed[0], 0.9);
}

TEST(WeighClocks, BurstProfilesAndSustainedLastRuns_SpeedsFromTheLastRuns) {
  const ClockWeights w = WeighClocks({{Clock(1980), Clock(1656)}, {Clock(1980), Clock(1750)}});
  ASSERT_TRUE(w.applied);
  EXPECT_EQ(w.source, "last run");
  EXPECT_EQ(w.profile_scale, std::vector<double>({1.0, 1.0}));
  EXPECT_DOUBLE_EQ(w.speed[0], 1656.0 / 1750);
  EXPECT_EQ(w.speed[1], 1.0);
}

TEST(WeighClocks, OneRankWithoutLastRun_SpeedsFromTheProfilesOfAll) {
  // Mixing one GPU's sustained clock with another's burst clock would misjudge both.
  const ClockWeights w = WeighClocks({{Clock(1960), Clock(1656)}, {Clock(1980), LoadClock()}});
  ASSERT_TRUE(w.applied);
  EXPECT_EQ(w.source, "profile");
  EXPECT_DOUBLE_EQ(w.speed[0], 1960.0 / 1980);
  EXPECT_DOUBLE_EQ(w.load_mhz[0], 1960);
}

TEST(WeighClocks, RankWithoutClock_ClockBlind) {
  ClockWeights w = WeighClocks({{Clock(1800), Clock(1800)}, {LoadClock(), LoadClock()}});
  EXPECT_FALSE(w.applied);
  EXPECT_NE(w.why_not.find("rank 1"), std::string::npos) << w.why_not;
  EXPECT_EQ(w.speed, std::vector<double>({1.0, 1.0}));
  EXPECT_EQ(w.load_mhz, std::vector<double>({0.0, 0.0}));
  // Last runs' clocks for every rank suffice, with the profiles left as measured.
  w = WeighClocks({{LoadClock(), Clock(1620)}, {Clock(1800), Clock(1800)}});
  ASSERT_TRUE(w.applied);
  EXPECT_EQ(w.profile_scale, std::vector<double>({1.0, 1.0}));
  EXPECT_DOUBLE_EQ(w.speed[0], 0.9);
}

}  // namespace
}  // namespace stagehand
