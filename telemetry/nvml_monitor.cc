// NVML readings of one GPU (see nvml_monitor.h). A function the driver lacks, or a reading the board
// does not support (fans on SXM modules, ECC with ECC off), leaves its field unset rather than failing.
#include "telemetry/nvml_monitor.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace stagehand {
namespace {

// Calls `fn` when the driver has it; true when it answered NVML_SUCCESS.
template <typename Fn, typename... Args>
bool Ask(Fn fn, Args... args) {
  return fn != nullptr && fn(args...) == nvml::kSuccess;
}

std::string Topology(int level) {
  switch (level) {
    case 0:
      return "board";  // NVML_TOPOLOGY_INTERNAL: two GPUs of one board
    case 10:
      return "switch";  // NVML_TOPOLOGY_SINGLE: one PCIe switch between them
    case 20:
      return "switches";  // NVML_TOPOLOGY_MULTIPLE: several switches, no host bridge
    case 30:
      return "host bridge";
    case 40:
      return "NUMA node";  // across host bridges of one NUMA node
    case 50:
      return "system";  // across NUMA nodes (the CPUs' interconnect)
    default:
      return "";
  }
}

class NvmlMonitor : public GpuMonitor {
 public:
  NvmlMonitor(const nvml::Api& api, nvml::Device device, std::string uuid)
      : api_(api), device_(device), uuid_(std::move(uuid)) {}

  absl::StatusOr<GpuSample> Sample() override {
    GpuSample s;
    s.set_unix_micros(absl::ToUnixMicros(absl::Now()));
    unsigned int v = 0;
    // The SM clock is the one reading every sample must have: without it the GPU is gone.
    if (nvml::Return r = api_.clock ? api_.clock(device_, nvml::kClockSm, &v) : nvml::kErrorNotSupported;
        r != nvml::kSuccess) {
      return absl::UnavailableError(absl::StrCat("nvmlDeviceGetClockInfo(", uuid_, "): ", api_.error_string(r)));
    }
    s.set_sm_mhz(v);
    if (Ask(api_.clock, device_, nvml::kClockMem, &v)) s.set_mem_mhz(v);
    if (Ask(api_.power_usage, device_, &v)) s.set_power_w(v / 1000.0);
    if (Ask(api_.power_limit, device_, &v)) s.set_power_limit_w(v / 1000.0);
    if (Ask(api_.temperature, device_, nvml::kTemperatureGpu, &v)) s.set_temperature_c(v);
    if (Ask(api_.fan_speed, device_, &v)) s.set_fan_percent(v);
    nvml::Utilization u{};
    if (Ask(api_.utilization, device_, &u)) s.set_utilization_percent(u.gpu);
    unsigned long long reasons = 0;
    if (Ask(api_.clocks_event_reasons, device_, &reasons)) s.set_throttle_reasons(reasons);
    return s;
  }

  GpuHealth ReadHealth() override {
    GpuHealth h;
    h.set_available(true);
    h.set_uuid(uuid_);
    char name[nvml::kNameBufferSize] = {};
    if (Ask(api_.name, device_, name, nvml::kNameBufferSize)) h.set_name(name);
    ReadMemoryHealth(h);
    unsigned int v = 0;
    unsigned long long reasons = 0;
    if (Ask(api_.clocks_event_reasons, device_, &reasons)) h.set_throttle_reasons(reasons);
    if (Ask(api_.pcie_gen, device_, &v)) h.set_pcie_gen(v);
    if (Ask(api_.pcie_gen_max, device_, &v)) h.set_pcie_gen_max(v);
    if (Ask(api_.pcie_gen_gpu_max, device_, &v)) h.set_pcie_gen_gpu_max(v);
    if (Ask(api_.pcie_width, device_, &v)) h.set_pcie_width(v);
    if (Ask(api_.pcie_width_max, device_, &v)) h.set_pcie_width_max(v);
    if (Ask(api_.clock, device_, nvml::kClockSm, &v)) h.set_sm_mhz(v);
    if (Ask(api_.max_clock, device_, nvml::kClockSm, &v)) h.set_sm_mhz_max(v);
    if (Ask(api_.power_limit, device_, &v)) h.set_power_limit_w(v / 1000.0);
    ReadPeers(h);
    return h;
  }

