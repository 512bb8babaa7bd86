// Pipeline schedules as data: the GPipe, 1F1B and forward-only generators, and the simulator that
// checks any list (malformed, deadlock) and times it under blocking point-to-point semantics.
#include "worker/schedule.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace stagehand {
namespace {

// -------------------------------------------------------------------------------------------------
// Generators
// -------------------------------------------------------------------------------------------------

absl::Status CheckSizes(int stages, int microbatches) {
  if (stages < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline needs at least 1 stage (got ", stages, ")"));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pipeline needs at least 1 micro-batch (got ", microbatches, ")"));
  }
  return absl::OkStatus();
}

Action Make(ActionType type, int microbatch, int peer = -1) {
  Action a;
  a.type = type;
  a.microbatch = microbatch;
  a.peer = peer;
  return a;
}

// Builds one rank's list (chunk 0 only), knowing its place in the pipeline, so that generators say
// what happens and this says which neighbour it happens with (or that it does not, at the ends).
class ListBuilder {
 public:
  ListBuilder(int rank, int stages) : rank_(rank), stages_(stages) {}

  bool first() const { return rank_ == 0; }
  bool last() const { return rank_ == stages_ - 1; }

  void Forward(int mb) { list_.push_back(Make(ActionType::kForward, mb)); }
  void Backward(int mb) { list_.push_back(Make(ActionType::kBackward, mb)); }
  void OptimizerStep() { list_.push_back(Make(ActionType::kOptimizerStep, 0)); }

  // Each exchange below is posted as one group, so that a rank whose neighbour is sending to it at
  // the same moment does not block on its own send first. mb < 0 leaves that half out; either half
  // is also left out where there is no neighbour on that side.
  void RecvActivation(int mb) { Exchange({}, RecvAct(mb)); }
  void SendActivation(int mb) { Exchange(SendAct(mb), {}); }
  void RecvGradient(int mb) { Exchange({}, RecvGrad(mb)); }
  void SendGradient(int mb) { Exchange(SendGrad(mb), {}); }
  // Megatron's send_forward_recv_backward: activation out to r+1, gradient in from r+1.
  void SendActivationRecvGradient(int send_mb, int recv_mb) {
    Exchange(SendAct(send_mb), RecvGrad(recv_mb));
  }
  // Megatron's send_backward_recv_forward: gradient out to r-1, next activation in from r-1.
  void SendGradientRecvActivation(int send_mb, int recv_mb) {
    Exchange(SendGrad(send_mb), RecvAct(recv_mb));
  }

  std::vector<Action> Take() { return std::move(list_); }

 private:
  std::vector<Action> SendAct(int mb) const {
    if (last() || mb < 0) return {};
    return {Make(ActionType::kSendActivation, mb, rank_ + 1)};
  }
  std::vector<Action> RecvAct(int mb) const {
    if (first() || mb < 0) return {};
    return {Make(ActionType::kRecvActivation, mb, rank_ - 1)};
  }
  std::vector<Action> SendGrad(int mb) const {
    if (first() || mb < 0) return {};
    return {Make(ActionType::kSendGradient, mb, rank_ - 1)};
  }
  std::vector<Action> RecvGrad(int mb) const {
    if (last() || mb < 0) return {};
    return {Make(ActionType::kRecvGradient, mb, rank_ + 1)};
  }

  // A single action stays ungrouped (group -1): there is nothing to post it together with.
  void Exchange(std::vector<Action> send, std::vector<Action> recv) {
    std::vector<Action> both = std::move(send);
    both.insert(both.end(), recv.begin(), recv.end());
    if (both.size() > 1) {
      for (Action& a : both) a.group = next_group_;
      ++next_group_;
    }
    list_.insert(list_.end(), both.begin(), both.end());
  }

  int rank_;
  int stages_;
  int next_group_ = 0;
  std::vector<Action> list_;
};

Schedule EmptySchedule(const std::string& name, int stages, int microbatches, bool forward_only) {
  Schedule s;
  s.name = name;
  s.num_ranks = stages;
  s.num_microbatches = microbatches;
  s.chunks_per_rank = 1;
  s.forward_only = forward_only;
  return s;
}

// The forward pass of GPipe and of inference: receive, run, pass on, one micro-batch at a time.
void AddAllForwards(ListBuilder& b, int microbatches) {
  for (int mb = 0; mb < microbatches; ++mb) {
    b.RecvActivation(mb);
    b.Forward(mb);
    b.SendActivation(mb);
  }
}

