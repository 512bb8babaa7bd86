// Clocks under load and the partition's clock weights (see clock_model.h).
#include "telemetry/clock_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "telemetry/throttle.h"

namespace stagehand {

LoadClock BusyClock(const std::vector<GpuSample>& samples, const std::string& source) {
  LoadClock out;
  out.set_source(source);
  double mhz = 0;
  int busy = 0, capped = 0;
  for (const GpuSample& s : samples) {
    if (s.utilization_percent() < kBusyUtilizationPercent || s.sm_mhz() <= 0) continue;
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
  std::vector<double> profile(n), load(n);
  for (size_t r = 0; r < n; ++r) {
    const RankClock& c = ranks[r];
    if (c.profile.samples() <= 0 || c.profile.sm_mhz() <= 0) {
      w.why_not = absl::StrCat("rank ", r, " measured its profile without an SM clock reading");
      return w;
    }
    profile[r] = c.profile.sm_mhz();
    load[r] = c.load.samples() > 0 && c.load.sm_mhz() > 0 ? c.load.sm_mhz() : profile[r];
  }
  if (n == 0) return w;
  // The fastest rank is the reference, so that equal clocks give factors of exactly 1 (x / x == 1 in
  // IEEE arithmetic) and the partition is exactly the clock-blind one.
  w.reference_mhz = *std::max_element(load.begin(), load.end());
  for (size_t r = 0; r < n; ++r) {
    w.profile_scale[r] = profile[r] / w.reference_mhz;
    w.speed[r] = load[r] / w.reference_mhz;
    w.load_mhz[r] = load[r];
  }
  w.applied = true;
  return w;
}

}  // namespace stagehand
