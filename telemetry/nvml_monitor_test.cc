// The NVML monitor over fake NVML functions: readings become fields, what a board does not support
// stays unset, the other GPUs' links are read.
#include "telemetry/nvml_monitor.h"

#include <cstring>

#include "gtest/gtest.h"

namespace stagehand {
namespace {

using nvml::Device;
using nvml::Return;

// Two fake GPUs, handles 1 and 2; ours is GPU-a.
Device Handle(int i) { return reinterpret_cast<Device>(static_cast<intptr_t>(i)); }
int Index(Device d) { return static_cast<int>(reinterpret_cast<intptr_t>(d)); }

Return Init() { return nvml::kSuccess; }
const char* ErrorString(Return r) { return r == nvml::kErrorNotSupported ? "Not Supported" : "Not Found"; }
Return Count(unsigned int* n) {
  *n = 2;
  return nvml::kSuccess;
}
Return ByIndex(unsigned int i, Device* d) {
  *d = Handle(static_cast<int>(i) + 1);
  return nvml::kSuccess;
}
Return ByUuid(const char* uuid, Device* d) {
  if (std::strcmp(uuid, "GPU-a") == 0) {
    *d = Handle(1);
    return nvml::kSuccess;
  }
  return 6;  // NVML_ERROR_NOT_FOUND
}
Return Uuid(Device d, char* out, unsigned int n) {
  std::snprintf(out, n, "%s", Index(d) == 1 ? "GPU-a" : "GPU-b");
  return nvml::kSuccess;
}
Return Name(Device, char* out, unsigned int n) {
  std::snprintf(out, n, "NVIDIA H200");
  return nvml::kSuccess;
}
Return Clock(Device, int type, unsigned int* mhz) {
  *mhz = type == nvml::kClockSm ? 1755 : 3201;
  return nvml::kSuccess;
}
Return MaxClock(Device, int, unsigned int* mhz) {
  *mhz = 1980;
  return nvml::kSuccess;
}
Return Power(Device, unsigned int* mw) {
  *mw = 699500;
  return nvml::kSuccess;
}
Return Limit(Device, unsigned int* mw) {
  *mw = 700000;
  return nvml::kSuccess;
}
Return Temp(Device, int, unsigned int* c) {
  *c = 71;
  return nvml::kSuccess;
}
Return NoFan(Device, unsigned int*) { return nvml::kErrorNotSupported; }
Return Util(Device, nvml::Utilization* u) {
  u->gpu = 98;
  u->memory = 40;
  return nvml::kSuccess;
}
Return Reasons(Device, unsigned long long* r) {
  *r = 0x4;
  return nvml::kSuccess;
}
Return Ecc(Device, int, int, unsigned long long* n) {
  *n = 2;
  return nvml::kSuccess;
}
Return NoRetired(Device, int*) { return nvml::kErrorNotSupported; }  // Ampere and later
Return Remapped(Device, unsigned int* c, unsigned int* u, unsigned int* pending, unsigned int* failed) {
  *c = 0;
  *u = 1;
  *pending = 1;
  *failed = 0;
  return nvml::kSuccess;
}
Return Gen(Device, unsigned int* g) {
  *g = 5;
  return nvml::kSuccess;
}
Return Width(Device, unsigned int* w) {
  *w = 16;
  return nvml::kSuccess;
}
Return P2p(Device, Device, int caps, int* status) {
  *status = nvml::kP2pStatusOk;
  (void)caps;
  return nvml::kSuccess;
}
Return Topology(Device, Device, int* level) {
  *level = 50;
  return nvml::kSuccess;
}

nvml::Api FakeApi() {
  nvml::Api api{};
  api.init = Init;
  api.error_string = ErrorString;
  api.device_count = Count;
  api.handle_by_index = ByIndex;
  api.handle_by_uuid = ByUuid;
  api.uuid = Uuid;
  api.name = Name;
  api.clock = Clock;
  api.max_clock = MaxClock;
  api.power_usage = Power;
  api.power_limit = Limit;
  api.temperature = Temp;
  api.fan_speed = NoFan;
  api.utilization = Util;
  api.clocks_event_reasons = Reasons;
  api.ecc_errors = Ecc;
  api.retired_pages_pending = NoRetired;
  api.remapped_rows = Remapped;
  api.pcie_gen = Gen;
  api.pcie_gen_max = Gen;
  api.pcie_gen_gpu_max = Gen;
  api.pcie_width = Width;
  api.pcie_width_max = Width;
  api.p2p_status = P2p;
  api.topology = Topology;
  return api;
}

TEST(NvmlMonitor, Sample_ReadingsInUnits_NoFanUnset) {
  const nvml::Api api = FakeApi();
  absl::StatusOr<std::unique_ptr<GpuMonitor>> m = OpenNvmlMonitor(api, "GPU-a");
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<GpuSample> s = (*m)->Sample();
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->sm_mhz(), 1755);
  EXPECT_EQ(s->mem_mhz(), 3201);
  EXPECT_DOUBLE_EQ(s->power_w(), 699.5);
  EXPECT_DOUBLE_EQ(s->power_limit_w(), 700);
  EXPECT_EQ(s->temperature_c(), 71);
  EXPECT_FALSE(s->has_fan_percent());
  EXPECT_EQ(s->utilization_percent(), 98);
  EXPECT_EQ(s->throttle_reasons(), 0x4u);
  EXPECT_GT(s->unix_micros(), 0);
}

TEST(NvmlMonitor, MissingFunctions_LeaveFieldsUnset) {
  nvml::Api api = FakeApi();
  api.power_usage = nullptr;  // a driver without it
  api.clocks_event_reasons = nullptr;
  absl::StatusOr<std::unique_ptr<GpuMonitor>> m = OpenNvmlMonitor(api, "GPU-a");
  ASSERT_TRUE(m.ok());
  absl::StatusOr<GpuSample> s = (*m)->Sample();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->power_w(), 0);
  EXPECT_EQ(s->throttle_reasons(), 0u);
  api.clock = nullptr;  // not even a clock: the sample fails
  EXPECT_FALSE((*m)->Sample().ok());
}

