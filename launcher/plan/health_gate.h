// The launcher's side of the GPU health gate: the coordinator's admission check (coordinator.h) for a
// job, judging every worker's pre-flight readings with telemetry/health.h once all have registered.
// It prints the warnings and a summary line; a refusal stops the job before any step, and the launcher
// exits 4 (a worker could not be started) with the refusal as the root cause.
#ifndef STAGEHAND_LAUNCHER_PLAN_HEALTH_GATE_H_
#define STAGEHAND_LAUNCHER_PLAN_HEALTH_GATE_H_

#include <functional>
#include <string>

#include "launcher/coordinator/coordinator.h"
#include "protos/job.pb.h"

namespace stagehand {

// The admission check of `job`: none (nullptr) for CPU jobs and with health "off". `print` takes each
// line to show the user (default: stdout, "stagehand: health: ...").
AdmissionFn HealthAdmission(const JobSpec& job, std::function<void(const std::string&)> print = nullptr);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_PLAN_HEALTH_GATE_H_
