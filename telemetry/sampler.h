// A worker's GPU sampler: a thread of its own reads the GpuMonitor every `interval` (10 Hz by default)
// and keeps the samples; the step loop takes each step's summary when it reports the step. The step
// loop never waits on NVML: TakeStep only swaps a vector under a lock.
#ifndef STAGEHAND_TELEMETRY_SAMPLER_H_
#define STAGEHAND_TELEMETRY_SAMPLER_H_

#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "protos/telemetry.pb.h"
#include "telemetry/gpu_monitor.h"

namespace stagehand {

inline constexpr absl::Duration kDefaultSampleInterval = absl::Milliseconds(100);

class TelemetrySampler {
 public:
  // Takes the first sample at once, then one every `interval`.
  TelemetrySampler(std::unique_ptr<GpuMonitor> monitor, absl::Duration interval = kDefaultSampleInterval);
  ~TelemetrySampler();  // stops and joins the thread
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;

  // The summary of the samples taken since the last call (SummarizeStep, raw samples included).
  StepTelemetry TakeStep();

  // For tests: true once `count` samples have been taken in all (false if `timeout` passes first).
  bool AwaitSamples(int count, absl::Duration timeout) const;
  // Samples the monitor refused (the GPU fell off the bus, say); they are skipped.
  int errors() const;

 private:
  void Loop();

  // A step longer than this many samples (a 400 s step at 10 Hz) keeps only the first ones: the
  // summary then covers the start of the step.
  static constexpr size_t kMaxPending = 4096;

  const std::unique_ptr<GpuMonitor> monitor_;
  const absl::Duration interval_;
  absl::Notification stop_;
  mutable absl::Mutex mu_;
  std::vector<GpuSample> pending_ ABSL_GUARDED_BY(mu_);
  std::optional<GpuSample> latest_ ABSL_GUARDED_BY(mu_);
  int taken_ ABSL_GUARDED_BY(mu_) = 0;
  int errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_SAMPLER_H_
