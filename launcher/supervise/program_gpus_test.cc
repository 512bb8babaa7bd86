// A program job's GPUs read by the launcher: the health gate before any rank starts, a sampler per
// rank whose summary joins the rank's steps; fake monitors, no GPU.
#include "launcher/supervise/program_gpus.h"

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "telemetry/fake_gpu_monitor.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

std::vector<GpuInfo> TwoGpus() {
  GpuInfo a, b;
  a.ordinal = 0;
  a.uuid = "GPU-a";
  b.ordinal = 1;
  b.uuid = "GPU-b";
  return {a, b};
}

GpuSample Sample(int sm_mhz) {
  GpuSample s;
  s.set_sm_mhz(sm_mhz);
  s.set_power_w(300);
  return s;
}

GpuHealth Healthy(const std::string& uuid) {
  GpuHealth h;
  h.set_available(true);
  h.set_uuid(uuid);
  return h;
}

JobSpec GpuJob() {
  JobSpec job;
  job.set_device("cuda");
  job.set_health("warn");
  job.set_telemetry(true);
  return job;
}

ProgramGpus::OpenMonitor Fakes(GpuHealth a, GpuHealth b) {
  return [a, b](const std::string& uuid) -> absl::StatusOr<std::unique_ptr<GpuMonitor>> {
    if (uuid == "GPU-a") return std::unique_ptr<GpuMonitor>(new FakeGpuMonitor({Sample(1980)}, a));
    return std::unique_ptr<GpuMonitor>(new FakeGpuMonitor({Sample(1500)}, b));
  };
}

TEST(ProgramGpusTest, SamplesEachRanksGpuForItsSteps) {
  std::vector<std::string> printed;
  absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus = ProgramGpus::Start(
      GpuJob(), TwoGpus(), Fakes(Healthy("GPU-a"), Healthy("GPU-b")),
      [&](const std::string& line) { printed.push_back(line); }, absl::Milliseconds(1));
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ((*gpus)->sampled(), 2);
  std::optional<StepTelemetry> a, b;
  for (int i = 0; i < 2000 && !(a && a->samples() > 0); ++i) {  // bounded: 2 s at most
    absl::SleepFor(absl::Milliseconds(1));
    a = (*gpus)->TakeStep(0);
  }
  ASSERT_TRUE(a.has_value());
  EXPECT_GT(a->samples(), 0);
  EXPECT_EQ(a->sm_mhz_mean(), 1980);
  b = (*gpus)->TakeStep(1);
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->sm_mhz_mean(), 1500);
  EXPECT_FALSE((*gpus)->TakeStep(2).has_value());
  EXPECT_FALSE(printed.empty());  // the gate's summary
}

TEST(ProgramGpusTest, AGpuWithBadMemoryIsRefusedBeforeAnyRankStarts) {
  GpuHealth bad = Healthy("GPU-b");
  bad.set_ecc_uncorrected_volatile(3);
  absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus =
      ProgramGpus::Start(GpuJob(), TwoGpus(), Fakes(Healthy("GPU-a"), bad), [](const std::string&) {});
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(gpus.status().message()), HasSubstr("rank 1"));
}

TEST(ProgramGpusTest, HealthOffAndTelemetryOffReadNothing) {
  JobSpec job = GpuJob();
  job.set_health("off");
  job.set_telemetry(false);
  GpuHealth bad = Healthy("GPU-b");
  bad.set_ecc_uncorrected_volatile(3);
  absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus =
      ProgramGpus::Start(job, TwoGpus(), Fakes(Healthy("GPU-a"), bad), [](const std::string&) {});
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ((*gpus)->sampled(), 0);
  EXPECT_FALSE((*gpus)->TakeStep(0).has_value());
  int opened = 0;  // with neither, no GPU is even opened
  ASSERT_TRUE(ProgramGpus::Start(
                  job, TwoGpus(),
                  [&](const std::string& uuid) -> absl::StatusOr<std::unique_ptr<GpuMonitor>> {
                    ++opened;
                    return std::unique_ptr<GpuMonitor>(new FakeGpuMonitor({Sample(1)}, Healthy(uuid)));
                  },
                  [](const std::string&) {})
                  .ok());
  EXPECT_EQ(opened, 0);
}

TEST(ProgramGpusTest, AGpuNvmlCannotOpenIsWarnedAndNotSampled) {
  std::vector<std::string> printed;
  ProgramGpus::OpenMonitor open = [](const std::string& uuid) -> absl::StatusOr<std::unique_ptr<GpuMonitor>> {
    if (uuid == "GPU-a") return std::unique_ptr<GpuMonitor>(new FakeGpuMonitor({Sample(1980)}, Healthy(uuid)));
    return absl::UnavailableError("libnvidia-ml.so.1: cannot open shared object file");
  };
  absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus = ProgramGpus::Start(
      GpuJob(), TwoGpus(), open, [&](const std::string& line) { printed.push_back(line); }, absl::Milliseconds(1));
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_EQ((*gpus)->sampled(), 1);
  bool said = false;
  for (const std::string& line : printed) said |= line.find("no telemetry for rank 1") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(ProgramGpusTest, ACpuJobSamplesNothing) {
  JobSpec job;
  job.set_device("cpu");
  absl::StatusOr<std::unique_ptr<ProgramGpus>> gpus =
      ProgramGpus::Start(job, {}, Fakes(Healthy("a"), Healthy("b")), [](const std::string&) {});
  ASSERT_TRUE(gpus.ok());
  EXPECT_EQ((*gpus)->sampled(), 0);
}

}  // namespace
}  // namespace stagehand
