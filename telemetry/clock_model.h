// Each GPU's speed for the partition, from its SM clock under load: the clock read while the profile
// ran (or this GPU's last run), and the model that turns clocks into time. Pure logic, no LibTorch.
//
// The model (a first one): a layer's time is inversely proportional to the SM clock it runs at,
// t(c) = t(c0) * c0 / c. That holds for compute-bound layers (the GEMMs and attention that are most of
// a transformer block's time); memory-bound parts (norms, the embedding's gather, the loss) scale
// less, so the model overstates how much a slower clock costs them. H200s at their power limit run
// 1650-1850 MHz under load, so the corrections between GPUs are a few percent.
//
// It is applied relatively: each rank's speed is its clock over the fastest rank's, and the profiles
// are rescaled only among themselves (to the fastest profile's clock). The profile is a burst of a few
// milliseconds per layer kind, run at boost clocks (1980 MHz on an H200) that no GPU sustains at its
// power limit, so absolute rescaling to a sustained clock would move every prediction; relative speeds
// leave the fastest rank's prediction where the clock-blind plan puts it.
#ifndef STAGEHAND_TELEMETRY_CLOCK_MODEL_H_
#define STAGEHAND_TELEMETRY_CLOCK_MODEL_H_

#include <string>
#include <vector>

#include "protos/telemetry.pb.h"

namespace stagehand {

// Samples below this utilisation are not "under load" (the profile's host-side gaps, a step's start).
inline constexpr double kBusyUtilizationPercent = 50;

// The mean SM clock over the samples taken while the GPU was busy (at least kBusyUtilizationPercent;
// where none was, as in a profile's short bursts, those with any utilisation), and the fraction of
// them held at the power limit; samples() is 0 when no kernel ran in any.
LoadClock BusyClock(const std::vector<GpuSample>& samples, const std::string& source);

// Two readings as one, weighted by their samples (for a run's steps summed as they come).
LoadClock CombineClocks(const LoadClock& a, const LoadClock& b);

// What one rank knows of its clocks: the clock its profile was measured at (profile.samples() == 0:
// none) and its GPU's sustained clock under load in its last run of this job (load.samples() == 0:
// none recorded).
struct RankClock {
  LoadClock profile;
  LoadClock load;
};

// The weights the partition applies. Speeds come from the last runs' clocks where every rank has one
// (sustained, under this job's load), else from the profiles' clocks where every rank has one; else
// clock-blind (applied false, every factor 1), with `why_not` naming the rank that lacks a clock.
// Profiles are rescaled among themselves where every rank's has a clock (else left as measured).
struct ClockWeights {
  bool applied = false;
  std::string why_not;
  std::string source;        // "last run" or "profile": where the speeds came from
  double reference_mhz = 0;  // the fastest rank's clock
  // Per rank: its profiled times times this are times at the fastest profile's clock.
  std::vector<double> profile_scale;
  // Per rank: its speed relative to the fastest (its clock / reference, at most 1): a stage's time on
  // the rank is its time at the reference divided by this.
  std::vector<double> speed;
  std::vector<double> load_mhz;  // per rank: the clock it is weighed at (0 when not applied)
};
ClockWeights WeighClocks(const std::vector<RankClock>& ranks);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_CLOCK_MODEL_H_