// Rank r's 1F1B list, in the order of Megatron's forward_backward_pipelining_without_interleaving.
std::vector<Action> OneFOneBList(int rank, int stages, int microbatches) {
  ListBuilder b(rank, stages);
  const int warmup = std::min(stages - rank - 1, microbatches);
  const int steady = microbatches - warmup;
  for (int mb = 0; mb < warmup; ++mb) {
    b.RecvActivation(mb);
    b.Forward(mb);
    b.SendActivation(mb);
  }
  if (steady > 0) b.RecvActivation(warmup);
  for (int i = 0; i < steady; ++i) {
    const int fwd = warmup + i;  // the backward of step i is micro-batch i
    b.Forward(fwd);
    b.SendActivationRecvGradient(fwd, i);
    b.Backward(i);
    // The next forward's input is received while this backward's gradient goes out, so that
    // neither neighbour waits on the other's send.
    const bool more = i + 1 < steady;
    b.SendGradientRecvActivation(i, more ? fwd + 1 : -1);
  }
  for (int mb = steady; mb < microbatches; ++mb) {
    b.RecvGradient(mb);
    b.Backward(mb);
    b.SendGradient(mb);
  }
  b.OptimizerStep();
  return b.Take();
}

}  // namespace

absl::StatusOr<Schedule> MakeGPipe(int stages, int microbatches) {
  if (absl::Status s = CheckSizes(stages, microbatches); !s.ok()) return s;
  Schedule schedule = EmptySchedule("gpipe", stages, microbatches, /*forward_only=*/false);
  for (int r = 0; r < stages; ++r) {
    ListBuilder b(r, stages);
    AddAllForwards(b, microbatches);
    // Reverse order: the last stage starts with the micro-batch it has just run forward.
    for (int mb = microbatches - 1; mb >= 0; --mb) {
      b.RecvGradient(mb);
      b.Backward(mb);
      b.SendGradient(mb);
    }
    b.OptimizerStep();
    schedule.ranks.push_back(b.Take());
  }
  return schedule;
}

absl::StatusOr<Schedule> Make1F1B(int stages, int microbatches) {
  if (absl::Status s = CheckSizes(stages, microbatches); !s.ok()) return s;
  if (microbatches < stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "1F1B needs at least as many micro-batches as stages (got ", microbatches, " for ", stages,
        " stages); use --micro-batches=", stages, " or more, or --schedule=gpipe"));
  }
  Schedule schedule = EmptySchedule("1f1b", stages, microbatches, /*forward_only=*/false);
  for (int r = 0; r < stages; ++r) schedule.ranks.push_back(OneFOneBList(r, stages, microbatches));
  return schedule;
}

absl::StatusOr<Schedule> MakeForwardOnly(int stages, int microbatches) {
  if (absl::Status s = CheckSizes(stages, microbatches); !s.ok()) return s;
  Schedule schedule = EmptySchedule("forward", stages, microbatches, /*forward_only=*/true);
  for (int r = 0; r < stages; ++r) {
    ListBuilder b(r, stages);
    AddAllForwards(b, microbatches);
    schedule.ranks.push_back(b.Take());
  }
  return schedule;
}

absl::StatusOr<Schedule> MakeSchedule(const std::string& name, int stages, int microbatches) {
  if (name == "gpipe") return MakeGPipe(stages, microbatches);
  if (name == "1f1b") return Make1F1B(stages, microbatches);
  if (name == "forward") return MakeForwardOnly(stages, microbatches);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown schedule \"", name, "\"; use gpipe, 1f1b or forward"));
}

std::string ToString(const Action& action) {
  const char* tag = "?";
  const char* arrow = "";
  switch (action.type) {
    case ActionType::kForward: tag = "F"; break;
    case ActionType::kBackward: tag = "B"; break;
    case ActionType::kBackwardInput: tag = "BI"; break;
    case ActionType::kBackwardWeight: tag = "BW"; break;
    case ActionType::kSendActivation: tag = "SA"; arrow = ">"; break;
    case ActionType::kRecvActivation: tag = "RA"; arrow = "<"; break;
    case ActionType::kSendGradient: tag = "SG"; arrow = ">"; break;
    case ActionType::kRecvGradient: tag = "RG"; arrow = "<"; break;
    case ActionType::kOptimizerStep: tag = "OPT"; break;
  }
  std::string out = tag;
  if (action.type != ActionType::kOptimizerStep) absl::StrAppend(&out, action.microbatch);
  if (action.chunk != 0) absl::StrAppend(&out, "c", action.chunk);
  if (*arrow != '\0') absl::StrAppend(&out, arrow, action.peer);
  if (action.group >= 0) absl::StrAppend(&out, "[g", action.group, "]");
  return out;
}

