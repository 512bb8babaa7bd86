// The reference generators of reference_schedules.h: each rank's list built with its sends and
// receives in place (Megatron's order), for schedule_test's comparison with AddCommunication.
#include "schedule/reference_schedules.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace stagehand {
namespace reference {
namespace {

// -------------------------------------------------------------------------------------------------
// Generators
// -------------------------------------------------------------------------------------------------

absl::Status CheckSizes(int stages, int microbatches) {
  if (stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a pipeline needs at least 1 stage (got ", stages, ")"));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a pipeline needs at least 1 micro-batch (got ", microbatches, ")"));
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
  void SendActivationRecvGradient(int send_mb, int recv_mb) { Exchange(SendAct(send_mb), RecvGrad(recv_mb)); }
  // Megatron's send_backward_recv_forward: gradient out to r-1, next activation in from r-1.
  void SendGradientRecvActivation(int send_mb, int recv_mb) { Exchange(SendGrad(send_mb), RecvAct(recv_mb)); }

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
    return absl::InvalidArgumentError(
        absl::StrCat("1F1B needs at least as many micro-batches as stages (got ", microbatches, " for ", stages,
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
}  // namespace reference
}  // namespace stagehand
