// --layout=auto: chooses how a job's workers are used, stages x replicas x schedule x micro-batches,
// by simulated step time (schedule/'s Simulate over the partition planner.h makes for each candidate)
// plus the transfers between stages, the optimizer step and the replicas' gradient all-reduce, within
// each device's memory. Pure logic: the costs come from profiles (a worker's measurement, recorded
// ones, or a family's estimate) at one or more micro-batch sizes.
#ifndef STAGEHAND_LAUNCHER_PLAN_LAYOUT_H_
#define STAGEHAND_LAUNCHER_PLAN_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/plan/planner.h"

namespace stagehand {

// Every layer's costs measured at one micro-batch size (sequences per micro-batch).
struct LayerProfileAt {
  int64_t micro_batch = 1;
  std::vector<PlanLayer> layers;
};

// One layer's cost as a function of the micro-batch size b: fixed + per_seq x b. The fixed part is
// what a kernel costs whatever its size (launches, tails, small GEMMs' poor use of the GPU): a cost
// linear through zero would make b = 1 look as cheap per sequence as b = 8, which it is not.
struct LayerCostModel {
  double forward_fixed_ms = 0, forward_per_seq_ms = 0;
  double backward_fixed_ms = 0, backward_per_seq_ms = 0;
  int64_t param_bytes = 0;              // parameters, gradients and optimizer state (16 per parameter)
  double activation_bytes_per_seq = 0;  // activations kept per micro-batch scale with its sequences
  PlanLayer At(int64_t micro_batch) const;
};

// Per layer, the least-squares line through the profiles' times (>= 2 distinct sizes), each part
// clamped at zero (a negative intercept becomes a line through zero fitted to the points; a negative
// slope a constant). With one size the line goes through zero (linear in b; `fit` says
// so). Activations: proportional to b, from the largest profile. INVALID_ARGUMENT when the profiles
// are empty, disagree on the layer count, or hold a size below 1.
struct LayerFit {
  std::vector<LayerCostModel> layers;
  std::vector<int64_t> sizes;       // the micro-batch sizes fitted, ascending
  double worst_relative_error = 0;  // of the fitted per-layer forward + backward at those sizes
  double assumed_fixed_ms = 0;      // per layer, forward + backward, added to a one-size profile
};
absl::StatusOr<LayerFit> FitLayerCosts(const std::vector<LayerProfileAt>& profiles);

struct LayoutRequest {
  // Measured (or estimated) at one or more micro-batch sizes; two or more give each layer a fixed cost.
  std::vector<LayerProfileAt> profiles;
  int workers = 1;
  int64_t global_batch = 1;  // sequences per step, over all replicas
  // Schedules by the names schedule/MakeSchedule knows (with its default chunks); a name it does not
  // know, or whose rules a candidate breaks, is skipped and listed in LayoutChoice::skipped.
  std::vector<std::string> schedules = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"};
  // Zero-bubble split: the share of each layer's backward that is the weight gradient (W, deferred
  // GEMMs); the rest is the input gradient (I). An estimate: the profile times B whole.
  double weight_grad_share = 0.5;
  int64_t memory_bytes = 0;          // usable memory per device (0: unlimited)
  double replica_gbps = 100;         // the all-reduce's bus bandwidth between replicas
  double replica_latency_ms = 0.05;  // per all-reduce
  // Transfers between stages: one activation (forward) or gradient (backward) of
  // boundary_bytes_per_seq x micro-batch bytes each, at p2p_gbps after p2p_latency_ms (0 GB/s: free).
  int64_t boundary_bytes_per_seq = 0;
  double p2p_gbps = 0;
  double p2p_latency_ms = 0.02;
  // With profiles at one size only (a family's estimate): a fixed cost added to every layer, the cost
  // at the profiled size kept (the per-sequence part gives it up). 0: linear through zero.
  double layer_fixed_forward_ms = 0, layer_fixed_backward_ms = 0;
  // AdamW's step, in ms per GB of param_bytes (the fullest rank's); 0: free.
  double optimizer_ms_per_gb = 0;
  bool shard_optimizer = false;  // ZeRO-1: each replica holds 1/D of the AdamW moments
};

struct LayoutCandidate {
  int stages = 1;  // pipeline ranks per replica
  int replicas = 1;
  std::string schedule;
  int chunks = 1;                     // model chunks per rank (interleaved-1f1b, zb-v: 2)
  int micro_batches = 1;              // per replica
  int64_t micro_batch = 1;            // sequences per micro-batch
  std::vector<int> layers_per_stage;  // per virtual stage
  double pipeline_ms = 0;             // the simulated schedule, with transfers and the optimizer step
  double bubble = 0;
  double slowest_stage_ms = 0;  // forward + backward of one micro-batch on the slowest virtual stage
  double fixed_share = 0;       // of that, the layers' fixed (size-independent) part
  double p2p_ms = 0;            // one transfer between stages
  double optimizer_ms = 0;
  double allreduce_ms = 0;     // 2 (D-1)/D x the largest stage's gradient bytes / bandwidth
  double step_ms = 0;          // pipeline_ms + allreduce_ms (our overlap is per chunk: counted whole)
  int64_t peak_bytes = 0;      // the fullest rank's parameters, state and activations in flight
  std::vector<int> in_flight;  // per rank: micro-batches held at once (the simulator's)
};

struct LayoutChoice {
  std::vector<LayoutCandidate> ranked;  // fastest first; ties by fewer stages, schedule name, fewer micro-batches
  std::vector<std::string> skipped;     // "4 stages x 2, gpipe, 8 micro-batches: does not fit (...)"
  LayerFit fit;                         // the cost model the candidates were timed with
};

// The micro-batch counts tried for `stages`: {stages, 2 stages, 4 stages, 8, 16, 32}, ascending, unique.
std::vector<int> MicroBatchCandidates(int stages);

// Every candidate simulated and ranked. INVALID_ARGUMENT when no profile, layer or worker;
// FAILED_PRECONDITION naming the reasons when no candidate fits.
absl::StatusOr<LayoutChoice> ChooseLayout(const LayoutRequest& request);

// One line on a candidate and why it costs what it does:
// "2 stages x 1 replica, 1f1b, 8 micro-batches of 4: 318.2 ms = pipeline 311.9 ms (bubble 11.1%; slowest
// stage 33.6 ms per micro-batch, 7% of it fixed; p2p 0.13 ms) incl. optimizer 6.2 ms + all-reduce 0 ms;
// layers 26/24; 19.5 GiB peak per device (2/1 micro-batches in flight)".
std::string Describe(const LayoutCandidate& c);
// One line on the cost model: "fitted from micro-batches 1, 4, 8, 16 (worst error 6.1%); per
// sequence ... fixed ..." or, from one size, "linear in the micro-batch (one size profiled)".
std::string DescribeFit(const LayerFit& fit);
// Why the first beat the second, in a clause: "2.9% faster than 1 stage x 2 replicas, ...: its bubble
// (11.1% against 0%) costs less than the other's all-reduce (18.6 ms)". Empty with fewer than two.
std::string WhyFirst(const LayoutChoice& choice);

// What a prediction needs beyond the layer costs, per device kind. GPUs: measured on 2 x H200 over
// NVLink (an all-reduce's bus bandwidth, 285 GB/s at 512 MiB, bench/results/nccl-smoke-h200x2-2026-11-29.md,
// taken for the transfers between stages too; AdamW's step, 6.2 ms per rank for half of gpt-1.3b, 0.55
// ms per GB of parameters and state, from a trace of bench/results/pipeline-gpt-1.3b-h200x2-2026-11-30.md's
// runs, in git history at bench/results/2026-11-30-pipeline-gpt-1.3b-graphs/). CPU workers:
// our TCP transport's order of magnitude (1 GB/s), the optimizer not counted (not measured).
struct DeviceFigures {
  double p2p_gbps = 0, p2p_latency_ms = 0;
  double replica_gbps = 0, replica_latency_ms = 0;
  double optimizer_ms_per_gb = 0;
  // A layer's fixed cost, for planning from an estimate: the recorded gpt-1.3b H200 profiles fitted
  // (launcher/plan/testdata/gpt-1.3b-h200-fused-mb*): about 0.02 ms forward and 0.1 ms backward per layer.
  double layer_fixed_forward_ms = 0, layer_fixed_backward_ms = 0;
};
DeviceFigures FiguresFor(bool gpu);

// The all-reduce time of `bytes` over `replicas` at `gbps` (ring: 2 (D-1)/D of the bytes each way), ms.
double AllReduceMs(int64_t bytes, int replicas, double gbps);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_PLAN_LAYOUT_H_