StageCosts UniformCosts(int virtual_stages, double forward, double backward) {
  StageCosts costs;
  costs.forward.assign(std::max(virtual_stages, 0), forward);
  costs.backward.assign(std::max(virtual_stages, 0), backward);
  return costs;
}

// -------------------------------------------------------------------------------------------------
// Simulator, part 1: static checks of each list (INVALID_ARGUMENT)
// -------------------------------------------------------------------------------------------------

namespace {

bool IsComm(ActionType t) {
  return t == ActionType::kSendActivation || t == ActionType::kRecvActivation ||
         t == ActionType::kSendGradient || t == ActionType::kRecvGradient;
}

bool IsBackwardKind(ActionType t) {
  return t == ActionType::kBackward || t == ActionType::kBackwardInput ||
         t == ActionType::kBackwardWeight || t == ActionType::kSendGradient ||
         t == ActionType::kRecvGradient || t == ActionType::kOptimizerStep;
}

// One bit per action kind, so that each (virtual stage, micro-batch) records what it has done.
unsigned Bit(ActionType t) { return 1u << static_cast<unsigned>(t); }

int VirtualStage(const Schedule& s, int rank, const Action& a) {
  return a.chunk * s.num_ranks + rank;
}

// The virtual stage at the other end of a send or receive: activations flow to v+1, gradients
// to v-1.
int RemoteStage(int v, ActionType t) {
  return (t == ActionType::kSendActivation || t == ActionType::kRecvGradient) ? v + 1 : v - 1;
}

std::string Where(int rank, size_t index, const Action& a) {
  return absl::StrCat("rank ", rank, " action ", index, " (", ToString(a), "): ");
}

absl::Status Malformed(int rank, size_t index, const Action& a, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(Where(rank, index, a), why));
}

absl::Status CheckShape(const Schedule& s) {
  if (s.num_ranks < 1 || s.num_microbatches < 1 || s.chunks_per_rank < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule \"", s.name, "\" has ", s.num_ranks, " ranks, ", s.num_microbatches,
        " micro-batches and ", s.chunks_per_rank, " chunks per rank; each must be at least 1"));
  }
  if (static_cast<int>(s.ranks.size()) != s.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat("schedule \"", s.name, "\" has ", s.ranks.size(),
                                                   " lists for ", s.num_ranks, " ranks"));
  }
  return absl::OkStatus();
}

absl::Status CheckCosts(const StageCosts& c, int virtual_stages) {
  auto short_of = [&](const std::vector<double>& v, bool optional) {
    return !(optional && v.empty()) && static_cast<int>(v.size()) < virtual_stages;
  };
  if (short_of(c.forward, false) || short_of(c.backward, false) ||
      short_of(c.backward_input, true) || short_of(c.backward_weight, true)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stage costs must have one entry per virtual stage (", virtual_stages,
        "); UniformCosts(", virtual_stages, ") makes them"));
  }
  return absl::OkStatus();
}

// Fields of one action that are wrong whatever comes before or after it.
absl::Status CheckFields(const Schedule& s, int rank, size_t i, const Action& a) {
  if (a.type == ActionType::kOptimizerStep) return absl::OkStatus();
  if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
    return Malformed(rank, i, a,
                     absl::StrCat("micro-batch out of range [0, ", s.num_microbatches, ")"));
  }
  if (a.chunk < 0 || a.chunk >= s.chunks_per_rank) {
    return Malformed(rank, i, a, absl::StrCat("chunk out of range [0, ", s.chunks_per_rank, ")"));
  }
  if (!IsComm(a.type)) {
    return a.group >= 0 ? Malformed(rank, i, a, "only sends and receives belong to a group")
                        : absl::OkStatus();
  }
  const int remote = RemoteStage(VirtualStage(s, rank, a), a.type);
  if (remote < 0 || remote >= s.num_ranks * s.chunks_per_rank) {
    return Malformed(rank, i, a, "no stage on that side of the pipeline to exchange with");
  }
  if (a.peer != remote % s.num_ranks) {
    return Malformed(rank, i, a, absl::StrCat("the other end is rank ", remote % s.num_ranks,
                                              ", not ", a.peer, "; no matching action there"));
  }
  return absl::OkStatus();
}

