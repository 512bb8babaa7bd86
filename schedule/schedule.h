// Pipeline schedules as data, free of LibTorch and protobuf: compute-only generators, one lowering pass
// that adds the sends and receives, the text form torch.distributed.pipelining prints, and a
// simulator that proves a list free of deadlock and times it.
#ifndef STAGEHAND_SCHEDULE_SCHEDULE_H_
#define STAGEHAND_SCHEDULE_SCHEDULE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagehand {

enum class ActionKind {
  kForward,         // run stage `stage` forward on micro-batch `microbatch`
  kBackward,        // full backward of that micro-batch (input and weight gradients)
  kBackwardInput,   // zero-bubble: gradient w.r.t. the stage's input only
  kBackwardWeight,  // zero-bubble: the weight gradients, deferred; after kBackwardInput
  kSendForward,     // to `peer`: the stage's forward output
  kRecvForward,     // from `peer`: the stage's forward input
  kSendBackward,    // to `peer`: the gradient w.r.t. the stage's input
  kRecvBackward,    // from `peer`: the gradient w.r.t. the stage's output
  kOptimizerStep,   // after the last backward: apply the accumulated gradients
};

struct Action {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;        // virtual stage
  int chunk = 0;        // which of this rank's chunks holds `stage` (its index in increasing order)
  int microbatch = -1;  // -1 for kOptimizerStep
  int peer = -1;        // sends and receives: the other rank
  // Consecutive communication actions with the same group id (>= 0) are posted together (one NCCL
  // group), so that two neighbours may exchange at once. -1: alone.
  int group = -1;
};
bool operator==(const Action& a, const Action& b);
inline bool operator!=(const Action& a, const Action& b) { return !(a == b); }

bool IsCommunication(ActionKind kind);

struct Schedule {
  std::string name;  // "gpipe", "1f1b", "forward", or whatever a parsed list was called
  int num_ranks = 0;
  int num_stages = 0;  // virtual stages
  int num_microbatches = 0;
  bool forward_only = false;
  std::vector<int> stage_rank;             // virtual stage -> rank
  std::vector<std::vector<Action>> ranks;  // ranks[r] = the actions of rank r, in order
  // The most stages any one rank holds (1 unless interleaved).
  int ChunksPerRank() const;
};

// Generators: compute only (F, B, OPT; no sends or receives), one chunk per rank, stage s on rank s.
// GPipe: all forwards, then all backwards in reverse micro-batch order, then the optimizer step.
absl::StatusOr<Schedule> GenerateGPipe(int ranks, int microbatches);
// 1F1B (PipeDream-flush): warm-up forwards, one-forward-one-backward, cool-down backwards. Needs
// microbatches >= ranks (fewer: INVALID_ARGUMENT saying what to pass).
absl::StatusOr<Schedule> Generate1F1B(int ranks, int microbatches);
// Inference: forwards only.
absl::StatusOr<Schedule> GenerateForwardOnly(int ranks, int microbatches);

// Megatron-LM's interleaved 1F1B: `chunks` (V) model chunks per rank, virtual stage v on rank v % p
// (chunk v / p). Each rank runs (p-1-r)*2 + (V-1)*p warm-up forwards (all of them when m == p),
// then one forward and one backward, then the rest of the backwards; forwards walk the chunks in
// rounds of p micro-batches, backwards the chunks in reverse. Needs V >= 1 and m a multiple of p
// (Megatron's rule; INVALID_ARGUMENT saying what to pass). Bubble (p-1)/(V*m+p-1).
absl::StatusOr<Schedule> GenerateInterleaved1F1B(int ranks, int chunks, int microbatches);
// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): 1F1B with each backward split
// into the input gradient (I, sent upstream at once) and the weight gradient (W). Rank r defers its
// first r weight gradients, which fill the cool-down's idle time; memory stays 1F1B's (p micro-batches
// at most). With equal F, I and W costs the idle time is a third of 1F1B's. Needs m >= p.
absl::StatusOr<Schedule> GenerateZeroBubbleH1(int ranks, int microbatches);
// ZB-V (the order torch.distributed.pipelining's ScheduleZBVZeroBubble runs): two chunks per rank in
// a V, rank r holds virtual stages r and 2p-1-r (so the loss is on rank 0, and stages p-1 and p meet
// on rank p-1 as a local handoff). Any m >= 1.
absl::StatusOr<Schedule> GenerateZeroBubbleV(int ranks, int microbatches);

// The forward part of a lowered training list, for evaluation through the same placement: each rank
// keeps its forwards and their sends and receives (F, SEND_F, RECV_F), in order, and drops every
// backward, its transfers and OPT; forward_only is set. A transfer's partner is dropped or kept with
// it, so the kept transfers come in the same relative order on both ends (the launcher simulates the
// result before a job with evaluation starts).
Schedule ForwardPart(const Schedule& lowered);

// The one lowering pass (torch's _add_send_recv): before each compute action, the receive of its
// input from another rank; after it, the send of its output (chunks are set from stage_rank). Then
// a later receive from the peer of a send is moved up into the send's group when the peer runs the
// other end of that receive before the other end of the send (both would block sending); for
// GPipe, 1F1B and forward-only this gives exactly Megatron's grouped send+receive pairs (worker/
// schedule.cc's lists). Longer cycles of blocked sends (rings of interleaved chunks) are found by a
// unit-cost simulation and broken the same way. INVALID_ARGUMENT when the input already
// communicates or does not fit its stage_rank.
absl::StatusOr<Schedule> AddCommunication(const Schedule& compute_only);

