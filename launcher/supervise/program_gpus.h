// The launcher's own readings of a program job's GPUs. Our workers read their GPU themselves (the
// health gate's pre-flight readings at registration, NVML samples per step); a program's ranks are
// not ours to instrument, so the launcher takes both for them: the health gate before any rank
// starts, and one sampler per rank's GPU whose summary joins each step the rank reports through
// `stagehand.step()` (steps.csv, report.json and trace.json, as for a job of ours).
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_PROGRAM_GPUS_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_PROGRAM_GPUS_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/plan/devices.h"
#include "protos/job.pb.h"
#include "protos/telemetry.pb.h"
#include "telemetry/gpu_monitor.h"
#include "telemetry/sampler.h"

namespace stagehand {

class ProgramGpus {
 public:
  // Opens a GPU by UUID (OpenNvmlMonitor; a fake in tests).
  using OpenMonitor = std::function<absl::StatusOr<std::unique_ptr<GpuMonitor>>(const std::string& uuid)>;

  // For a GPU job (`gpus[r]` is rank r's GPU): judges every GPU's health unless the job's health is
  // "off" (telemetry/health.h; warnings and the summary go to `print`), then starts a sampler per
  // GPU where the job's telemetry is on. FAILED_PRECONDITION with the gate's refusals when it refuses
  // the job; a GPU whose monitor cannot be opened has no telemetry (said once through `print`).
  // A CPU job gets an object that samples nothing.
  static absl::StatusOr<std::unique_ptr<ProgramGpus>> Start(const JobSpec& job, const std::vector<GpuInfo>& gpus,
                                                            const OpenMonitor& open,
                                                            const std::function<void(const std::string&)>& print,
                                                            absl::Duration interval = kDefaultSampleInterval);
  // The launcher's: NVML.
  static absl::StatusOr<std::unique_ptr<ProgramGpus>> Start(const JobSpec& job, const std::vector<GpuInfo>& gpus,
                                                            const std::function<void(const std::string&)>& print);

  // Rank `rank`'s GPU since the rank's last step, for the step it just reported; nullopt where
  // nothing samples it.
  std::optional<StepTelemetry> TakeStep(int rank);

  int sampled() const;  // ranks with a sampler
  // Whether every sampler has taken `count` samples within `timeout` (for tests).
  bool AwaitSamples(int count, absl::Duration timeout) const;

 private:
  std::vector<std::unique_ptr<TelemetrySampler>> samplers_;  // by rank; null: not sampled
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_PROGRAM_GPUS_H_
