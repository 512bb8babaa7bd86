// The partition's clock weights and per-rank predictions (see plan_clocks.h).
#include "launcher/plan/plan_clocks.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/job_option.h"

namespace stagehand {

bool WeighsClocks(const JobSpec& job) {
  return job.device() == "cuda" && BoolOption(job, JobSpec::kTelemetryFieldNumber) &&
         BoolOption(job, JobSpec::kPartitionClocksFieldNumber);
}

ClockWeights RankClocks(const JobSpec& job, const std::vector<WorkerState>& workers) {
  if (!WeighsClocks(job)) {
    ClockWeights blind = WeighClocks({});
    blind.profile_scale.assign(workers.size(), 1.0);
    blind.speed.assign(workers.size(), 1.0);
    blind.load_mhz.assign(workers.size(), 0.0);
    blind.why_not = "--partition_clocks=false or --telemetry=false";
    return blind;
  }
  std::vector<RankClock> clocks;
  for (const WorkerState& w : workers) clocks.push_back({w.profile.clock(), w.load_clock});
  return WeighClocks(clocks);
}

std::vector<double> StageSpeeds(const JobSpec& job, const Schedule& schedule, const ClockWeights& w) {
  if (!w.applied) return {};
  const int d = std::max(1, job.data_parallel());
  std::vector<double> out;
  for (int rank : schedule.stage_rank) {
    double v = 1.0;
    for (int replica = 0; replica < d; ++replica) {
      const size_t r = static_cast<size_t>(replica * schedule.num_ranks + rank);
      if (r < w.speed.size()) v = std::min(v, w.speed[r]);
    }
    out.push_back(v);
  }
  return out;
}

std::string ClockText(const JobSpec& job, const ClockWeights& w) {
  if (job.device() != "cuda") return "";
  if (!w.applied) return absl::StrCat("; clock-blind: ", w.why_not);
  std::string out = absl::StrCat("; SM clocks (", w.source == "last run" ? "each GPU's last run" : "the profiles",
                                 ", time ~ 1/clock):");
  for (size_t r = 0; r < w.load_mhz.size(); ++r) {
    absl::StrAppend(&out, absl::StrFormat("%s rank %d %.0f MHz", r ? "," : "", r, w.load_mhz[r]));
  }
  return out;
}

void FillRankPredictions(const JobSpec& job, const Schedule& schedule, const SimulationResult& predicted,
                         const std::vector<double>& stage_speed, const ClockWeights& w, Partition& out,
                         double optimizer_ms) {
  const int d = std::max(1, job.data_parallel());
  for (int r = 0; r < schedule.num_ranks * d; ++r) {
    const int pr = r % schedule.num_ranks;
    double busy = pr < static_cast<int>(predicted.busy.size()) ? std::max(0.0, predicted.busy[pr] - optimizer_ms) : 0;
    if (!stage_speed.empty() && r < static_cast<int>(w.speed.size())) {
      for (int s = 0; s < schedule.num_stages; ++s) {
        if (schedule.stage_rank[s] == pr) {
          busy = busy * stage_speed[s] / w.speed[r];
          break;
        }
      }
    }
    out.predicted_compute_ms.push_back(busy);
    out.planned_sm_mhz.push_back(r < static_cast<int>(w.load_mhz.size()) ? w.load_mhz[r] : 0);
  }
}

}  // namespace stagehand
