// The profile cache: what it keys on, a round trip through a directory, and when a job profiles.
#include "worker/profile_cache.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

JobSpec OneStageJob() {
  JobSpec job;
  job.set_model("gpt-1.3b");
  job.mutable_model_spec()->set_hidden(2048);
  job.mutable_model_spec()->set_layers(24);
  PipelineSpec& p = *job.mutable_pipeline();
  p.set_partition("auto");
  p.set_stages(1);
  p.set_schedule("1f1b");
  p.set_micro_batches(4);
  p.set_global_batch(32);
  return job;
}

DeviceInfo H200() {
  DeviceInfo d;
  d.set_name("NVIDIA H200");
  d.set_total_bytes(int64_t{150} << 30);
  return d;
}

std::string TempDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return absl::StrCat(t != nullptr ? t : "/tmp", "/profile_cache_test.", getpid());
}

TEST(ProfileChoosesPartition, OneStageAuto_IsFalse) { EXPECT_FALSE(ProfileChoosesPartition(OneStageJob())); }

TEST(ProfileChoosesPartition, TwoStagesAuto_IsTrue) {
  JobSpec job = OneStageJob();
  job.mutable_pipeline()->set_stages(2);
  EXPECT_TRUE(ProfileChoosesPartition(job));
}

TEST(ProfileChoosesPartition, UniformPartition_IsFalse) {
  JobSpec job = OneStageJob();
  job.mutable_pipeline()->set_stages(2);
  job.mutable_pipeline()->set_partition("uniform");
  EXPECT_FALSE(ProfileChoosesPartition(job));
}

TEST(ProfileChoosesPartition, ScheduleFile_IsTrue) {
  JobSpec job = OneStageJob();
  job.mutable_pipeline()->set_schedule_text("0F0 0B0 OPT");
  EXPECT_TRUE(ProfileChoosesPartition(job));
}

TEST(ProfileCacheKey, SizesMicroBatchAndDevice_ChangeIt) {
  const std::string base = ProfileCacheKey(OneStageJob(), H200());
  JobSpec wider = OneStageJob();
  wider.mutable_model_spec()->set_hidden(4096);
  EXPECT_NE(ProfileCacheKey(wider, H200()), base);
  JobSpec more = OneStageJob();
  more.mutable_pipeline()->set_micro_batches(8);
  EXPECT_NE(ProfileCacheKey(more, H200()), base);
  DeviceInfo other = H200();
  other.set_name("NVIDIA H100");
  EXPECT_NE(ProfileCacheKey(OneStageJob(), other), base);
  EXPECT_EQ(ProfileCacheKey(OneStageJob(), H200()), base);
}

TEST(ProfileCache, WriteThenRead_RoundTrips) {
  const std::string dir = TempDir() + "/a/b";
  LayerProfile p;
  p.set_micro_batch(8);
  p.add_layers()->set_forward_ms(1.5);
  p.add_layers()->set_backward_ms(2.25);
  const std::string key = ProfileCacheKey(OneStageJob(), H200());
  EXPECT_FALSE(ReadCachedProfile(dir, key).has_value());
  ASSERT_TRUE(WriteCachedProfile(dir, key, p).ok());
  std::optional<LayerProfile> back = ReadCachedProfile(dir, key);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->SerializeAsString(), p.SerializeAsString());
}

TEST(ProfileCache, FileOfAnotherKey_IsNotRead) {
  const std::string dir = TempDir() + "/c";
  LayerProfile p;
  p.add_layers()->set_forward_ms(1);
  const std::string key = ProfileCacheKey(OneStageJob(), H200());
  ASSERT_TRUE(WriteCachedProfile(dir, key, p).ok());
  EXPECT_FALSE(ReadCachedProfile(dir, key + " other").has_value());
  EXPECT_FALSE(ReadCachedProfile("", key).has_value());
}

TEST(ProfileCache, ProfileWithItsClock_RoundTrips) {
  const std::string dir = TempDir() + "/d";
  LayerProfile p;
  p.add_layers()->set_forward_ms(1);
  p.mutable_clock()->set_sm_mhz(1755.5);
  p.mutable_clock()->set_samples(12);
  const std::string key = ProfileCacheKey(OneStageJob(), H200());
  ASSERT_TRUE(WriteCachedProfile(dir, key, p).ok());
  std::optional<LayerProfile> back = ReadCachedProfile(dir, key);
  ASSERT_TRUE(back.has_value());
  EXPECT_DOUBLE_EQ(back->clock().sm_mhz(), 1755.5);
}

TEST(GpuClock, PerGpuAndKey_RoundTripsBesideTheProfile) {
  const std::string dir = TempDir() + "/e";
  const std::string key = ProfileCacheKey(OneStageJob(), H200());
  LoadClock c;
  c.set_sm_mhz(1802.25);
  c.set_samples(40);
  c.set_source("last run");
  EXPECT_FALSE(ReadGpuClock(dir, key, "GPU-a").has_value());
  ASSERT_TRUE(WriteGpuClock(dir, key, "GPU-a", c).ok());
  std::optional<LoadClock> back = ReadGpuClock(dir, key, "GPU-a");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->SerializeAsString(), c.SerializeAsString());
  EXPECT_FALSE(ReadGpuClock(dir, key, "GPU-b").has_value());         // another GPU
  EXPECT_FALSE(ReadGpuClock(dir, key + " x", "GPU-a").has_value());  // another job's sizes
  EXPECT_FALSE(ReadCachedProfile(dir, key).has_value());             // not a profile
  c.set_samples(0);                                                  // an unknown clock is not kept as one
  ASSERT_TRUE(WriteGpuClock(dir, key, "GPU-a", c).ok());
  EXPECT_FALSE(ReadGpuClock(dir, key, "GPU-a").has_value());
}

}  // namespace
}  // namespace stagehand