// By name: "gpipe", "1f1b", "forward", "interleaved-1f1b" (`chunks` per rank), "zb-h1", "zb-v"
// (2 chunks); generated and lowered. `chunks` must be 1 for the others and 2 for zb-v
// (INVALID_ARGUMENT naming --stage_chunks otherwise).
absl::StatusOr<Schedule> MakeSchedule(absl::string_view name, int ranks, int microbatches, int chunks = 1);
// How many chunks per rank a schedule name holds when --stage_chunks is not given: 2 for
// interleaved-1f1b and zb-v, else 1.
int DefaultChunks(absl::string_view name);

// Text form: "{stage}{KIND}{mb}" with KIND one of F B I W SEND_F RECV_F SEND_B RECV_B ("1F3",
// "0SEND_F3"), and "OPT". A list is space-separated with a group's actions joined by "|".
std::string ToString(const Action& action);
std::string ToString(const std::vector<Action>& actions);
// One line per rank: "rank 0: 0F0 0SEND_F0 ...".
std::string ToString(const Schedule& schedule);

// Parses one rank's list; peers follow from stage_rank, chunks from the stages `rank` holds, group
// ids count the "|"-joined words from 0. INVALID_ARGUMENT naming the token and what is expected.
absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text, int rank, const std::vector<int>& stage_rank);
// One line per rank ("rank 0: 0F0 ..." or bare), "#" starts a comment, blank lines are skipped.
// stage_rank is inferred from which rank computes which stage; forward_only when no rank has a
// backward or OPT. INVALID_ARGUMENT if a stage is computed on two ranks or on none.
absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, std::string name, int microbatches);

// Which buffer slot each (chunk, micro-batch) of one rank's list uses, when a slot is held from the
// forward to the backward (B, or W in a zero-bubble split) or, with release_after_forward (inference,
// whose output is copied out), only during the forward. A forward takes the lowest free slot.
// `slots` is then the most held at once (1F1B: the stages from this one to the last; GPipe: all).
struct SlotPlan {
  std::vector<int> slot_of;  // [chunk * microbatches + mb]; -1 for one the list never runs forward
  int slots = 0;
};
SlotPlan AssignSlots(const std::vector<Action>& actions, int microbatches, bool release_after_forward);

// Costs for the simulator, in any time unit.
struct StageCosts {
  std::vector<double> forward;         // per virtual stage
  std::vector<double> backward;        // full backward (kBackward)
  std::vector<double> backward_input;  // zero-bubble split; empty: half of backward each
  std::vector<double> backward_weight;
  double p2p = 0;  // one send/receive pair
  double optimizer = 0;
  // Timing as the GPU executor runs a list: sends and receives in list order on a communication lane
  // of their own (NCCL on its own stream), a send after the computes before it, a compute after its
  // own receive; the host never waits on a transfer. Off: every transfer blocks its rank (the CPU
  // transport). Deadlock is checked under blocking semantics either way.
  bool overlap_communication = false;
};
StageCosts UniformCosts(int stages, double f = 1.0, double b = 2.0);

struct SimulationResult {
  double makespan = 0;         // from the first action to the last, over all ranks
  std::vector<double> busy;    // per rank: time in compute actions
  std::vector<double> bubble;  // per rank: 1 - busy / makespan
  double bubble_fraction = 0;  // mean over ranks
  // Per rank: most micro-batch activations held at once (forward done, backward not yet; in a
  // zero-bubble split until W). Forward-only lists hold one at a time.
  std::vector<int> peak_activations;
  // Per rank: each compute action with its start time, "0:0F0 1:0F1 3:0B1", for logs.
  std::vector<std::string> timeline;
};

// Checks and runs a schedule. Sends and receives are blocking rendezvous: one completes only with
// the matching action posted at the peer; a group is posted at once and each of its actions
// completes on its own. FAILED_PRECONDITION when no rank can move, naming each rank's stuck action
// ("rank 1 waits at 1RECV_F3"); INVALID_ARGUMENT when a list is malformed (a micro-batch never run
// forward or backward on a stage, a backward before its forward, a peer that is not the neighbour
// stage's rank, an optimizer step missing or not last).
absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const StageCosts& costs);

// The rank-by-step grid of compute actions (every compute costs one step), one row per rank, as
// torch prints it on failure; the action ranks[mark_rank][mark_index] (a send or receive too) is
// shown in brackets. Actions after a deadlock follow the rank's last step. For failure logs.
std::string Grid(const Schedule& schedule, int mark_rank = -1, int mark_index = -1);

// The bubble of GPipe and 1F1B with equal stages and free transfers, (p-1)/(v*m+p-1) with v chunks
// per rank (interleaved), for sweep reports.
double BubbleBound(int ranks, int microbatches, int chunks = 1);

}  // namespace stagehand

#endif  // STAGEHAND_SCHEDULE_SCHEDULE_H_
