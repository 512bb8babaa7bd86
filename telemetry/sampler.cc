// The GPU sampler's thread and the per-step hand-over (see sampler.h).
#include "telemetry/sampler.h"

#include <utility>

#include "telemetry/aggregate.h"

namespace stagehand {

TelemetrySampler::TelemetrySampler(std::unique_ptr<GpuMonitor> monitor, absl::Duration interval)
    : monitor_(std::move(monitor)), interval_(interval), thread_([this] { Loop(); }) {}

TelemetrySampler::~TelemetrySampler() {
  stop_.Notify();
  thread_.join();
}

void TelemetrySampler::Loop() {
  do {
    absl::StatusOr<GpuSample> s = monitor_->Sample();
    absl::MutexLock lock(&mu_);
    if (!s.ok()) {
      ++errors_;
      continue;
    }
    ++taken_;
    latest_ = *s;
    if (pending_.size() < kMaxPending) pending_.push_back(*std::move(s));
  } while (!stop_.WaitForNotificationWithTimeout(interval_));
}

StepTelemetry TelemetrySampler::TakeStep() {
  std::vector<GpuSample> samples;
  std::optional<GpuSample> latest;
  {
    absl::MutexLock lock(&mu_);
    samples.swap(pending_);
    latest = latest_;
  }
  return SummarizeStep(samples, latest ? &*latest : nullptr, /*raw=*/true);
}

bool TelemetrySampler::AwaitSamples(int count, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto enough = [this, count]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return taken_ >= count; };
  return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
}

int TelemetrySampler::errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
}

}  // namespace stagehand
