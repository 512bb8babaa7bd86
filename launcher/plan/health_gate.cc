// The GPU health gate as the coordinator's admission check (see health_gate.h).
//
// Why here and not in each worker: the coordinator sees every GPU at once, so one message names every
// GPU it refuses and the job stops once, with one root cause, rather than N workers failing on their
// own; the neighbours' link (peer access, NVLink or PCIe) needs both GPUs' identities, which only the
// coordinator has before the assignment; and the policy (--health) stays in one place while the
// workers only report what they read.
#include "launcher/plan/health_gate.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "telemetry/health.h"

namespace stagehand {

AdmissionFn HealthAdmission(const JobSpec& job, std::function<void(const std::string&)> print) {
  const std::optional<HealthMode> mode = ParseHealthMode(job.health());
  if (job.device() != "cuda" || !mode || *mode == HealthMode::kOff) return nullptr;
  if (!print) {
    print = [](const std::string& line) {
      std::printf("stagehand: health: %s\n", line.c_str());
      std::fflush(stdout);
    };
  }
  return [mode = *mode, print = std::move(print)](const std::vector<WorkerState>& workers) -> absl::Status {
    std::vector<GpuHealth> gpus;
    for (const WorkerState& w : workers) {
      GpuHealth h = w.health;
      if (h.uuid().empty()) h.set_uuid(w.device.uuid());  // a worker that sent no readings
      if (h.name().empty()) h.set_name(w.device.name());
      if (!h.available() && h.error().empty()) h.set_error("the worker sent no health readings");
      gpus.push_back(std::move(h));
    }
    const HealthVerdict v = JudgeHealth(gpus, mode);
    for (const std::string& w : v.warnings) print(absl::StrCat("warning: ", w));
    print(v.summary);
    if (!v.refused()) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat("GPU health: ", absl::StrJoin(v.refusals, "; ")));
  };
}

}  // namespace stagehand
