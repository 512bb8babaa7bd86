// Per-rank lists built with their communication in place, independently, to compare AddCommunication's to.
// GPipe, 1F1B and inference (namespace reference), each generator placing its own sends and receives;
// schedule.h's generators emit compute only and AddCommunication adds the rest: schedule_test requires
// the two to give the same lists, rank by rank.
#ifndef STAGEHAND_SCHEDULE_REFERENCE_SCHEDULES_H_
#define STAGEHAND_SCHEDULE_REFERENCE_SCHEDULES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {
namespace reference {

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
  std::string name;  // "gpipe", "1f1b", "forward" (inference)
  int num_ranks = 0;
  int num_microbatches = 0;
  int chunks_per_rank = 1;  // virtual stage of (rank, chunk) = chunk * num_ranks + rank
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

}  // namespace reference
}  // namespace stagehand

#endif  // STAGEHAND_SCHEDULE_REFERENCE_SCHEDULES_H_
