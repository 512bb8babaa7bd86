// Per-step summaries of GPU samples (mean, worst, fraction of samples per throttle reason) and the
// run's summary of a rank from its steps. Pure functions, unit-tested on fake samples.
#ifndef STAGEHAND_TELEMETRY_AGGREGATE_H_
#define STAGEHAND_TELEMETRY_AGGREGATE_H_

#include <vector>

#include "protos/telemetry.pb.h"

namespace stagehand {

// One step from the samples taken during it (`raw` copies them into the summary, for the trace).
// Without samples (a step shorter than the sampling interval) `latest`, when given, stands in for
// them and `samples` says 0.
StepTelemetry SummarizeStep(const std::vector<GpuSample>& samples, const GpuSample* latest, bool raw);

// A rank's steps as one summary: means weighted by each step's samples (a step of 0 samples weighs
// as one), the lowest clock, the highest power and temperature, fractions over all samples, the
// union of the reasons. No raw samples.
StepTelemetry CombineSteps(const std::vector<const StepTelemetry*>& steps);

}  // namespace stagehand

#endif  // STAGEHAND_TELEMETRY_AGGREGATE_H_