 private:
  void ReadMemoryHealth(GpuHealth& h) {
    unsigned long long ecc = 0;
    if (Ask(api_.ecc_errors, device_, nvml::kMemoryErrorUncorrected, nvml::kVolatileEcc, &ecc)) {
      h.set_ecc_uncorrected_volatile(static_cast<int64_t>(ecc));
    }
    int pending = 0;
    if (Ask(api_.retired_pages_pending, device_, &pending))
      h.set_retired_pages_pending(pending == nvml::kFeatureEnabled);
    unsigned int corrected = 0, uncorrected = 0, remap_pending = 0, failed = 0;
    if (Ask(api_.remapped_rows, device_, &corrected, &uncorrected, &remap_pending, &failed)) {
      h.set_remap_pending(remap_pending != 0);
      h.set_remap_failed(failed != 0);
      h.set_remapped_rows_uncorrectable(uncorrected);
    }
  }

  // Every other GPU NVML sees: whether peer reads work, over NVLink or not, and the PCIe path.
  void ReadPeers(GpuHealth& h) {
    unsigned int count = 0;
    if (!Ask(api_.device_count, &count)) return;
    for (unsigned int i = 0; i < count; ++i) {
      nvml::Device other = nullptr;
      char uuid[nvml::kUuidBufferSize] = {};
      if (!Ask(api_.handle_by_index, i, &other) || other == device_) continue;
      if (!Ask(api_.uuid, other, uuid, nvml::kUuidBufferSize) || uuid_ == uuid) continue;
      GpuPeerLink& link = *h.add_peers();
      link.set_uuid(uuid);
      int status = -1;
      link.set_p2p_read(Ask(api_.p2p_status, device_, other, nvml::kP2pCapsRead, &status) &&
                        status == nvml::kP2pStatusOk);
      status = -1;
      link.set_nvlink(Ask(api_.p2p_status, device_, other, nvml::kP2pCapsNvlink, &status) &&
                      status == nvml::kP2pStatusOk);
      int level = -1;
      if (Ask(api_.topology, device_, other, &level)) link.set_topology(Topology(level));
    }
  }

  const nvml::Api& api_;
  const nvml::Device device_;
  const std::string uuid_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuMonitor>> OpenNvmlMonitor(const nvml::Api& api, const std::string& uuid) {
  nvml::Device device = nullptr;
  if (const nvml::Return r = api.handle_by_uuid(uuid.c_str(), &device); r != nvml::kSuccess) {
    return absl::NotFoundError(
        absl::StrCat("NVML has no GPU ", uuid, " (nvmlDeviceGetHandleByUUID: ", api.error_string(r), ")"));
  }
  return std::unique_ptr<GpuMonitor>(new NvmlMonitor(api, device, uuid));
}

absl::StatusOr<std::unique_ptr<GpuMonitor>> OpenNvmlMonitor(const std::string& uuid) {
  absl::StatusOr<const nvml::Api*> api = nvml::LoadNvml();
  if (!api.ok()) return api.status();
  return OpenNvmlMonitor(**api, uuid);
}

GpuHealth ReadGpuHealth(const std::string& uuid) {
  absl::StatusOr<std::unique_ptr<GpuMonitor>> monitor = OpenNvmlMonitor(uuid);
  if (!monitor.ok()) {
    GpuHealth h;
    h.set_uuid(uuid);
    h.set_error(std::string(monitor.status().message()));
    return h;
  }
  return (*monitor)->ReadHealth();
}

}  // namespace stagehand
