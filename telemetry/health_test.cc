// The health gate's decisions on fake NVML readings.
#include "telemetry/health.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

GpuHealth Healthy(const std::string& uuid) {
  GpuHealth h;
  h.set_available(true);
  h.set_uuid(uuid);
  h.set_name("NVIDIA H200");
  h.set_ecc_uncorrected_volatile(0);
  h.set_remap_pending(false);
  h.set_remap_failed(false);
  h.set_throttle_reasons(kThrottleGpuIdle);  // at rest
  h.set_pcie_gen(1);                         // an idle link downshifts: no warning
  h.set_pcie_gen_max(5);
  h.set_pcie_gen_gpu_max(5);
  h.set_pcie_width(16);
  h.set_pcie_width_max(16);
  return h;
}

GpuPeerLink Link(const std::string& uuid, bool p2p, bool nvlink, const std::string& topology) {
  GpuPeerLink l;
  l.set_uuid(uuid);
  l.set_p2p_read(p2p);
  l.set_nvlink(nvlink);
  l.set_topology(topology);
  return l;
}

TEST(JudgeHealth, HealthyPair_NothingRefused_NvlinkNamed) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b")};
  *gpus[0].add_peers() = Link("GPU-b", true, true, "system");
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  EXPECT_FALSE(v.refused());
  EXPECT_THAT(v.warnings, IsEmpty());
  EXPECT_EQ(v.summary, "2 of 2 GPUs read, 0 refused, 0 warnings; ranks 0-1 over NVLink");
}

TEST(JudgeHealth, UncorrectedEcc_RefusedNamingTheGpu) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b")};
  gpus[1].set_ecc_uncorrected_volatile(3);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  ASSERT_TRUE(v.refused());
  EXPECT_THAT(v.refusals, ElementsAre(HasSubstr("rank 1 (GPU-b, NVIDIA H200): 3 uncorrected ECC errors")));
  EXPECT_THAT(v.refusals[0], HasSubstr("--health=off"));
}

TEST(JudgeHealth, PendingRemapOrRetiredPages_Refused) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b"), Healthy("GPU-c")};
  gpus[0].set_remap_pending(true);
  gpus[1].set_retired_pages_pending(true);
  gpus[2].set_remap_failed(true);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  EXPECT_THAT(v.refusals,
              ElementsAre(HasSubstr("rank 0 (GPU-a"), HasSubstr("rank 1 (GPU-b"), HasSubstr("rank 2 (GPU-c")));
  EXPECT_THAT(v.refusals[0], HasSubstr("remap"));
  EXPECT_THAT(v.refusals[1], HasSubstr("retired memory pages"));
  EXPECT_THAT(v.refusals[2], HasSubstr("needs service"));
}

TEST(JudgeHealth, ThrottledAtRest_Warned) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a")};
  gpus[0].set_throttle_reasons(kThrottleGpuIdle | kThrottleHwThermal);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  EXPECT_FALSE(v.refused());
  EXPECT_THAT(v.warnings, ElementsAre(HasSubstr("rank 0 (GPU-a, NVIDIA H200): clocks held down at rest (hw_thermal)")));
}

TEST(JudgeHealth, NarrowOrSlotLimitedPcie_Warned) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b")};
  gpus[0].set_pcie_width(8);
  gpus[1].set_pcie_gen_max(4);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  EXPECT_THAT(v.warnings, ElementsAre(HasSubstr("PCIe link x8 of x16"), HasSubstr("PCIe gen 4 at most in this slot")));
}

TEST(JudgeHealth, NeighboursWithoutPeerAccess_Warned) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b")};
  *gpus[0].add_peers() = Link("GPU-b", false, false, "system");
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kWarn);
  EXPECT_THAT(v.warnings,
              ElementsAre(HasSubstr("ranks 0-1: no peer access between GPU-a and GPU-b (PCIe path: system)")));
  EXPECT_THAT(v.summary, HasSubstr("ranks 0-1 no peer access"));
}

TEST(JudgeHealth, PeerOverPcie_SaysThePath) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a"), Healthy("GPU-b")};
  *gpus[0].add_peers() = Link("GPU-b", true, false, "switch");
  EXPECT_THAT(JudgeHealth(gpus, HealthMode::kWarn).summary, HasSubstr("ranks 0-1 over PCIe (switch)"));
}

TEST(JudgeHealth, NoNvml_WarnedNotRefused) {
  GpuHealth h;
  h.set_uuid("GPU-a");
  h.set_error("no NVML (libnvidia-ml.so.1: cannot open shared object file)");
  const HealthVerdict v = JudgeHealth({h}, HealthMode::kWarn);
  EXPECT_FALSE(v.refused());
  EXPECT_THAT(v.warnings, ElementsAre(HasSubstr("rank 0 (GPU-a): not checked: no NVML")));
  EXPECT_THAT(v.summary, HasSubstr("0 of 1 GPUs read"));
}

TEST(JudgeHealth, Strict_WarningsRefuse) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a")};
  gpus[0].set_throttle_reasons(kThrottleSwPowerCap);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kStrict);
  EXPECT_THAT(v.warnings, IsEmpty());
  EXPECT_THAT(v.refusals, ElementsAre(HasSubstr("(--health=strict)")));
}

TEST(JudgeHealth, Off_SkipsEverything) {
  std::vector<GpuHealth> gpus = {Healthy("GPU-a")};
  gpus[0].set_ecc_uncorrected_volatile(100);
  const HealthVerdict v = JudgeHealth(gpus, HealthMode::kOff);
  EXPECT_FALSE(v.refused());
  EXPECT_THAT(v.warnings, IsEmpty());
  EXPECT_EQ(v.summary, "");
}

TEST(ParseHealthMode, Words) {
  EXPECT_EQ(ParseHealthMode(""), HealthMode::kWarn);
  EXPECT_EQ(ParseHealthMode("warn"), HealthMode::kWarn);
  EXPECT_EQ(ParseHealthMode("off"), HealthMode::kOff);
  EXPECT_EQ(ParseHealthMode("strict"), HealthMode::kStrict);
  EXPECT_EQ(ParseHealthMode("on"), std::nullopt);
}

}  // namespace
}  // namespace stagehand