// What must have happened on the same (virtual stage, micro-batch) before an action may run.
absl::Status CheckOrder(const Schedule& s, int rank, size_t i, const Action& a, unsigned done) {
  const int v = VirtualStage(s, rank, a);
  const bool last_stage = v == s.num_ranks * s.chunks_per_rank - 1;
  auto need = [&](unsigned bits, const char* why) {
    return (done & bits) ? absl::OkStatus() : Malformed(rank, i, a, why);
  };
  const unsigned any_backward = Bit(ActionType::kBackward) | Bit(ActionType::kBackwardInput);
  if (done & Bit(a.type)) return Malformed(rank, i, a, "twice for this stage and micro-batch");
  switch (a.type) {
    case ActionType::kForward:
      if (v == 0) return absl::OkStatus();
      return need(Bit(ActionType::kRecvActivation), "forward before its input is received");
    case ActionType::kSendActivation:
      return need(Bit(ActionType::kForward), "activation sent before its forward");
    case ActionType::kRecvGradient:
      return need(Bit(ActionType::kSendActivation), "gradient received before activation sent");
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
      if (done & any_backward) return Malformed(rank, i, a, "a second backward of it");
      if (!(done & Bit(ActionType::kForward))) {
        return Malformed(rank, i, a, "backward before its forward");
      }
      if (last_stage) return absl::OkStatus();
      return need(Bit(ActionType::kRecvGradient), "backward before its gradient is received");
    case ActionType::kBackwardWeight:
      return need(Bit(ActionType::kBackwardInput), "weight gradient before the input gradient");
    case ActionType::kSendGradient:
      return need(any_backward, "gradient sent before its backward");
    default:
      return absl::OkStatus();
  }
}

// Group ids must mark one run of consecutive actions each, or "posted together" is ambiguous.
absl::Status CheckGroups(int rank, const std::vector<Action>& list) {
  std::vector<int> closed;
  for (size_t i = 0; i < list.size(); ++i) {
    const int g = list[i].group;
    if (g < 0) continue;
    if (std::find(closed.begin(), closed.end(), g) != closed.end()) {
      return Malformed(rank, i, list[i], "group id reused after its group ended");
    }
    if (i + 1 == list.size() || list[i + 1].group != g) closed.push_back(g);
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const Schedule& s, int rank) {
  const std::vector<Action>& list = s.ranks[rank];
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].type != ActionType::kOptimizerStep) continue;
    if (i + 1 != list.size()) return Malformed(rank, i, list[i], "the optimizer step must be last");
  }
  if (!s.forward_only && (list.empty() || list.back().type != ActionType::kOptimizerStep)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": a training list must end with its optimizer step (OPT)"));
  }
  return absl::OkStatus();
}

// What every (virtual stage, micro-batch) must have done by the end of the list.
unsigned RequiredBits(const Schedule& s, int v) {
  const int last = s.num_ranks * s.chunks_per_rank - 1;
  unsigned bits = Bit(ActionType::kForward);
  if (v > 0) bits |= Bit(ActionType::kRecvActivation);
  if (v < last) bits |= Bit(ActionType::kSendActivation);
  if (s.forward_only) return bits;
  if (v > 0) bits |= Bit(ActionType::kSendGradient);
  if (v < last) bits |= Bit(ActionType::kRecvGradient);
  return bits;
}

