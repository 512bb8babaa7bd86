// Clocks under load and the partition's clock weights (see clock_model.h).
#include "telemetry/clock_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "telemetry/throttle.h"

namespace stagehand {

namespace {

bool Known(const LoadClock& c) { return c.samples() > 0 && c.sm_mhz() > 0; }

LoadClock MeanClock(const std::vector<GpuSample>& samples, double min_utilization, const std::string& source) {
  LoadClock out;
  out.set_source(source);
  double mhz = 0;
  int busy = 0, capped = 0;
  for (const GpuSample& s : samples) {
    if (s.utilization_percent() < min_utilization || s.utilization_percent() <= 0 || s.sm_mhz() <= 0) continue;
    mhz += s.sm_mhz();
    ++busy;
    if (s.throttle_reasons() & kThrottleSwPowerCap) ++capped;
  }
  if (busy == 0) return out;
  out.set_sm_mhz(mhz / busy);
  out.set_power_capped_fraction(static_cast<double>(capped) / busy);
  out.set_samples(busy);
  return out;
}

// Each rank's clock divided by the fastest's: exactly 1 for equal clocks (x / x == 1 in IEEE
// arithmetic), so that equal clocks give exactly the clock-blind partition.
std::vector<double> Relative(const std::vector<double>& mhz, double* reference) {
  *reference = *std::max_element(mhz.begin(), mhz.end());
  std::vector<double> out;
  for (double m : mhz) out.push_back(m / *reference);
  return out;
}

}  // namespace

LoadClock BusyClock(const std::vector<GpuSample>& samples, const std::string& source) {
  LoadClock busy = MeanClock(samples, kBusyUtilizationPercent, source);
  return busy.samples() > 0 ? busy : MeanClock(samples, 0, source);
}

LoadClock CombineClocks(const LoadClock& a, const LoadClock& b) {
  if (b.samples() <= 0) return a;
  if (a.samples() <= 0) return b;
  LoadClock out = a;
  const double wa = a.samples(), wb = b.samples();
  out.set_sm_mhz((a.sm_mhz() * wa + b.sm_mhz() * wb) / (wa + wb));
  out.set_power_capped_fraction((a.power_capped_fraction() * wa + b.power_capped_fraction() * wb) / (wa + wb));
  out.set_samples(a.samples() + b.samples());
  return out;
}

ClockWeights WeighClocks(const std::vector<RankClock>& ranks) {
  ClockWeights w;
  const size_t n = ranks.size();
  w.profile_scale.assign(n, 1.0);
  w.speed.assign(n, 1.0);
  w.load_mhz.assign(n, 0.0);
  if (n == 0) return w;
  int no_profile = -1, no_load = -1;
  std::vector<double> profile, load;
  for (size_t r = 0; r < n; ++r) {
    if (Known(ranks[r].profile))
      profile.push_back(ranks[r].profile.sm_mhz());
    else if (no_profile < 0)
      no_profile = static_cast<int>(r);
    if (Known(ranks[r].load))
      load.push_back(ranks[r].load.sm_mhz());
    else if (no_load < 0)
      no_load = static_cast<int>(r);
  }
  double profile_reference = 0;
  if (no_profile < 0) w.profile_scale = Relative(profile, &profile_reference);
  if (no_load < 0) {
    w.source = "last run";
    w.load_mhz = load;
    w.speed = Relative(load, &w.reference_mhz);
  } else if (no_profile < 0) {
    w.source = "profile";
    w.load_mhz = profile;
    w.speed = w.profile_scale;
    w.reference_mhz = profile_reference;
  } else {
    w.why_not = absl::StrCat("rank ", no_profile, " measured its profile without an SM clock reading and rank ",
                             no_load, " has no last run's clock");
    return w;
  }
  w.applied = true;
  return w;
}

}  // namespace stagehand
