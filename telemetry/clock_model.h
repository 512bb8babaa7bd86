// Each GPU's speed for the partition, from its SM clock under load: the clock read while the profile
// ran (or this GPU's last run), and the model that turns clocks into time. Pure logic, no LibTorch.
//
// The model (a first one): a layer's time is inversely proportional to the SM clock it runs at,
// t(c) = t(c0) * c0 / c. That holds for compute-bound layers (the GEMMs and attention that are most of
// a transformer block's time); memory-bound parts (norms, the embedding's gather, the loss) scale
// less, so the model overstates how much a slower clock costs them. H200s at their power limit run
// 1750-1850 MHz under load, so the corrections are a few percent.
#ifndef STAGEHAND_TELEMETRY_CLOCK_MODEL_H_
#define STAGEHAND_TELEMETRY_CLOCK_MODEL_H_

#include <string>
#include <vector>

#include "protos/telemetry.pb.h"

namespace stagehand {

// Samples below this utilisation are not "under load" (the profile's host-side gaps, a step's start).
inline constexpr double kBusyUtilizationPercent = 50;

// The mean SM clock over the samples taken while the GPU was busy, and the fraction of them held at
// the power limit; samples() is 0 when none was busy.
LoadClock BusyClock(const std::vector<GpuSample>& samples, const std::string& source);

// Two readings as one, weighted by their samples (for a run's steps summed as they come).
LoadClock CombineClocks(const LoadClock& a, const LoadClock& b);

// What one rank knows of its clocks: the clock its profile was measured at (profile.samples() == 0:
// none) and its clock under load now (load.samples() == 0: unknown, taken as the profile's).
struct RankClock {
  LoadClock profile;
  LoadClock load;
};

// The weights the partition applies. Clock-blind (applied false, every factor 1) unless every rank
// knows both clocks; `why_not` then says which rank lacks one.
struct ClockWeights {
  bool applied = false;
  std::string why_not;
  double reference_mhz = 0;            // the fastest rank's clock under load
  // Per rank: its profiled times times this are times at the reference clock (profile MHz / reference).
  std::vector<double> profile_scale;
  // Per rank: its speed relative to the reference (load MHz / reference, at most 1): a stage's time on
  // the rank is its time at the reference clock divided by this.
  std::vector<double> speed;
  std::vector<double> load_mhz;        // per rank: the clock it is weighed at (0 when not applied)
};
ClockWeights WeighClocks(const std::vector<RankClock>& ranks);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_CLOCK_MODEL_H_
