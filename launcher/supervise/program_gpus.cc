// The launcher's readings of a program job's GPUs (program_gpus.h).
#include "launcher/supervise/program_gpus.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_option.h"
#include "telemetry/health.h"
#include "telemetry/nvml_monitor.h"

namespace stagehand {

absl::StatusOr<std::unique_ptr<ProgramGpus>> ProgramGpus::Start(const JobSpec& job, const std::vector<GpuInfo>& gpus,
                                                                const OpenMonitor& open,
                                                                const std::function<void(const std::string&)>& print,
                                                                absl::Duration interval) {
  auto out = std::make_unique<ProgramGpus>();
  const std::optional<HealthMode> mode = ParseHealthMode(job.health());
  const bool gate = mode && *mode != HealthMode::kOff;
  const bool sample = BoolOption(job, JobSpec::kTelemetryFieldNumber);
  if (job.device() != "cuda" || gpus.empty() || (!gate && !sample)) return out;  // NVML is not opened
  std::vector<std::unique_ptr<GpuMonitor>> monitors;
  std::vector<std::string> errors(gpus.size());
  std::vector<std::string> unopened;
  for (size_t r = 0; r < gpus.size(); ++r) {
    absl::StatusOr<std::unique_ptr<GpuMonitor>> monitor = open(gpus[r].uuid);
    if (monitor.ok()) {
      monitors.push_back(*std::move(monitor));
    } else {
      monitors.push_back(nullptr);
      errors[r] = std::string(monitor.status().message());
      unopened.push_back(absl::StrCat("rank ", r, " (", gpus[r].uuid, "): ", errors[r]));
    }
  }
  if (gate) {
    std::vector<GpuHealth> readings;
    for (size_t r = 0; r < gpus.size(); ++r) {
      if (monitors[r] != nullptr) {
        readings.push_back(monitors[r]->ReadHealth());
      } else {
        GpuHealth h;  // unreadable: the gate warns (or, strict, refuses) as for a worker's
        h.set_uuid(gpus[r].uuid);
        h.set_error(errors[r]);
        readings.push_back(std::move(h));
      }
    }
    const HealthVerdict verdict = JudgeHealth(readings, *mode);
    for (const std::string& w : verdict.warnings) print(w);
    if (verdict.refused()) return absl::FailedPreconditionError(absl::StrJoin(verdict.refusals, "; "));
    if (!verdict.summary.empty()) print(verdict.summary);
  }
  if (!sample) return out;
  if (!unopened.empty()) print(absl::StrCat("no telemetry for ", absl::StrJoin(unopened, "; ")));
  out->samplers_.resize(gpus.size());
  for (size_t r = 0; r < gpus.size(); ++r) {
    if (monitors[r] != nullptr)
      out->samplers_[r] = std::make_unique<TelemetrySampler>(std::move(monitors[r]), interval);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ProgramGpus>> ProgramGpus::Start(const JobSpec& job, const std::vector<GpuInfo>& gpus,
                                                                const std::function<void(const std::string&)>& print) {
  return Start(
      job, gpus, [](const std::string& uuid) { return OpenNvmlMonitor(uuid); }, print);
}

std::optional<StepTelemetry> ProgramGpus::TakeStep(int rank) {
  if (rank < 0 || rank >= static_cast<int>(samplers_.size()) || samplers_[rank] == nullptr) return std::nullopt;
  return samplers_[rank]->TakeStep();
}

int ProgramGpus::sampled() const {
  int n = 0;
  for (const auto& s : samplers_) n += s != nullptr;
  return n;
}

bool ProgramGpus::AwaitSamples(int count, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  for (const auto& s : samplers_) {
    if (s != nullptr && !s->AwaitSamples(count, deadline - absl::Now())) return false;
  }
  return true;
}

}  // namespace stagehand
