// --layout=auto: chooses how a job's workers are used, stages x replicas x schedule x micro-batches,
// by simulated step time (schedule/'s Simulate over the partition planner.h makes for each candidate)
// plus the replicas' gradient all-reduce, within each device's memory. Pure logic: the costs come from
// a profile (a worker's measurement, a recorded one, or a family's estimate).
#ifndef STAGEHAND_LAUNCHER_LAYOUT_H_
#define STAGEHAND_LAUNCHER_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/planner.h"

namespace stagehand {

struct LayoutRequest {
  std::vector<PlanLayer> layers;       // per pipeline layer, measured at `profile_micro_batch` sequences
  int64_t profile_micro_batch = 1;     // costs and activations scale linearly from it
  int workers = 1;
  int64_t global_batch = 1;            // sequences per step, over all replicas
  // Schedules by the names schedule/MakeSchedule knows; a name it does not know (yet) is skipped and
  // listed in LayoutChoice::skipped, so new schedules slot in by name.
  std::vector<std::string> schedules = {"gpipe", "1f1b"};
  int64_t memory_bytes = 0;            // usable memory per device (0: unlimited)
  double replica_gbps = 100;           // the all-reduce's bus bandwidth between replicas
  bool shard_optimizer = false;        // ZeRO-1: each replica holds 1/D of the AdamW moments
};

struct LayoutCandidate {
  int stages = 1;
  int replicas = 1;
  std::string schedule;
  int micro_batches = 1;               // per replica
  int64_t micro_batch = 1;             // sequences per micro-batch
  std::vector<int> layers_per_stage;
  double pipeline_ms = 0;              // the simulated schedule
  double bubble = 0;
  double allreduce_ms = 0;             // 2 (D-1)/D x the largest stage's gradient bytes / bandwidth
  double step_ms = 0;                  // pipeline_ms + allreduce_ms (our overlap is per chunk: counted whole)
  int64_t peak_bytes = 0;              // the fullest stage's parameters, state and activations in flight
};

struct LayoutChoice {
  std::vector<LayoutCandidate> ranked;  // fastest first; ties by fewer stages, schedule name, fewer micro-batches
  std::vector<std::string> skipped;     // "4 stages x 2, gpipe, 8 micro-batches: does not fit (...)"
};

// The micro-batch counts tried for `stages`: {stages, 2 stages, 4 stages, 8, 16, 32}, ascending, unique.
std::vector<int> MicroBatchCandidates(int stages);

// Every candidate simulated and ranked. INVALID_ARGUMENT when no layer or worker; FAILED_PRECONDITION
// naming the reasons when no candidate fits.
absl::StatusOr<LayoutChoice> ChooseLayout(const LayoutRequest& request);

// One line on a candidate and why it costs what it does:
// "2 stages x 4 replicas, 1f1b, 8 micro-batches of 1: 41.2 ms (pipeline 38.0 ms, bubble 11.1%; all-reduce 3.2 ms); 12.3 GiB peak".
std::string Describe(const LayoutCandidate& c);

// The all-reduce time of `bytes` over `replicas` at `gbps` (ring: 2 (D-1)/D of the bytes each way), ms.
double AllReduceMs(int64_t bytes, int replicas, double gbps);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_LAYOUT_H_
