// Partitions a model's ordered layers into contiguous pipeline stages: minimise the slowest stage
// (forward plus backward time) subject to each stage fitting its GPU's memory. Also the uniform and
// explicit partitions. Pure logic: costs come from the workers' profiles.
#ifndef STAGEHAND_LAUNCHER_PLAN_PLANNER_H_
#define STAGEHAND_LAUNCHER_PLAN_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {

struct PlanLayer {
  double forward_ms = 0;
  double backward_ms = 0;
  int64_t param_bytes = 0;       // parameters, gradients and optimizer state together
  int64_t activation_bytes = 0;  // kept per in-flight micro-batch until its backward
};

struct PlanRequest {
  std::vector<PlanLayer> layers;  // in model order
  int stages = 1;
  std::vector<int64_t> memory_bytes;  // usable memory of each stage's device (empty: unlimited)
  // Micro-batches whose activations stage s holds at once: for 1F1B min(stages - s, microbatches),
  // for GPipe all of them; the planner takes this vector as given (one entry per stage).
  std::vector<int> in_flight;
  bool forward_only = false;  // inference: forward time only, no gradients or optimizer state
  // Each stage's device speed relative to the one the layer costs are for (1: as fast; 0.9: a GPU at
  // 90% of the clock takes 1/0.9 of the time), so that a slower GPU gets less work. Empty: 1 each.
  std::vector<double> stage_speed;
};

struct Plan {
  std::vector<int> layers_per_stage;  // sums to layers.size(); every entry >= 1
  std::vector<double> stage_ms;       // forward (+ backward) time of each stage, at its device's speed
  std::vector<int64_t> stage_bytes;   // memory estimate of each stage
  double bottleneck_ms = 0;           // the slowest stage
};

// The best contiguous partition (exact, by dynamic programming or binary search over the bottleneck).
// INVALID_ARGUMENT when stages > layers or stages < 1; RESOURCE_EXHAUSTED naming the stage and the
// bytes needed against the bytes available when no partition fits.
absl::StatusOr<Plan> PlanBalanced(const PlanRequest& request);
// Layer counts as even as possible, extra layers to the earlier stages; checked against memory too.
absl::StatusOr<Plan> PlanUniform(const PlanRequest& request);
// Explicit counts; INVALID_ARGUMENT unless there is one per stage, each >= 1, summing to the layers.
absl::StatusOr<Plan> PlanExplicit(const PlanRequest& request, const std::vector<int>& layers_per_stage);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_PLAN_PLANNER_H_