TEST(NvmlMonitor, ReadHealth_EccRemapsPcieAndPeers) {
  const nvml::Api api = FakeApi();
  absl::StatusOr<std::unique_ptr<GpuMonitor>> m = OpenNvmlMonitor(api, "GPU-a");
  ASSERT_TRUE(m.ok());
  const GpuHealth h = (*m)->ReadHealth();
  EXPECT_TRUE(h.available());
  EXPECT_EQ(h.uuid(), "GPU-a");
  EXPECT_EQ(h.name(), "NVIDIA H200");
  EXPECT_EQ(h.ecc_uncorrected_volatile(), 2);
  EXPECT_FALSE(h.has_retired_pages_pending());
  EXPECT_TRUE(h.remap_pending());
  EXPECT_EQ(h.remapped_rows_uncorrectable(), 1);
  EXPECT_EQ(h.pcie_gen(), 5);
  EXPECT_EQ(h.pcie_width_max(), 16);
  EXPECT_EQ(h.sm_mhz_max(), 1980);
  ASSERT_EQ(h.peers_size(), 1);  // itself left out
  EXPECT_EQ(h.peers(0).uuid(), "GPU-b");
  EXPECT_TRUE(h.peers(0).p2p_read());
  EXPECT_TRUE(h.peers(0).nvlink());
  EXPECT_EQ(h.peers(0).topology(), "system");
}

TEST(NvmlMonitor, UnknownUuid_NotFound) {
  const nvml::Api api = FakeApi();
  absl::StatusOr<std::unique_ptr<GpuMonitor>> m = OpenNvmlMonitor(api, "GPU-zzz");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("GPU-zzz"), absl::string_view::npos);
}

// Without a driver (CI) the health readings say why rather than fail the worker.
TEST(ReadGpuHealth, NoDriver_UnavailableWithReason) {
  if (nvml::LoadNvml().ok()) GTEST_SKIP() << "this machine has an NVIDIA driver";
  const GpuHealth h = ReadGpuHealth("GPU-a");
  EXPECT_FALSE(h.available());
  EXPECT_EQ(h.uuid(), "GPU-a");
  EXPECT_NE(h.error().find("libnvidia-ml.so.1"), std::string::npos);
}

}  // namespace
}  // namespace stagehand
