// Pipeline schedules as data: for each rank, the ordered list of actions it performs in one training
// step (or one inference batch). Generators build GPipe and 1F1B lists for any number of stages and
// micro-batches; the format carries what interleaved (several chunks per rank) and zero-bubble
// (backward split into input and weight gradients) schedules need, so that they can be added without
// touching the executor. A simulator runs lists without tensors: it proves them free of deadlock under
// blocking point-to-point semantics and computes their makespan and bubble.
#ifndef STAGEHAND_WORKER_SCHEDULE_H_
#define STAGEHAND_WORKER_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {

enum class ActionType {
  kForward,         // run the chunk's layers forward on micro-batch `microbatch`
  kBackward,        // full backward of that micro-batch (input and weight gradients)
  kBackwardInput,   // zero-bubble: gradient w.r.t. the chunk's input only
  kBackwardWeight,  // zero-bubble: the weight gradients, deferred
  kSendActivation,  // to `peer`: this chunk's forward output for `microbatch`
  kRecvActivation,  // from `peer`: this chunk's forward input for `microbatch`
  kSendGradient,    // to `peer`: the gradient w.r.t. this chunk's input for `microbatch`
  kRecvGradient,    // from `peer`: the gradient w.r.t. this chunk's output for `microbatch`
  kOptimizerStep,   // after the last backward: apply the accumulated gradients
};

struct Action {
  ActionType type;
  int microbatch = 0;  // unused by kOptimizerStep
  int chunk = 0;       // which of the rank's model chunks (0 unless interleaved)
  int peer = -1;       // the other rank of a send or receive
  // Consecutive communication actions with the same group id (>= 0) are issued together (one NCCL
  // group; concurrently on the CPU transport), so that two neighbours may exchange at once. -1: alone.
  int group = -1;
};

struct Schedule {
  std::string name;            // "gpipe", "1f1b", "forward" (inference)
  int num_ranks = 0;
  int num_microbatches = 0;
  int chunks_per_rank = 1;     // virtual stage of (rank, chunk) = chunk * num_ranks + rank
  bool forward_only = false;
  std::vector<std::vector<Action>> ranks;  // ranks[r] = the actions of rank r, in order
};

// GPipe: all forwards, then all backwards (in reverse micro-batch order), then the optimizer step.
absl::StatusOr<Schedule> MakeGPipe(int stages, int microbatches);
// 1F1B (PipeDream-flush): warm-up forwards, steady one-forward-one-backward, cool-down backwards.
// Needs microbatches >= stages (fewer gives INVALID_ARGUMENT saying so).
absl::StatusOr<Schedule> Make1F1B(int stages, int microbatches);
// Inference: forwards only, no backward or optimizer step.
absl::StatusOr<Schedule> MakeForwardOnly(int stages, int microbatches);
// By name: "gpipe", "1f1b", "forward".
absl::StatusOr<Schedule> MakeSchedule(const std::string& name, int stages, int microbatches);

// Which buffer slot each micro-batch of one rank's action list uses, when a slot holds a micro-batch
// from its forward to its backward (release_after_forward: only during the forward, as in inference,
// whose output is copied out): a forward takes the lowest free slot, the backward frees it. `slots` is
// then the most micro-batches the rank holds at once (1F1B: the stages from this one to the last;
// GPipe: all). For chunk 0 (schedules without interleaving).
struct SlotPlan {
  std::vector<int> slot_of;  // per micro-batch; -1 for one the list never runs forward
  int slots = 0;
};
SlotPlan AssignSlots(const std::vector<Action>& actions, int microbatches, bool release_after_forward);

std::string ToString(const Action& action);  // e.g. "F3", "B3", "SA3>1", "RG3<1", "OPT", with "[g5]"

// Costs for the simulator, per virtual stage, in any time unit.
struct StageCosts {
  std::vector<double> forward;         // per virtual stage
  std::vector<double> backward;        // full backward (kBackward)
  std::vector<double> backward_input;  // zero-bubble split; empty: half of backward each
  std::vector<double> backward_weight;
  double p2p = 0;                      // one send/receive pair
  double optimizer = 0;
};

StageCosts UniformCosts(int virtual_stages, double forward = 1.0, double backward = 2.0);

struct SimulationResult {
  double makespan = 0;               // from the first action to the last, over all ranks
  std::vector<double> busy;          // per rank: time in compute actions
  std::vector<double> bubble;        // per rank: 1 - busy / makespan
  double bubble_fraction = 0;        // mean over ranks
  std::vector<int> peak_activations; // per rank: most forward outputs kept for a later backward
};

// Checks and runs a schedule. Point-to-point actions are blocking rendezvous: a send completes only
// together with the matching receive at the peer (same micro-batch, chunk pairing and kind), and a
// group of actions is posted at once. Fails with FAILED_PRECONDITION naming the stuck action of every
// rank when no rank can move (deadlock); INVALID_ARGUMENT when a list is malformed (a micro-batch
// never run forward or backward on a stage, a backward before its forward, a receive without a
// matching send, an optimizer step missing or not last).
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const StageCosts& costs);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_SCHEDULE_H_