absl::Status CheckComplete(const Schedule& s, int rank, const std::vector<unsigned>& done) {
  for (int c = 0; c < s.chunks_per_rank; ++c) {
    const int v = c * s.num_ranks + rank;
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      const unsigned d = done[c * s.num_microbatches + mb];
      const unsigned required = RequiredBits(s, v);
      const bool backward_done =
          s.forward_only || (d & Bit(ActionType::kBackward)) ||
          ((d & Bit(ActionType::kBackwardInput)) && (d & Bit(ActionType::kBackwardWeight)));
      if ((d & required) != required || !backward_done) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rank ", rank, " chunk ", c, " micro-batch ", mb,
            ": missing its forward, backward, or a send or receive of this stage"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckList(const Schedule& s, int rank) {
  const std::vector<Action>& list = s.ranks[rank];
  std::vector<unsigned> done(s.chunks_per_rank * s.num_microbatches, 0);
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (s.forward_only && IsBackwardKind(a.type)) {
      return Malformed(rank, i, a, "a forward-only list has no backward, gradient or OPT");
    }
    if (absl::Status st = CheckFields(s, rank, i, a); !st.ok()) return st;
    if (a.type == ActionType::kOptimizerStep) continue;
    unsigned& d = done[a.chunk * s.num_microbatches + a.microbatch];
    if (absl::Status st = CheckOrder(s, rank, i, a, d); !st.ok()) return st;
    d |= Bit(a.type);
  }
  if (absl::Status st = CheckGroups(rank, list); !st.ok()) return st;
  if (absl::Status st = CheckOptimizer(s, rank); !st.ok()) return st;
  return CheckComplete(s, rank, done);
}

// -------------------------------------------------------------------------------------------------
// Simulator, part 2: running the lists (FAILED_PRECONDITION on deadlock)
// -------------------------------------------------------------------------------------------------

// One rank's progress. Its head group of sends and receives is "posted" at `posted_at`; each of its
// actions completes on its own when the peer has the matching action posted too (as NCCL's grouped
// operations and the CPU transport's concurrent ones do), and the rank moves on once all have.
struct RankRun {
  size_t next = 0;          // index of the head action
  double clock = 0;         // when the rank is free to start its head action
  bool posted = false;
  size_t group_end = 0;     // head group = [next, group_end) while posted
  double posted_at = 0;
  std::vector<double> done_at;  // per action of the head group; < 0 while pending
  double busy = 0;
  int alive = 0;            // forward outputs kept for a later backward
  int peak = 0;
};

class Simulator {
 public:
  Simulator(const Schedule& s, const StageCosts& c) : s_(s), c_(c), runs_(s.num_ranks) {}

  absl::StatusOr<SimulationResult> Run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (int r = 0; r < s_.num_ranks; ++r) {
        while (Step(r)) progress = true;
      }
    }
    for (int r = 0; r < s_.num_ranks; ++r) {
      if (runs_[r].next < s_.ranks[r].size()) return Deadlock();
    }
    return Result();
  }

 private:
  // Advances rank r by one action, one posting or one completed pair; false when it cannot move.
  bool Step(int r) {
    RankRun& run = runs_[r];
    const std::vector<Action>& list = s_.ranks[r];
    if (run.next >= list.size()) return false;
    if (!IsComm(list[run.next].type)) {
      Compute(r, list[run.next]);
      ++run.next;
      return true;
    }
    if (!run.posted) {
      Post(r);
      return true;
    }
    bool moved = MatchHeadGroup(r);
    if (std::all_of(run.done_at.begin(), run.done_at.end(), [](double t) { return t >= 0; })) {
      run.clock = *std::max_element(run.done_at.begin(), run.done_at.end());
      run.next = run.group_end;
      run.posted = false;
      moved = true;
    }
    return moved;
  }

  void Compute(int r, const Action& a) {
    RankRun& run = runs_[r];
    const double cost = Cost(VirtualStage(s_, r, a), a.type);
    run.clock += cost;
    run.busy += cost;
    if (a.type == ActionType::kForward) run.peak = std::max(run.peak, ++run.alive);
    // Activations are freed once nothing needs them: after the full backward, or after the
    // deferred weight gradient in a zero-bubble split.
    if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardWeight) --run.alive;
  }

  double Cost(int v, ActionType t) const {
    switch (t) {
      case ActionType::kForward: return c_.forward[v];
      case ActionType::kBackward: return c_.backward[v];
      case ActionType::kBackwardInput:
        return c_.backward_input.empty() ? c_.backward[v] / 2 : c_.backward_input[v];
      case ActionType::kBackwardWeight:
        return c_.backward_weight.empty() ? c_.backward[v] / 2 : c_.backward_weight[v];
      case ActionType::kOptimizerStep: return c_.optimizer;
      default: return 0;
    }
  }

  void Post(int r) {
    RankRun& run = runs_[r];
    const std::vector<Action>& list = s_.ranks[r];
    const int g = list[run.next].group;
    size_t end = run.next + 1;
    while (g >= 0 && end < list.size() && list[end].group == g) ++end;
    run.posted = true;
    run.group_end = end;
    run.posted_at = run.clock;
    run.done_at.assign(end - run.next, -1);
  }

  bool MatchHeadGroup(int r) {
    RankRun& run = runs_[r];
    bool moved = false;
    for (size_t k = 0; k < run.done_at.size(); ++k) {
      if (run.done_at[k] >= 0) continue;
      const Action& a = s_.ranks[r][run.next + k];
      RankRun& peer = runs_[a.peer];
      if (!peer.posted) continue;
      for (size_t j = 0; j < peer.done_at.size(); ++j) {
        const Action& b = s_.ranks[a.peer][peer.next + j];
        if (peer.done_at[j] >= 0 || !Matches(r, a, a.peer, b)) continue;
        const double t = std::max(run.posted_at, peer.posted_at) + c_.p2p;
        run.done_at[k] = t;
        peer.done_at[j] = t;
        moved = true;
        break;
      }
    }
    return moved;
  }

  // Both ends name each other, carry the same micro-batch, are a send and its receive of the same
  // kind, and each one's remote virtual stage is the other's own.
  bool Matches(int r, const Action& a, int q, const Action& b) const {
    static const std::pair<ActionType, ActionType> kPairs[] = {
        {ActionType::kSendActivation, ActionType::kRecvActivation},
        {ActionType::kRecvActivation, ActionType::kSendActivation},
        {ActionType::kSendGradient, ActionType::kRecvGradient},
        {ActionType::kRecvGradient, ActionType::kSendGradient}};
    const bool paired = std::any_of(std::begin(kPairs), std::end(kPairs), [&](const auto& p) {
      return p.first == a.type && p.second == b.type;
    });
    const int va = VirtualStage(s_, r, a);
    const int vb = VirtualStage(s_, q, b);
    return paired && a.peer == q && b.peer == r && a.microbatch == b.microbatch &&
           RemoteStage(va, a.type) == vb && RemoteStage(vb, b.type) == va;
  }

  absl::Status Deadlock() const {
    std::vector<std::string> stuck;
    for (int r = 0; r < s_.num_ranks; ++r) {
      const RankRun& run = runs_[r];
      const std::vector<Action>& list = s_.ranks[r];
      if (run.next >= list.size()) {
        stuck.push_back(absl::StrCat("rank ", r, " done"));
        continue;
      }
      std::vector<std::string> waiting;
      for (size_t k = 0; k < run.done_at.size(); ++k) {
        if (run.done_at[k] < 0) waiting.push_back(ToString(list[run.next + k]));
      }
      stuck.push_back(absl::StrCat("rank ", r, " at action ", run.next, " waits on ",
                                   absl::StrJoin(waiting, " ")));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "schedule \"", s_.name, "\" deadlocks under blocking send/receive: ",
        absl::StrJoin(stuck, "; "),
        ". Reorder the lists, or put a pair of neighbours' simultaneous exchanges in one group"));
  }

  SimulationResult Result() const {
    SimulationResult result;
    for (const RankRun& run : runs_) result.makespan = std::max(result.makespan, run.clock);
    for (const RankRun& run : runs_) {
      result.busy.push_back(run.busy);
      result.bubble.push_back(result.makespan > 0 ? 1 - run.busy / result.makespan : 0);
      result.bubble_fraction += result.bubble.back() / s_.num_ranks;
      // Inference keeps no activation for a backward; one micro-batch's working set at a time.
      result.peak_activations.push_back(s_.forward_only ? 1 : run.peak);
    }
    return result;
  }

  const Schedule& s_;
  const StageCosts& c_;
  std::vector<RankRun> runs_;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const StageCosts& costs) {
  if (absl::Status s = CheckShape(schedule); !s.ok()) return s;
  if (absl::Status s = CheckCosts(costs, schedule.num_ranks * schedule.chunks_per_rank); !s.ok()) {
    return s;
  }
  for (int r = 0; r < schedule.num_ranks; ++r) {
    if (absl::Status s = CheckList(schedule, r); !s.ok()) return s;
  }
  return Simulator(schedule, costs).Run();
}

SlotPlan AssignSlots(const std::vector<Action>& actions, int microbatches, bool release_after_forward) {
  SlotPlan plan;
  plan.slot_of.assign(microbatches, -1);
  std::vector<bool> busy;
  for (const Action& x : actions) {
    if (x.microbatch < 0 || x.microbatch >= microbatches) continue;
    if (x.type == ActionType::kForward) {
      const int free = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
      if (free == static_cast<int>(busy.size())) busy.push_back(false);
      plan.slot_of[x.microbatch] = free;
      busy[free] = !release_after_forward;
    } else if ((x.type == ActionType::kBackward || x.type == ActionType::kBackwardWeight) &&
               plan.slot_of[x.microbatch] >= 0) {
      busy[plan.slot_of[x.microbatch]] = false;
    }
  }
  plan.slots = static_cast<int>(busy.size());
  return plan;
}

}  // namespace stagehand
