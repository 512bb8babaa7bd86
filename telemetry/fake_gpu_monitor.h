// A GpuMonitor that replays scripted samples (the last one again once the script runs out) and returns
// fixed health readings, for tests of the sampler and of what uses its output.
#ifndef STAGEHAND_TELEMETRY_FAKE_GPU_MONITOR_H_
#define STAGEHAND_TELEMETRY_FAKE_GPU_MONITOR_H_

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "telemetry/gpu_monitor.h"

namespace stagehand {

class FakeGpuMonitor : public GpuMonitor {
 public:
  explicit FakeGpuMonitor(std::vector<GpuSample> samples, GpuHealth health = GpuHealth())
      : samples_(std::move(samples)), health_(std::move(health)) {}

  absl::StatusOr<GpuSample> Sample() override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    if (samples_.empty()) return absl::UnavailableError("fake: no samples");
    const GpuSample& s = samples_[std::min(next_, samples_.size() - 1)];
    ++next_;
    return s;
  }
  GpuHealth ReadHealth() override { return health_; }

  int calls() const {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // True once Sample() has been called `count` times (false if `timeout` passes first).
  bool AwaitCalls(int count, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<GpuSample> samples_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  const GpuHealth health_;
};

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_FAKE_GPU_MONITOR_H_
