// The clock-aware side of the partition: each rank's SM clock under load weighed into the
// stages' costs (telemetry/clock_model.h: time ~ 1/clock), the clocks in the plan line, and each
// rank's predicted compute per step for the report's predicted-against-measured. Used by job_plan.cc.
#ifndef STAGEHAND_LAUNCHER_PLAN_PLAN_CLOCKS_H_
#define STAGEHAND_LAUNCHER_PLAN_PLAN_CLOCKS_H_

#include <string>
#include <vector>

#include "launcher/coordinator/coordinator.h"
#include "protos/job.pb.h"
#include "schedule/schedule.h"
#include "telemetry/clock_model.h"

namespace stagehand {

// Whether the partition weighs the GPUs' clocks (JobSpec.partition_clocks): GPU jobs with telemetry,
// unless partition_clocks is false. CPU jobs never.
bool WeighsClocks(const JobSpec& job);

// Each registered rank's clocks, weighed (every factor 1 when clock-blind; why_not says why).
ClockWeights RankClocks(const JobSpec& job, const std::vector<WorkerState>& workers);

// Each (virtual) stage's speed: its pipeline rank's, the slowest of its replicas (they meet at the
// gradients' all-reduce, so the slowest sets the pace). Empty when the clocks are not weighed.
std::vector<double> StageSpeeds(const JobSpec& job, const Schedule& schedule, const ClockWeights& w);

// For the plan line of GPU jobs: "; SM clocks (each GPU's last run, time ~ 1/clock): rank 0 1752 MHz,
// rank 1 1841 MHz" (or "(the profiles, ...)") or
// "; clock-blind: <why>"; "" for CPU jobs.
std::string ClockText(const JobSpec& job, const ClockWeights& w);

// Per rank (every replica's too): the simulated compute per step at its own speed, and the clock it
// was weighed at (0 when clock-blind), into out.predicted_compute_ms and out.planned_sm_mhz.
// `optimizer_ms`: the simulated optimizer step, which is not compute measured as forward + backward.
void FillRankPredictions(const JobSpec& job, const Schedule& schedule, const SimulationResult& predicted,
                         const std::vector<double>& stage_speed, const ClockWeights& w, Partition& out,
                         double optimizer_ms = 0);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_PLAN_PLAN_CLOCKS_H_
