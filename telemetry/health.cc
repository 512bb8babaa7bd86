// The health gate's decisions (see health.h).
#include "telemetry/health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

std::string Gpu(int rank, const GpuHealth& h) {
  std::string what = h.uuid().empty() ? "unknown GPU" : h.uuid();
  if (!h.name().empty()) absl::StrAppend(&what, ", ", h.name());
  return absl::StrCat("rank ", rank, " (", what, ")");
}

constexpr char kTakeOut[] =
    "leave it out (CUDA_VISIBLE_DEVICES, or fewer --gpus), or reset it (nvidia-smi -r) while nothing runs on it; "
    "--health=off runs anyway";

// What makes a GPU's results wrong: its memory returned, or is about to return, bad data.
void JudgeMemory(int rank, const GpuHealth& h, HealthVerdict& v) {
  const std::string gpu = Gpu(rank, h);
  if (h.ecc_uncorrected_volatile() > 0) {
    v.refusals.push_back(absl::StrCat(gpu, ": ", h.ecc_uncorrected_volatile(),
                                      " uncorrected ECC errors since the driver loaded; ", kTakeOut));
  }
  if (h.retired_pages_pending()) {
    v.refusals.push_back(absl::StrCat(gpu, ": retired memory pages wait for a reset; ", kTakeOut));
  }
  if (h.remap_pending()) {
    v.refusals.push_back(absl::StrCat(gpu, ": a memory row remap (", h.remapped_rows_uncorrectable(),
                                      " rows for uncorrectable errors) waits for a reset; ", kTakeOut));
  }
  if (h.remap_failed()) {
    v.refusals.push_back(absl::StrCat(gpu,
                                      ": a memory row remap failed; the GPU needs service; leave it out "
                                      "(CUDA_VISIBLE_DEVICES, or fewer --gpus)"));
  }
}

// What makes a GPU slower than its peers, read at rest: clocks held down, a narrow or slow link.
void JudgeSpeed(int rank, const GpuHealth& h, HealthVerdict& v) {
  const std::string gpu = Gpu(rank, h);
  if (const uint64_t slowing = h.throttle_reasons() & kThrottleSlowing; slowing != 0) {
    v.warnings.push_back(absl::StrCat(gpu, ": clocks held down at rest (", ThrottleNames(slowing),
                                      "); check its cooling and power before trusting its step times"));
  }
  if (h.pcie_width() > 0 && h.pcie_width_max() > 0 && h.pcie_width() < h.pcie_width_max()) {
    v.warnings.push_back(absl::StrCat(gpu, ": PCIe link x", h.pcie_width(), " of x", h.pcie_width_max(),
                                      "; reseat the GPU or check its slot"));
  }
  // An idle link downshifts its generation to save power, so only a slot that can never reach the
  // GPU's generation is worth a warning.
  if (h.pcie_gen_max() > 0 && h.pcie_gen_gpu_max() > 0 && h.pcie_gen_max() < h.pcie_gen_gpu_max()) {
    v.warnings.push_back(absl::StrCat(gpu, ": PCIe gen ", h.pcie_gen_max(),
                                      " at most in this slot (the GPU can do gen ", h.pcie_gen_gpu_max(),
                                      "); host transfers run slower"));
  }
}

const GpuPeerLink* LinkTo(const GpuHealth& from, const std::string& uuid) {
  for (const GpuPeerLink& l : from.peers()) {
    if (l.uuid() == uuid) return &l;
  }
  return nullptr;
}

// Pipeline neighbours exchange activations every micro-batch: say over what, and warn without peer
// access. Neighbours on different hosts (no link in the readings) are not judged here.
std::vector<std::string> JudgeNeighbours(const std::vector<GpuHealth>& gpus, HealthVerdict& v) {
  std::vector<std::string> links;
  for (size_t r = 0; r + 1 < gpus.size(); ++r) {
    const GpuPeerLink* l = LinkTo(gpus[r], gpus[r + 1].uuid());
    if (l == nullptr || gpus[r + 1].uuid().empty()) continue;
    const std::string pair = absl::StrCat("ranks ", r, "-", r + 1);
    if (!l->p2p_read()) {
      v.warnings.push_back(absl::StrCat(pair, ": no peer access between ", gpus[r].uuid(), " and ", gpus[r + 1].uuid(),
                                        l->topology().empty() ? "" : absl::StrCat(" (PCIe path: ", l->topology(), ")"),
                                        "; NCCL stages their transfers through host memory"));
      links.push_back(absl::StrCat(pair, " no peer access"));
    } else if (l->nvlink()) {
      links.push_back(absl::StrCat(pair, " over NVLink"));
    } else {
      links.push_back(
          absl::StrCat(pair, " over PCIe", l->topology().empty() ? "" : absl::StrCat(" (", l->topology(), ")")));
    }
  }
  return links;
}

}  // namespace

std::optional<HealthMode> ParseHealthMode(absl::string_view text) {
  if (text.empty() || text == "warn") return HealthMode::kWarn;
  if (text == "off") return HealthMode::kOff;
  if (text == "strict") return HealthMode::kStrict;
  return std::nullopt;
}

HealthVerdict JudgeHealth(const std::vector<GpuHealth>& gpus, HealthMode mode) {
  HealthVerdict v;
  if (mode == HealthMode::kOff) return v;
  int read = 0;
  for (size_t r = 0; r < gpus.size(); ++r) {
    const GpuHealth& h = gpus[r];
    if (!h.available()) {
      v.warnings.push_back(
          absl::StrCat(Gpu(static_cast<int>(r), h), ": not checked: ", h.error().empty() ? "no readings" : h.error()));
      continue;
    }
    ++read;
    JudgeMemory(static_cast<int>(r), h, v);
    JudgeSpeed(static_cast<int>(r), h, v);
  }
  const std::vector<std::string> links = JudgeNeighbours(gpus, v);
  v.summary = absl::StrCat(read, " of ", gpus.size(), " GPUs read, ", v.refusals.size(), " refused, ",
                           v.warnings.size(), " warning", v.warnings.size() == 1 ? "" : "s", links.empty() ? "" : "; ",
                           absl::StrJoin(links, ", "));
  if (mode == HealthMode::kStrict && !v.warnings.empty()) {
    for (std::string& w : v.warnings) v.refusals.push_back(absl::StrCat(std::move(w), " (--health=strict)"));
    v.warnings.clear();
  }
  return v;
}

}  // namespace stagehand
