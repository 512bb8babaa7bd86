// Pipeline schedules as data: compute-only generators, the lowering pass that adds communication,
// the text form, slot plans, and the simulator that checks (malformed, deadlock) and times a list.
#include "schedule/schedule.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace stagehand {

bool operator==(const Action& a, const Action& b) {
  return std::tie(a.kind, a.stage, a.chunk, a.microbatch, a.peer, a.group) ==
         std::tie(b.kind, b.stage, b.chunk, b.microbatch, b.peer, b.group);
}

bool IsCommunication(ActionKind kind) {
  return kind == ActionKind::kSendForward || kind == ActionKind::kRecvForward || kind == ActionKind::kSendBackward ||
         kind == ActionKind::kRecvBackward;
}

int Schedule::ChunksPerRank() const {
  std::vector<int> held(std::max(num_ranks, 0), 0);
  int most = 0;
  for (int r : stage_rank) {
    if (r >= 0 && r < num_ranks) most = std::max(most, ++held[r]);
  }
  return most;
}

namespace {

// -------------------------------------------------------------------------------------------------
// Shared helpers
// -------------------------------------------------------------------------------------------------

bool IsCompute(ActionKind k) { return !IsCommunication(k) && k != ActionKind::kOptimizerStep; }

bool IsBackwardCompute(ActionKind k) { return k == ActionKind::kBackward || k == ActionKind::kBackwardInput; }

// Kinds a forward-only list cannot hold.
bool NeedsTraining(ActionKind k) {
  return k == ActionKind::kBackward || k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight ||
         k == ActionKind::kSendBackward || k == ActionKind::kRecvBackward || k == ActionKind::kOptimizerStep;
}

// The virtual stage at the other end of a send or receive: activations flow to v+1, gradients to v-1.
int RemoteStage(int v, ActionKind k) {
  switch (k) {
    case ActionKind::kSendForward:
    case ActionKind::kRecvBackward:
      return v + 1;
    case ActionKind::kRecvForward:
    case ActionKind::kSendBackward:
      return v - 1;
    default:
      return v;
  }
}

// The action the peer runs to complete a send or receive.
ActionKind Counterpart(ActionKind k) {
  switch (k) {
    case ActionKind::kSendForward:
      return ActionKind::kRecvForward;
    case ActionKind::kRecvForward:
      return ActionKind::kSendForward;
    case ActionKind::kSendBackward:
      return ActionKind::kRecvBackward;
    case ActionKind::kRecvBackward:
      return ActionKind::kSendBackward;
    default:
      return k;
  }
}

bool IsSend(ActionKind k) { return k == ActionKind::kSendForward || k == ActionKind::kSendBackward; }

// The index of `stage` among the stages its rank holds, in increasing order.
int ChunkOf(const std::vector<int>& stage_rank, int stage) {
  int chunk = 0;
  for (int s = 0; s < stage; ++s) chunk += stage_rank[s] == stage_rank[stage] ? 1 : 0;
  return chunk;
}

bool OnRank(const std::vector<int>& stage_rank, int stage, int rank) {
  return stage >= 0 && stage < static_cast<int>(stage_rank.size()) && stage_rank[stage] == rank;
}

// -------------------------------------------------------------------------------------------------
// Generators
// -------------------------------------------------------------------------------------------------

absl::Status CheckSizes(int ranks, int microbatches) {
  if (ranks < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a pipeline needs at least 1 rank (got ", ranks, ")"));
  }
  if (microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("a pipeline needs at least 1 micro-batch (got ", microbatches, ")"));
  }
  return absl::OkStatus();
}

Action Compute(ActionKind kind, int stage, int microbatch) {
  Action a;
  a.kind = kind;
  a.stage = stage;
  a.microbatch = microbatch;
  return a;
}

Action OptimizerStep() { return Compute(ActionKind::kOptimizerStep, 0, -1); }

// One chunk per rank: stage s on rank s.
Schedule EmptySchedule(const std::string& name, int ranks, int microbatches, bool forward_only) {
  Schedule s;
  s.name = name;
  s.num_ranks = ranks;
  s.num_stages = ranks;
  s.num_microbatches = microbatches;
  s.forward_only = forward_only;
  for (int r = 0; r < ranks; ++r) s.stage_rank.push_back(r);
  s.ranks.resize(ranks);
  return s;
}

// Rank r's 1F1B order, that of Megatron's forward_backward_pipelining_without_interleaving.
std::vector<Action> OneFOneBList(int rank, int ranks, int microbatches) {
  std::vector<Action> list;
  const int warmup = std::min(ranks - rank - 1, microbatches);
  const int steady = microbatches - warmup;
  for (int mb = 0; mb < warmup; ++mb) list.push_back(Compute(ActionKind::kForward, rank, mb));
  for (int i = 0; i < steady; ++i) {
    list.push_back(Compute(ActionKind::kForward, rank, warmup + i));
    list.push_back(Compute(ActionKind::kBackward, rank, i));
  }
  for (int mb = steady; mb < microbatches; ++mb) {
    list.push_back(Compute(ActionKind::kBackward, rank, mb));
  }
  list.push_back(OptimizerStep());
  return list;
}

}  // namespace

absl::StatusOr<Schedule> GenerateGPipe(int ranks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  Schedule schedule = EmptySchedule("gpipe", ranks, microbatches, /*forward_only=*/false);
  for (int r = 0; r < ranks; ++r) {
    std::vector<Action>& list = schedule.ranks[r];
    for (int mb = 0; mb < microbatches; ++mb) list.push_back(Compute(ActionKind::kForward, r, mb));
    // Reverse order: the last stage starts with the micro-batch it has just run forward.
    for (int mb = microbatches - 1; mb >= 0; --mb) {
      list.push_back(Compute(ActionKind::kBackward, r, mb));
    }
    list.push_back(OptimizerStep());
  }
  return schedule;
}

absl::StatusOr<Schedule> Generate1F1B(int ranks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  if (microbatches < ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("1F1B needs at least as many micro-batches as stages (got ", microbatches, " for ", ranks,
                     " stages); use --micro-batches=", ranks, " or more, or --schedule=gpipe"));
  }
  Schedule schedule = EmptySchedule("1f1b", ranks, microbatches, /*forward_only=*/false);
  for (int r = 0; r < ranks; ++r) schedule.ranks[r] = OneFOneBList(r, ranks, microbatches);
  return schedule;
}

absl::StatusOr<Schedule> GenerateForwardOnly(int ranks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  Schedule schedule = EmptySchedule("forward", ranks, microbatches, /*forward_only=*/true);
  for (int r = 0; r < ranks; ++r) {
    for (int mb = 0; mb < microbatches; ++mb) {
      schedule.ranks[r].push_back(Compute(ActionKind::kForward, r, mb));
    }
  }
  return schedule;
}

namespace {

// A schedule whose stages are placed by `rank_of` (virtual stage -> rank), with empty lists.
template <typename RankOf>
Schedule PlacedSchedule(const std::string& name, int ranks, int stages, int microbatches, RankOf rank_of) {
  Schedule s = EmptySchedule(name, ranks, microbatches, /*forward_only=*/false);
  s.num_stages = stages;
  s.stage_rank.clear();
  for (int v = 0; v < stages; ++v) s.stage_rank.push_back(rank_of(v));
  return s;
}

// Rank r's interleaved list. The k-th forward (backward) of a rank runs chunk (k / p) % V (its
// reverse) on micro-batch (k / (p V)) p + k % p: rounds of p micro-batches through each chunk.
std::vector<Action> InterleavedList(int r, int p, int v, int m) {
  const int total = v * m;
  const int warmup = m == p ? total : std::min(total, (p - r - 1) * 2 + (v - 1) * p);
  auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
  auto forward = [&](int k) { return Compute(ActionKind::kForward, ((k / p) % v) * p + r, mb(k)); };
  auto backward = [&](int k) { return Compute(ActionKind::kBackward, (v - 1 - (k / p) % v) * p + r, mb(k)); };
  std::vector<Action> list;
  for (int k = 0; k < warmup; ++k) list.push_back(forward(k));
  for (int i = 0; i < total - warmup; ++i) {
    list.push_back(forward(warmup + i));
    list.push_back(backward(i));
  }
  for (int k = std::max(total - warmup, 0); k < total; ++k) list.push_back(backward(k));
  list.push_back(OptimizerStep());
  return list;
}

// Rank r's ZB-H1 list: 1F1B's order with I for B; the weight gradients follow their input gradients
// r micro-batches late in the steady phase, one per input gradient in the cool-down, the rest last.
std::vector<Action> ZeroBubbleH1List(int r, int p, int m) {
  const int warmup = std::min(p - r - 1, m);
  std::vector<Action> list;
  int next_w = 0;
  auto weight = [&] { list.push_back(Compute(ActionKind::kBackwardWeight, r, next_w++)); };
  for (int mb = 0; mb < warmup; ++mb) list.push_back(Compute(ActionKind::kForward, r, mb));
  for (int i = 0; i < m - warmup; ++i) {
    list.push_back(Compute(ActionKind::kForward, r, warmup + i));
    list.push_back(Compute(ActionKind::kBackwardInput, r, i));
    if (i >= r) weight();
  }
  for (int mb = m - warmup; mb < m; ++mb) {
    list.push_back(Compute(ActionKind::kBackwardInput, r, mb));
    weight();
  }
  while (next_w < m) weight();
  list.push_back(OptimizerStep());
  return list;
}

// Rank r's ZB-V list, for n = max(2p-1, m) micro-batches, then those beyond m dropped (as torch
// does): warm-up forwards of chunk 0, then of both chunks, then chunk 1's F I W; a steady phase of
// both chunks' F I W; a cool-down of input gradients with chunk 0's weight gradients, the rest last.
std::vector<Action> ZeroBubbleVList(int r, int p, int m) {
  const int n = std::max(2 * p - 1, m);
  const int s0 = r, s1 = 2 * p - 1 - r;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<Action> list;
  auto add = [&](ActionKind kind, int stage, int& count) {
    const int mb = count++;
    if (mb < m) list.push_back(Compute(kind, stage, mb));
  };
  auto add_at = [&](ActionKind kind, int stage, int mb) {
    if (mb < m) list.push_back(Compute(kind, stage, mb));
  };
  for (int i = 0; i < 2 * (p - r) - 1; ++i) add(ActionKind::kForward, s0, f0);
  for (int i = 0; i < r; ++i) {
    add(ActionKind::kForward, s1, f1);
    add(ActionKind::kForward, s0, f0);
  }
  for (int i = 0; i < p - r; ++i) {
    add(ActionKind::kForward, s1, f1);
    add_at(ActionKind::kBackwardInput, s1, b1);
    add(ActionKind::kBackwardWeight, s1, b1);
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) add(ActionKind::kForward, s0, f0);
    add_at(ActionKind::kBackwardInput, s0, b0);
    add(ActionKind::kBackwardWeight, s0, b0);
    add(ActionKind::kForward, s1, f1);
    add_at(ActionKind::kBackwardInput, s1, b1);
    add(ActionKind::kBackwardWeight, s1, b1);
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < r; ++i) {
    add(ActionKind::kBackwardInput, s0, b0);
    add(ActionKind::kBackwardInput, s1, b1);
  }
  for (int i = 0; i < p - r; ++i) {
    add(ActionKind::kBackwardInput, s0, b0);
    add(ActionKind::kBackwardWeight, s0, w0);
  }
  while (w1 < b1) add(ActionKind::kBackwardWeight, s1, w1);
  while (w0 < b0) add(ActionKind::kBackwardWeight, s0, w0);
  list.push_back(OptimizerStep());
  return list;
}

}  // namespace

absl::StatusOr<Schedule> GenerateInterleaved1F1B(int ranks, int chunks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  if (chunks < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved 1F1B needs at least 1 chunk per rank (got ", chunks, ")"));
  }
  if (microbatches % ranks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("interleaved 1F1B runs micro-batches in rounds of one per rank (Megatron's rule): ", microbatches,
                     " micro-batches do not split into rounds of ", ranks,
                     "; use --micro_batches=", (microbatches / ranks + 1) * ranks, " (a multiple of ", ranks, ")"));
  }
  Schedule schedule =
      PlacedSchedule("interleaved-1f1b", ranks, ranks * chunks, microbatches, [ranks](int v) { return v % ranks; });
  for (int r = 0; r < ranks; ++r) schedule.ranks[r] = InterleavedList(r, ranks, chunks, microbatches);
  return schedule;
}

absl::StatusOr<Schedule> GenerateZeroBubbleH1(int ranks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  if (microbatches < ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZB-H1 needs at least as many micro-batches as stages (got ", microbatches, " for ", ranks,
                     " stages); use --micro_batches=", ranks, " or more, or --schedule=zb-v"));
  }
  Schedule schedule = EmptySchedule("zb-h1", ranks, microbatches, /*forward_only=*/false);
  for (int r = 0; r < ranks; ++r) schedule.ranks[r] = ZeroBubbleH1List(r, ranks, microbatches);
  return schedule;
}

absl::StatusOr<Schedule> GenerateZeroBubbleV(int ranks, int microbatches) {
  if (absl::Status s = CheckSizes(ranks, microbatches); !s.ok()) return s;
  Schedule schedule = PlacedSchedule("zb-v", ranks, 2 * ranks, microbatches,
                                     [ranks](int v) { return v < ranks ? v : 2 * ranks - 1 - v; });
  for (int r = 0; r < ranks; ++r) schedule.ranks[r] = ZeroBubbleVList(r, ranks, microbatches);
  return schedule;
}

// -------------------------------------------------------------------------------------------------
// Lowering: AddCommunication
// -------------------------------------------------------------------------------------------------

namespace {

absl::Status CheckStagePlacement(const Schedule& s) {
  if (s.num_ranks < 1 || s.num_stages < 1 || static_cast<int>(s.stage_rank.size()) != s.num_stages ||
      static_cast<int>(s.ranks.size()) != s.num_ranks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "schedule \"", s.name, "\" has ", s.num_ranks, " ranks with ", s.ranks.size(), " lists and ", s.num_stages,
        " stages with ", s.stage_rank.size(), " stage_rank entries; give one list per rank and one rank per stage"));
  }
  for (int v = 0; v < s.num_stages; ++v) {
    if (s.stage_rank[v] < 0 || s.stage_rank[v] >= s.num_ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", v, " is placed on rank ", s.stage_rank[v], ", not in [0, ", s.num_ranks, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckComputeOnly(const Schedule& s) {
  if (absl::Status st = CheckStagePlacement(s); !st.ok()) return st;
  for (int r = 0; r < s.num_ranks; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const std::string where = absl::StrCat("rank ", r, " action ", i, " (", ToString(a), "): ");
      if (IsCommunication(a.kind)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "AddCommunication takes compute-only lists; leave sends and receives out"));
      }
      if (IsCompute(a.kind) && !OnRank(s.stage_rank, a.stage, r)) {
        return absl::InvalidArgumentError(absl::StrCat(where, "stage_rank does not place that stage on this rank"));
      }
    }
  }
  return absl::OkStatus();
}

// The receive a compute action needs before it (input) or the send it owes after it (!input), when
// the neighbouring stage lives on another rank.
std::optional<Action> Transfer(const Schedule& s, const Action& c, bool input) {
  std::optional<ActionKind> kind;
  if (c.kind == ActionKind::kForward) {
    kind = input ? ActionKind::kRecvForward : ActionKind::kSendForward;
  } else if (IsBackwardCompute(c.kind)) {
    kind = input ? ActionKind::kRecvBackward : ActionKind::kSendBackward;
  }
  if (!kind) return std::nullopt;
  const int neighbour = RemoteStage(c.stage, *kind);
  if (neighbour < 0 || neighbour >= s.num_stages) return std::nullopt;
  if (s.stage_rank[neighbour] == s.stage_rank[c.stage]) return std::nullopt;
  Action t = c;
  t.kind = *kind;
  t.peer = s.stage_rank[neighbour];
  t.group = -1;
  return t;
}

// (kind, stage, micro-batch) -> index in one rank's list, for the communication actions.
// A hash map: the lowering looks up every receive once per send it might be posted with.
using CommIndex = absl::flat_hash_map<std::tuple<ActionKind, int, int>, size_t>;

CommIndex IndexComm(const std::vector<Action>& list) {
  CommIndex index;
  for (size_t i = 0; i < list.size(); ++i) {
    if (IsCommunication(list[i].kind)) index[{list[i].kind, list[i].stage, list[i].microbatch}] = i;
  }
  return index;
}

// Where the peer runs the other end of `a`; nullopt if it does not.
std::optional<size_t> OtherEnd(const CommIndex& peer, const Action& a) {
  auto it = peer.find({Counterpart(a.kind), RemoteStage(a.stage, a.kind), a.microbatch});
  if (it == peer.end()) return std::nullopt;
  return it->second;
}

// End of the run of actions sharing list[i]'s group (i + 1 when alone).
size_t GroupEnd(const std::vector<Action>& list, size_t i) {
  size_t end = i + 1;
  while (list[i].group >= 0 && end < list.size() && list[end].group == list[i].group) ++end;
  return end;
}

// Moves the receives after list[i]'s group that must be posted with the send list[i] into that
// group, keeping their order. A gradient's receive does not move above its own activation's send.
// Linear in the list (a set of the forward sends kept): it runs for every send of every pass.
bool HoistReceives(std::vector<Action>& list, size_t i, const CommIndex& peer, int* next_group) {
  const size_t end = GroupEnd(list, i);
  const std::optional<size_t> their_recv = OtherEnd(peer, list[i]);
  if (!their_recv) return false;
  // Whether a receive from the peer, later in the list than our send to it, must be posted with the
  // send: the peer runs the other end of the receive (its send) before the other end of ours (its
  // receive), so both ranks would block in their sends. Posting the receive with our send lets the
  // peer's send complete and the peer reach our send's other end; the group then completes exactly
  // when our send alone would have.
  const auto must = [&](const Action& a) {
    if (!IsCommunication(a.kind) || IsSend(a.kind) || a.peer != list[i].peer) return false;
    const std::optional<size_t> their_send = OtherEnd(peer, a);
    return their_send && *their_send < *their_recv;
  };
  size_t first = end;
  while (first < list.size() && !must(list[first])) ++first;
  if (first == list.size()) return false;  // the common case: nothing to move, nothing copied
  std::vector<Action> moved, kept(list.begin() + end, list.begin() + first);
  std::set<std::pair<int, int>> kept_forward_sends;  // (stage, micro-batch)
  for (const Action& k : kept) {
    if (k.kind == ActionKind::kSendForward) kept_forward_sends.insert({k.stage, k.microbatch});
  }
  for (size_t j = first; j < list.size(); ++j) {
    const Action& a = list[j];
    const bool blocked = a.kind == ActionKind::kRecvBackward && kept_forward_sends.count({a.stage, a.microbatch}) > 0;
    if (must(a) && !blocked) {
      moved.push_back(a);
    } else {
      kept.push_back(a);
      if (a.kind == ActionKind::kSendForward) kept_forward_sends.insert({a.stage, a.microbatch});
    }
  }
  if (moved.empty()) return false;
  if (list[i].group < 0) list[i].group = (*next_group)++;
  for (size_t k = i + 1; k < end; ++k) list[k].group = list[i].group;
  for (Action& a : moved) a.group = list[i].group;
  list.resize(end);
  list.insert(list.end(), moved.begin(), moved.end());
  list.insert(list.end(), kept.begin(), kept.end());
  return true;
}

// Groups left with one action (their receive moved away) are no groups; ids count from 0 per rank.
void RenumberGroups(std::vector<Action>& list) {
  std::map<int, int> size, id;
  for (const Action& a : list) size[a.group] += a.group >= 0 ? 1 : 0;
  for (Action& a : list) {
    if (a.group < 0) continue;
    a.group = size[a.group] < 2 ? -1 : id.emplace(a.group, id.size()).first->second;
  }
}

// Hoists until no send is left that would block against a peer's send: every move of a receive
// changes the peers' view of this rank, so the pass repeats to a fixed point (a receive only moves
// up, so it ends). For GPipe and 1F1B this groups Megatron's send_forward_recv_backward and
// send_backward_recv_forward pairs and nothing else.
void GroupCrossingPairs(std::vector<std::vector<Action>>& lists) {
  std::vector<int> next_group(lists.size(), 0);
  // Each rank's index, rebuilt when its list changes: a rank's sends look up their peers' (never
  // their own), which do not change while it is hoisting.
  std::vector<CommIndex> index(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) index[r] = IndexComm(lists[r]);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < lists.size(); ++r) {
      std::vector<Action>& list = lists[r];
      bool moved = false;
      for (size_t i = 0; i < list.size(); ++i) {
        if (!IsSend(list[i].kind)) continue;
        moved = HoistReceives(list, i, index[list[i].peer], &next_group[r]) || moved;
      }
      if (moved) index[r] = IndexComm(list);
      changed = changed || moved;
    }
  }
  for (std::vector<Action>& list : lists) RenumberGroups(list);
}

// Defined with the simulator, which it runs.
void BreakSendCycles(Schedule& lowered);

// ----- The timed lowering: several chunks per rank, or a split backward ---------------------------
//
// Each transfer gets one time T, the same at both ends, from the compute-only lists run with free,
// buffered transfers (F = 1, I = W = 1, B = 2): T lies between the end of the compute that produces
// the tensor and the start of the one that consumes it, at the earliest instant where neither rank
// is inside a compute (else at the production). Every rank then posts its transfers in the order of
// (T, transfer id), a compute before a transfer whose T is later than the compute's start, and the
// transfers of equal T as one group. The order of transfers is the same on every rank, so the
// transfer that is first overall always finds both ends posted: no deadlock, whatever the costs; and
// where every T is such an instant the blocking run keeps the buffered run's timeline (bubble).

struct TimedCompute {
  double start = 0, end = 0;
};

// The buffered run: per rank, the start and end of each action of its compute-only list; nullopt
// when the lists wait on each other in a cycle (Simulate then says what is wrong).
std::optional<std::vector<std::vector<TimedCompute>>> BufferedRun(const Schedule& s) {
  const int m = s.num_microbatches, n = s.num_stages;
  const auto cost = [](ActionKind k) {
    return k == ActionKind::kBackward ? 2.0 : k == ActionKind::kOptimizerStep ? 0.0 : 1.0;
  };
  std::vector<double> fwd(static_cast<size_t>(n) * m, -1), bwd(static_cast<size_t>(n) * m, -1);
  auto at = [m](std::vector<double>& v, int stage, int mb) -> double& { return v[stage * m + mb]; };
  std::vector<std::vector<TimedCompute>> times(s.num_ranks);
  std::vector<double> clock(s.num_ranks, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < s.num_ranks; ++r) {
      const std::vector<Action>& list = s.ranks[r];
      while (times[r].size() < list.size()) {
        const Action& a = list[times[r].size()];
        double ready = 0;
        if (a.kind != ActionKind::kOptimizerStep && a.kind != ActionKind::kBackwardWeight) {
          if (a.microbatch < 0 || a.microbatch >= m || a.stage < 0 || a.stage >= n) return std::nullopt;
          const bool forward = a.kind == ActionKind::kForward;
          const int from = forward ? a.stage - 1 : a.stage + 1;
          if (from >= 0 && from < n) {
            ready = at(forward ? fwd : bwd, from, a.microbatch);
            if (ready < 0) break;  // its input is not produced yet
          }
        }
        const double start = std::max(clock[r], ready), end = start + cost(a.kind);
        times[r].push_back({start, end});
        clock[r] = end;
        if (a.kind == ActionKind::kForward) at(fwd, a.stage, a.microbatch) = end;
        if (IsBackwardCompute(a.kind)) at(bwd, a.stage, a.microbatch) = end;
        moved = true;
      }
    }
  }
  for (int r = 0; r < s.num_ranks; ++r) {
    if (times[r].size() < s.ranks[r].size()) return std::nullopt;
  }
  return times;
}

// Whether rank time `t` falls strictly inside one of its computes (starts are non-decreasing).
bool InsideCompute(const std::vector<TimedCompute>& times, double t) {
  auto it =
      std::upper_bound(times.begin(), times.end(), t, [](double x, const TimedCompute& c) { return x < c.start; });
  while (it != times.begin()) {
    --it;
    if (it->end > t && it->start < t) return true;
    if (it->end <= t) return false;
  }
  return false;
}

// The earliest instant in [produced, consumed] at which neither rank computes; `produced` if none.
double MeetingTime(const std::vector<TimedCompute>& a, const std::vector<TimedCompute>& b, double produced,
                   double consumed) {
  std::vector<double> candidates{produced, consumed};
  for (const auto* times : {&a, &b}) {
    // A rank's computes run one after another: their ends ascend, so those inside the window are
    // found by bisection (every transfer asks this; a scan of the whole list made it quadratic).
    auto it = std::upper_bound(times->begin(), times->end(), produced,
                               [](double x, const TimedCompute& c) { return x < c.end; });
    for (; it != times->end() && it->end < consumed; ++it) candidates.push_back(it->end);
  }
  std::sort(candidates.begin(), candidates.end());
  for (double t : candidates) {
    if (!InsideCompute(a, t) && !InsideCompute(b, t)) return t;
  }
  return produced;
}

struct TimedTransfer {
  double time = 0;
  int64_t id = 0;  // the same at both ends: breaks ties in one order everywhere
  Action action;   // this end's send or receive
};

// Each rank's transfers, from its compute actions' outputs and inputs on other ranks.
std::vector<std::vector<TimedTransfer>> TimedTransfers(const Schedule& s,
                                                       const std::vector<std::vector<TimedCompute>>& times) {
  const int m = s.num_microbatches;
  // Where each (forward?, stage, micro-batch) compute runs: rank and index in its list.
  std::map<std::tuple<bool, int, int>, std::pair<int, size_t>> where;
  for (int r = 0; r < s.num_ranks; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (a.kind == ActionKind::kForward || IsBackwardCompute(a.kind)) {
        where[{a.kind == ActionKind::kForward, a.stage, a.microbatch}] = {r, i};
      }
    }
  }
  std::vector<std::vector<TimedTransfer>> out(s.num_ranks);
  for (int u = 0; u < s.num_ranks; ++u) {
    for (size_t i = 0; i < s.ranks[u].size(); ++i) {
      const Action& c = s.ranks[u][i];
      const std::optional<Action> send = Transfer(s, c, /*input=*/false);
      if (!send) continue;
      const bool forward = c.kind == ActionKind::kForward;
      const int to = RemoteStage(c.stage, send->kind);
      auto consumer = where.find({forward, to, c.microbatch});
      if (consumer == where.end()) continue;  // never consumed: Simulate says so
      const auto [q, j] = consumer->second;
      const double t = MeetingTime(times[u], times[q], times[u][i].end, times[q][j].start);
      const int64_t id = (int64_t{forward ? 0 : 1} * s.num_stages + c.stage) * m + c.microbatch;
      Action recv = s.ranks[q][j];
      recv.kind = Counterpart(send->kind);
      recv.peer = u;
      recv.group = -1;
      out[u].push_back({t, id, *send});
      out[q].push_back({t, id, recv});
    }
  }
  for (auto& list : out) {
    std::sort(list.begin(), list.end(), [](const TimedTransfer& a, const TimedTransfer& b) {
      return std::tie(a.time, a.id) < std::tie(b.time, b.id);
    });
  }
  return out;
}

// Merges a rank's computes (in their order) with its transfers (in (T, id) order); equal T, one group.
std::vector<Action> MergeTimed(const std::vector<Action>& computes, const std::vector<TimedCompute>& times,
                               const std::vector<TimedTransfer>& transfers) {
  std::vector<Action> list;
  size_t next = 0;
  int groups = 0;
  auto flush_until = [&](double limit, bool inclusive) {
    while (next < transfers.size() && (transfers[next].time < limit || (inclusive && transfers[next].time == limit))) {
      size_t end = next + 1;
      while (end < transfers.size() && transfers[end].time == transfers[next].time) ++end;
      const int group = end - next > 1 ? groups++ : -1;
      for (; next < end; ++next) {
        list.push_back(transfers[next].action);
        list.back().group = group;
      }
    }
  };
  for (size_t i = 0; i < computes.size(); ++i) {
    flush_until(times[i].start, /*inclusive=*/true);
    list.push_back(computes[i]);
  }
  while (next < transfers.size()) flush_until(transfers[next].time, /*inclusive=*/true);
  return list;
}

bool NeedsTimedLowering(const Schedule& s) {
  if (s.ChunksPerRank() > 1) return true;
  for (const std::vector<Action>& list : s.ranks) {
    for (const Action& a : list) {
      if (a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kBackwardWeight) return true;
    }
  }
  return false;
}

// nullopt when the compute-only lists cannot run even with buffered transfers.
std::optional<Schedule> TimedLowering(const Schedule& compute_only) {
  Schedule s = compute_only;
  for (std::vector<Action>& list : s.ranks) {
    for (Action& a : list) {
      if (a.kind != ActionKind::kOptimizerStep) a.chunk = ChunkOf(s.stage_rank, a.stage);
      a.group = -1;
    }
  }
  const std::optional<std::vector<std::vector<TimedCompute>>> times = BufferedRun(s);
  if (!times) return std::nullopt;
  const std::vector<std::vector<TimedTransfer>> transfers = TimedTransfers(s, *times);
  for (int r = 0; r < s.num_ranks; ++r) s.ranks[r] = MergeTimed(s.ranks[r], (*times)[r], transfers[r]);
  return s;
}

}  // namespace

absl::StatusOr<Schedule> AddCommunication(const Schedule& compute_only) {
  if (absl::Status s = CheckComputeOnly(compute_only); !s.ok()) return s;
  if (NeedsTimedLowering(compute_only)) {
    if (std::optional<Schedule> timed = TimedLowering(compute_only)) return *std::move(timed);
  }
  Schedule lowered = compute_only;
  for (int r = 0; r < lowered.num_ranks; ++r) {
    std::vector<Action> list;
    for (Action c : compute_only.ranks[r]) {
      // Chunks follow from stage_rank, so that hand-built lists need not spell them out.
      if (c.kind != ActionKind::kOptimizerStep) c.chunk = ChunkOf(lowered.stage_rank, c.stage);
      c.group = -1;
      if (std::optional<Action> recv = Transfer(lowered, c, /*input=*/true)) list.push_back(*recv);
      list.push_back(c);
      if (std::optional<Action> send = Transfer(lowered, c, /*input=*/false)) list.push_back(*send);
    }
    lowered.ranks[r] = std::move(list);
  }
  GroupCrossingPairs(lowered.ranks);
  BreakSendCycles(lowered);
  return lowered;
}

int DefaultChunks(absl::string_view name) { return name == "interleaved-1f1b" || name == "zb-v" ? 2 : 1; }

absl::StatusOr<Schedule> MakeSchedule(absl::string_view name, int ranks, int microbatches, int chunks) {
  const bool interleaved = name == "interleaved-1f1b";
  if (name == "zb-v" && chunks != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("zb-v holds exactly 2 chunks per rank (a V: stages r and 2p-1-r), not ", chunks,
                     "; pass --stage_chunks=2 or leave it out"));
  }
  if (!interleaved && name != "zb-v" && chunks != 1) {
    return absl::InvalidArgumentError(absl::StrCat(name, " holds one chunk per rank, not ", chunks,
                                                   "; pass --schedule=interleaved-1f1b for ", chunks,
                                                   " chunks, or leave --stage_chunks out"));
  }
  absl::StatusOr<Schedule> compute;
  if (interleaved) {
    compute = GenerateInterleaved1F1B(ranks, chunks, microbatches);
  } else if (name == "zb-h1") {
    compute = GenerateZeroBubbleH1(ranks, microbatches);
  } else if (name == "zb-v") {
    compute = GenerateZeroBubbleV(ranks, microbatches);
  } else if (name == "gpipe") {
    compute = GenerateGPipe(ranks, microbatches);
  } else if (name == "1f1b") {
    compute = Generate1F1B(ranks, microbatches);
  } else if (name == "forward") {
    compute = GenerateForwardOnly(ranks, microbatches);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown schedule \"", name,
                     "\"; use gpipe, 1f1b, interleaved-1f1b, zb-h1 or zb-v (or forward, the inference list)"));
  }
  if (!compute.ok()) return compute.status();
  return AddCommunication(*compute);
}

// -------------------------------------------------------------------------------------------------
// Text form
// -------------------------------------------------------------------------------------------------

namespace {

constexpr std::pair<const char*, ActionKind> kKindTags[] = {
    {"F", ActionKind::kForward},           {"B", ActionKind::kBackward},          {"I", ActionKind::kBackwardInput},
    {"W", ActionKind::kBackwardWeight},    {"SEND_F", ActionKind::kSendForward},  {"RECV_F", ActionKind::kRecvForward},
    {"SEND_B", ActionKind::kSendBackward}, {"RECV_B", ActionKind::kRecvBackward},
};

const char* KindTag(ActionKind k) {
  for (const auto& [tag, kind] : kKindTags) {
    if (kind == k) return tag;
  }
  return "?";
}

constexpr absl::string_view kExpectedToken =
    "expected {stage}{KIND}{micro-batch} with KIND one of F, B, I, W, SEND_F, RECV_F, SEND_B, "
    "RECV_B (e.g. \"1F3\", \"0SEND_F3\"), or OPT";

struct Token {
  ActionKind kind = ActionKind::kForward;
  int stage = 0;
  int microbatch = -1;
};

// Consumes the leading decimal digits of *text into *value; false if there are none.
bool ConsumeNumber(absl::string_view* text, int* value) {
  size_t n = 0;
  while (n < text->size() && absl::ascii_isdigit((*text)[n])) ++n;
  if (n == 0 || !absl::SimpleAtoi(text->substr(0, n), value)) return false;
  text->remove_prefix(n);
  return true;
}

absl::StatusOr<Token> ParseToken(absl::string_view token) {
  Token t;
  if (token == "OPT") {
    t.kind = ActionKind::kOptimizerStep;
    return t;
  }
  absl::string_view rest = token;
  size_t tag_len = 0;
  const bool stage_ok = ConsumeNumber(&rest, &t.stage);
  while (tag_len < rest.size() && (absl::ascii_isupper(rest[tag_len]) || rest[tag_len] == '_')) {
    ++tag_len;
  }
  const absl::string_view tag = rest.substr(0, tag_len);
  rest.remove_prefix(tag_len);
  if (!stage_ok || tag.empty() || !ConsumeNumber(&rest, &t.microbatch) || !rest.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot parse action \"", token, "\"; ", kExpectedToken));
  }
  for (const auto& [name, kind] : kKindTags) {
    if (tag == name) {
      t.kind = kind;
      return t;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown kind \"", tag, "\" in action \"", token, "\"; ", kExpectedToken));
}

// Fills in chunk and peer, which follow from where the stages live.
absl::StatusOr<Action> Resolve(absl::string_view token, const Token& t, int rank, const std::vector<int>& stage_rank) {
  Action a = Compute(t.kind, t.stage, t.microbatch);
  if (t.kind == ActionKind::kOptimizerStep) return a;
  const int stages = static_cast<int>(stage_rank.size());
  auto error = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("action \"", token, "\" on rank ", rank, ": ", why));
  };
  if (t.stage >= stages) {
    return error(absl::StrCat("there is no stage ", t.stage, "; the pipeline has ", stages));
  }
  if (stage_rank[t.stage] != rank) {
    return error(absl::StrCat("stage ", t.stage, " lives on rank ", stage_rank[t.stage],
                              "; move the action to that rank's list"));
  }
  a.chunk = ChunkOf(stage_rank, t.stage);
  if (!IsCommunication(t.kind)) return a;
  const int remote = RemoteStage(t.stage, t.kind);
  if (remote < 0 || remote >= stages) {
    return error(absl::StrCat("no stage ", remote, " to exchange with; the pipeline has stages 0 to ", stages - 1));
  }
  if (stage_rank[remote] == rank) {
    return error(absl::StrCat("stage ", remote, " is on this rank too; nothing to send or receive"));
  }
  a.peer = stage_rank[remote];
  return a;
}

std::vector<absl::string_view> Words(absl::string_view text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
}

}  // namespace

std::string ToString(const Action& action) {
  if (action.kind == ActionKind::kOptimizerStep) return "OPT";
  return absl::StrCat(action.stage, KindTag(action.kind), action.microbatch);
}

std::string ToString(const std::vector<Action>& actions) {
  std::string out;
  for (size_t i = 0; i < actions.size(); ++i) {
    if (i > 0) {
      const bool same_group = actions[i].group >= 0 && actions[i].group == actions[i - 1].group;
      out += same_group ? "|" : " ";
    }
    out += ToString(actions[i]);
  }
  return out;
}

std::string ToString(const Schedule& schedule) {
  std::string out;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    absl::StrAppend(&out, "rank ", r, ":", schedule.ranks[r].empty() ? "" : " ", ToString(schedule.ranks[r]), "\n");
  }
  return out;
}

absl::StatusOr<std::vector<Action>> ParseActions(absl::string_view text, int rank, const std::vector<int>& stage_rank) {
  std::vector<Action> actions;
  int next_group = 0;
  for (absl::string_view word : Words(text)) {
    const std::vector<absl::string_view> parts = absl::StrSplit(word, '|');
    for (absl::string_view part : parts) {
      if (part.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("empty action in group \"", word, "\"; join a group's actions with one \"|\""));
      }
      absl::StatusOr<Token> token = ParseToken(part);
      if (!token.ok()) return token.status();
      absl::StatusOr<Action> action = Resolve(part, *token, rank, stage_rank);
      if (!action.ok()) return action.status();
      if (parts.size() > 1) action->group = next_group;
      actions.push_back(*action);
    }
    if (parts.size() > 1) ++next_group;
  }
  return actions;
}

namespace {

// Strips the comment and an optional "rank N:" prefix, which must number the lists in order.
absl::StatusOr<absl::string_view> ListBody(absl::string_view line, int index) {
  line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
  absl::string_view rest = line;
  if (!absl::ConsumePrefix(&rest, "rank")) return line;
  rest = absl::StripLeadingAsciiWhitespace(rest);
  int number = -1;
  if (!ConsumeNumber(&rest, &number) || !absl::ConsumePrefix(&rest, ":")) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot parse \"", line, "\"; start a list with \"rank N:\" or leave it bare"));
  }
  if (number != index) {
    return absl::InvalidArgumentError(absl::StrCat("list \"", line, "\" says rank ", number, " but is list ", index,
                                                   "; give the ranks' lists in order from 0"));
  }
  return rest;
}

// Which rank computes each stage, from the lists' compute actions.
absl::StatusOr<std::vector<int>> InferStageRank(const std::vector<absl::string_view>& bodies) {
  std::map<int, int> placed;
  for (size_t r = 0; r < bodies.size(); ++r) {
    for (absl::string_view word : Words(bodies[r])) {
      for (absl::string_view part : absl::StrSplit(word, '|')) {
        absl::StatusOr<Token> t = ParseToken(part);
        if (!t.ok()) return t.status();
        if (!IsCompute(t->kind)) continue;
        auto [it, fresh] = placed.emplace(t->stage, static_cast<int>(r));
        if (!fresh && it->second != static_cast<int>(r)) {
          return absl::InvalidArgumentError(
              absl::StrCat("stage ", t->stage, " is computed on ranks ", it->second, " and ", r,
                           "; a stage lives on one rank, so give its actions to one of them"));
        }
      }
    }
  }
  // In 64 bits: the largest stage named may be INT_MAX (the fuzzer found 2147483647F1).
  const int64_t named = placed.empty() ? 0 : int64_t{placed.rbegin()->first} + 1;
  // Every stage is computed somewhere, so there are at most as many stages as stages named; a larger
  // number is a missing stage (and must not size an allocation: the fuzzer found 437220932B0).
  if (named > static_cast<int64_t>(placed.size())) {
    for (int v = 0; v < named; ++v) {
      if (!placed.count(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("stage ", v, " is computed on no rank; add its forward to the list of the rank holding it"));
      }
    }
  }
  const int stages = static_cast<int>(named);
  std::vector<int> stage_rank(stages, -1);
  for (const auto& [stage, rank] : placed) stage_rank[stage] = rank;
  for (int v = 0; v < stages; ++v) {
    if (stage_rank[v] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stage ", v, " is computed on no rank; add its forward to the list of the rank holding it"));
    }
  }
  return stage_rank;
}

}  // namespace

absl::StatusOr<Schedule> ParseSchedule(absl::string_view text, std::string name, int microbatches) {
  std::vector<absl::string_view> bodies;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StripAsciiWhitespace(line.substr(0, line.find('#'))).empty()) continue;
    absl::StatusOr<absl::string_view> body = ListBody(line, static_cast<int>(bodies.size()));
    if (!body.ok()) return body.status();
    bodies.push_back(*body);
  }
  if (bodies.empty() || microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", name, "\" has ", bodies.size(), " lists and ", microbatches,
                     " micro-batches; give one line per rank and at least 1 micro-batch"));
  }
  absl::StatusOr<std::vector<int>> stage_rank = InferStageRank(bodies);
  if (!stage_rank.ok()) return stage_rank.status();
  Schedule s;
  s.name = std::move(name);
  s.num_ranks = static_cast<int>(bodies.size());
  s.num_stages = static_cast<int>(stage_rank->size());
  s.num_microbatches = microbatches;
  s.stage_rank = *std::move(stage_rank);
  s.forward_only = true;
  for (int r = 0; r < s.num_ranks; ++r) {
    absl::StatusOr<std::vector<Action>> list = ParseActions(bodies[r], r, s.stage_rank);
    if (!list.ok()) return list.status();
    for (const Action& a : *list) s.forward_only = s.forward_only && !NeedsTraining(a.kind);
    s.ranks.push_back(*std::move(list));
  }
  return s;
}

// -------------------------------------------------------------------------------------------------
// Slots
// -------------------------------------------------------------------------------------------------

SlotPlan AssignSlots(const std::vector<Action>& actions, int microbatches, bool release_after_forward) {
  int chunks = 1;
  for (const Action& x : actions) chunks = std::max(chunks, x.chunk + 1);
  SlotPlan plan;
  plan.slot_of.assign(static_cast<size_t>(chunks) * std::max(microbatches, 0), -1);
  std::vector<bool> busy;
  for (const Action& x : actions) {
    if (x.microbatch < 0 || x.microbatch >= microbatches || x.chunk < 0) continue;
    int& slot = plan.slot_of[x.chunk * microbatches + x.microbatch];
    if (x.kind == ActionKind::kForward) {
      slot = static_cast<int>(std::find(busy.begin(), busy.end(), false) - busy.begin());
      if (slot == static_cast<int>(busy.size())) busy.push_back(false);
      busy[slot] = !release_after_forward;
    } else if ((x.kind == ActionKind::kBackward || x.kind == ActionKind::kBackwardWeight) && slot >= 0) {
      busy[slot] = false;
    }
  }
  plan.slots = static_cast<int>(busy.size());
  return plan;
}

StageCosts UniformCosts(int stages, double f, double b) {
  StageCosts costs;
  costs.forward.assign(std::max(stages, 0), f);
  costs.backward.assign(std::max(stages, 0), b);
  return costs;
}

double BubbleBound(int ranks, int microbatches, int chunks) {
  if (ranks < 1 || microbatches < 1 || chunks < 1) return 0;
  return static_cast<double>(ranks - 1) / (static_cast<double>(chunks) * microbatches + ranks - 1);
}

// -------------------------------------------------------------------------------------------------
// Simulator, part 1: static checks of each list (INVALID_ARGUMENT)
// -------------------------------------------------------------------------------------------------

namespace {

// One bit per action kind, so that each (virtual stage, micro-batch) records what it has done.
unsigned Bit(ActionKind k) { return 1u << static_cast<unsigned>(k); }

constexpr unsigned kAnyBackward =
    (1u << static_cast<unsigned>(ActionKind::kBackward)) | (1u << static_cast<unsigned>(ActionKind::kBackwardInput));

absl::Status Malformed(int rank, size_t index, const Action& a, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " action ", index, " (", ToString(a), "): ", why));
}

absl::Status CheckShape(const Schedule& s) {
  if (s.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule \"", s.name, "\" has ", s.num_microbatches, " micro-batches; it needs at least 1"));
  }
  return CheckStagePlacement(s);
}

absl::Status CheckCosts(const StageCosts& c, int stages) {
  auto short_of = [&](const std::vector<double>& v, bool optional) {
    return !(optional && v.empty()) && static_cast<int>(v.size()) < stages;
  };
  if (short_of(c.forward, false) || short_of(c.backward, false) || short_of(c.backward_input, true) ||
      short_of(c.backward_weight, true)) {
    return absl::InvalidArgumentError(absl::StrCat("stage costs must have one entry per virtual stage (", stages,
                                                   "); UniformCosts(", stages, ") makes them"));
  }
  return absl::OkStatus();
}

// Fields of one action that are wrong whatever comes before or after it.
absl::Status CheckFields(const Schedule& s, int rank, size_t i, const Action& a) {
  if (a.kind == ActionKind::kOptimizerStep) {
    return a.group >= 0 ? Malformed(rank, i, a, "only sends and receives belong to a group") : absl::OkStatus();
  }
  if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
    return Malformed(rank, i, a, absl::StrCat("micro-batch out of range [0, ", s.num_microbatches, ")"));
  }
  if (!OnRank(s.stage_rank, a.stage, rank)) {
    return Malformed(rank, i, a, "stage_rank does not place that stage on this rank");
  }
  if (a.chunk != ChunkOf(s.stage_rank, a.stage)) {
    return Malformed(rank, i, a,
                     absl::StrCat("chunk should be ", ChunkOf(s.stage_rank, a.stage),
                                  ", the stage's index among this rank's stages"));
  }
  if (!IsCommunication(a.kind)) {
    return a.group >= 0 ? Malformed(rank, i, a, "only sends and receives belong to a group") : absl::OkStatus();
  }
  const int remote = RemoteStage(a.stage, a.kind);
  if (remote < 0 || remote >= s.num_stages) {
    return Malformed(rank, i, a, "no stage on that side of the pipeline to exchange with");
  }
  if (s.stage_rank[remote] == rank) {
    return Malformed(rank, i, a, "the neighbour stage is on this rank; nothing to send or receive");
  }
  if (a.peer != s.stage_rank[remote]) {
    return Malformed(
        rank, i, a,
        absl::StrCat("the other end is rank ", s.stage_rank[remote], ", not ", a.peer, "; no matching action there"));
  }
  return absl::OkStatus();
}

// What one rank has done per (virtual stage, micro-batch), as bits.
class Progress {
 public:
  explicit Progress(const Schedule& s) : m_(s.num_microbatches), done_(static_cast<size_t>(s.num_stages) * m_, 0) {}
  unsigned& at(int stage, int mb) { return done_[stage * m_ + mb]; }
  unsigned at(int stage, int mb) const { return done_[stage * m_ + mb]; }

 private:
  int m_;
  std::vector<unsigned> done_;
};

// What must have happened before a forward or backward: the neighbour stage's work, received from
// another rank or done earlier on this one.
absl::Status CheckInput(const Schedule& s, int rank, size_t i, const Action& a, const Progress& p) {
  const bool forward = a.kind == ActionKind::kForward;
  const int from = forward ? a.stage - 1 : a.stage + 1;
  if (from < 0 || from >= s.num_stages) return absl::OkStatus();
  if (OnRank(s.stage_rank, from, rank)) {
    const unsigned need = forward ? Bit(ActionKind::kForward) : kAnyBackward;
    if (p.at(from, a.microbatch) & need) return absl::OkStatus();
    return Malformed(rank, i, a,
                     absl::StrCat("runs before stage ", from, "'s ", forward ? "forward" : "backward",
                                  " of this micro-batch on this rank"));
  }
  const ActionKind recv = forward ? ActionKind::kRecvForward : ActionKind::kRecvBackward;
  if (p.at(a.stage, a.microbatch) & Bit(recv)) return absl::OkStatus();
  return Malformed(rank, i, a,
                   forward ? "forward before its input is received" : "backward before its gradient is received");
}

// What must have happened on the same (virtual stage, micro-batch) before an action may run.
absl::Status CheckOrder(const Schedule& s, int rank, size_t i, const Action& a, const Progress& p) {
  const unsigned done = p.at(a.stage, a.microbatch);
  auto need = [&](unsigned bits, const char* why) {
    return (done & bits) ? absl::OkStatus() : Malformed(rank, i, a, why);
  };
  if (done & Bit(a.kind)) return Malformed(rank, i, a, "twice for this stage and micro-batch");
  switch (a.kind) {
    case ActionKind::kForward:
      return CheckInput(s, rank, i, a, p);
    case ActionKind::kSendForward:
      return need(Bit(ActionKind::kForward), "activation sent before its forward");
    case ActionKind::kRecvBackward:
      return need(Bit(ActionKind::kSendForward), "gradient received before activation sent");
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
      if (done & kAnyBackward) return Malformed(rank, i, a, "a second backward of it");
      if (!(done & Bit(ActionKind::kForward))) {
        return Malformed(rank, i, a, "backward before its forward");
      }
      return CheckInput(s, rank, i, a, p);
    case ActionKind::kBackwardWeight:
      return need(Bit(ActionKind::kBackwardInput), "weight gradient before the input gradient");
    case ActionKind::kSendBackward:
      return need(kAnyBackward, "gradient sent before its backward");
    default:
      return absl::OkStatus();
  }
}

// Group ids must mark one run of consecutive actions each, or "posted together" is ambiguous.
absl::Status CheckGroups(int rank, const std::vector<Action>& list) {
  std::set<int> closed;
  for (size_t i = 0; i < list.size(); ++i) {
    const int g = list[i].group;
    if (g < 0) continue;
    if (closed.count(g) > 0) return Malformed(rank, i, list[i], "group id reused after its group ended");
    if (i + 1 == list.size() || list[i + 1].group != g) closed.insert(g);
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizer(const Schedule& s, int rank) {
  const std::vector<Action>& list = s.ranks[rank];
  for (size_t i = 0; i + 1 < list.size(); ++i) {
    if (list[i].kind == ActionKind::kOptimizerStep) {
      return Malformed(rank, i, list[i], "the optimizer step must be last");
    }
  }
  if (!s.forward_only && (list.empty() || list.back().kind != ActionKind::kOptimizerStep)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": a training list must end with its optimizer step (OPT)"));
  }
  return absl::OkStatus();
}

// What every (virtual stage, micro-batch) of `rank` must have done by the end of the list.
unsigned RequiredBits(const Schedule& s, int rank, int v) {
  const bool remote_before = v > 0 && !OnRank(s.stage_rank, v - 1, rank);
  const bool remote_after = v < s.num_stages - 1 && !OnRank(s.stage_rank, v + 1, rank);
  unsigned bits = Bit(ActionKind::kForward);
  if (remote_before) bits |= Bit(ActionKind::kRecvForward);
  if (remote_after) bits |= Bit(ActionKind::kSendForward);
  if (s.forward_only) return bits;
  if (remote_before) bits |= Bit(ActionKind::kSendBackward);
  if (remote_after) bits |= Bit(ActionKind::kRecvBackward);
  return bits;
}

absl::Status CheckComplete(const Schedule& s, int rank, const Progress& p) {
  for (int v = 0; v < s.num_stages; ++v) {
    if (s.stage_rank[v] != rank) continue;
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      const unsigned d = p.at(v, mb);
      const unsigned required = RequiredBits(s, rank, v);
      const bool backward_done = s.forward_only || (d & Bit(ActionKind::kBackward)) ||
                                 ((d & Bit(ActionKind::kBackwardInput)) && (d & Bit(ActionKind::kBackwardWeight)));
      if ((d & required) != required || !backward_done) {
        return absl::InvalidArgumentError(
            absl::StrCat("rank ", rank, " stage ", v, " micro-batch ", mb,
                         ": missing its forward, backward, or a send or receive of this stage"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckList(const Schedule& s, int rank) {
  const std::vector<Action>& list = s.ranks[rank];
  Progress progress(s);
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (s.forward_only && NeedsTraining(a.kind)) {
      return Malformed(rank, i, a, "a forward-only list has no backward, gradient or OPT");
    }
    if (absl::Status st = CheckFields(s, rank, i, a); !st.ok()) return st;
    if (a.kind == ActionKind::kOptimizerStep) continue;
    if (absl::Status st = CheckOrder(s, rank, i, a, progress); !st.ok()) return st;
    progress.at(a.stage, a.microbatch) |= Bit(a.kind);
  }
  if (absl::Status st = CheckGroups(rank, list); !st.ok()) return st;
  if (absl::Status st = CheckOptimizer(s, rank); !st.ok()) return st;
  return CheckComplete(s, rank, progress);
}

absl::Status CheckAll(const Schedule& s) {
  if (absl::Status st = CheckShape(s); !st.ok()) return st;
  for (int r = 0; r < s.num_ranks; ++r) {
    if (absl::Status st = CheckList(s, r); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// -------------------------------------------------------------------------------------------------
// Simulator, part 2: running the lists (FAILED_PRECONDITION on deadlock)
// -------------------------------------------------------------------------------------------------

// One rank's progress. Its head group of sends and receives is "posted" at `posted_at`; each of its
// actions completes on its own when the peer has the matching action posted too (as NCCL's grouped
// operations and the CPU transport's concurrent ones do), and the rank moves on once all have.
struct RankRun {
  size_t next = 0;   // index of the head action
  double clock = 0;  // when the rank is free to start its head action
  bool posted = false;
  size_t group_end = 0;  // head group = [next, group_end) while posted
  double posted_at = 0;
  std::vector<double> done_at;  // per action of the head group; < 0 while pending
  std::vector<double> start;    // per action: when it started or was posted; < 0: never
  double busy = 0;
  int alive = 0;  // forward outputs kept for a later backward
  int peak = 0;
};

// Runs lists that passed CheckAll (it indexes peers and stages without checking them again).
class Simulator {
 public:
  Simulator(const Schedule& s, const StageCosts& c) : s_(s), c_(c), runs_(s.num_ranks) {
    for (int r = 0; r < s.num_ranks; ++r) runs_[r].start.assign(s.ranks[r].size(), -1);
  }

  absl::Status Run() {
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
    return absl::OkStatus();
  }

  const RankRun& run(int r) const { return runs_[r]; }

  SimulationResult Result() const {
    SimulationResult result;
    for (const RankRun& run : runs_) result.makespan = std::max(result.makespan, run.clock);
    for (int r = 0; r < s_.num_ranks; ++r) {
      const RankRun& run = runs_[r];
      result.busy.push_back(run.busy);
      result.bubble.push_back(result.makespan > 0 ? 1 - run.busy / result.makespan : 0);
      result.bubble_fraction += result.bubble.back() / s_.num_ranks;
      // Inference keeps no activation for a backward; one micro-batch's working set at a time.
      result.peak_activations.push_back(s_.forward_only ? 1 : run.peak);
      result.timeline.push_back(Timeline(r));
    }
    return result;
  }

 private:
  // Advances rank r by one action, one posting or one completed pair; false when it cannot move.
  bool Step(int r) {
    RankRun& run = runs_[r];
    const std::vector<Action>& list = s_.ranks[r];
    if (run.next >= list.size()) return false;
    if (!IsCommunication(list[run.next].kind)) {
      run.start[run.next] = run.clock;
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
    const double cost = Cost(a);
    run.clock += cost;
    run.busy += cost;
    if (a.kind == ActionKind::kForward) run.peak = std::max(run.peak, ++run.alive);
    // Activations are freed once nothing needs them: after the full backward, or after the
    // deferred weight gradient in a zero-bubble split.
    if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --run.alive;
  }

  double Cost(const Action& a) const {
    const int v = a.stage;
    switch (a.kind) {
      case ActionKind::kForward:
        return c_.forward[v];
      case ActionKind::kBackward:
        return c_.backward[v];
      case ActionKind::kBackwardInput:
        return c_.backward_input.empty() ? c_.backward[v] / 2 : c_.backward_input[v];
      case ActionKind::kBackwardWeight:
        return c_.backward_weight.empty() ? c_.backward[v] / 2 : c_.backward_weight[v];
      case ActionKind::kOptimizerStep:
        return c_.optimizer;
      default:
        return 0;
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
    for (size_t i = run.next; i < end; ++i) run.start[i] = run.clock;
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
  // direction, and each one's remote stage is the other's own.
  static bool Matches(int r, const Action& a, int q, const Action& b) {
    return IsCommunication(a.kind) && b.kind == Counterpart(a.kind) && a.peer == q && b.peer == r &&
           a.microbatch == b.microbatch && RemoteStage(a.stage, a.kind) == b.stage &&
           RemoteStage(b.stage, b.kind) == a.stage;
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
      stuck.push_back(absl::StrCat("rank ", r, " waits at ", absl::StrJoin(waiting, "|"), " (action ", run.next, ")"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat("schedule \"", s_.name, "\" deadlocks under blocking send/receive: ", absl::StrJoin(stuck, "; "),
                     ". Reorder the lists, or post a pair of neighbours' simultaneous exchanges in one group"
                     " (\"a|b\" in the text form); Grid() shows where each rank stands"));
  }

  std::string Timeline(int r) const {
    std::vector<std::string> items;
    for (size_t i = 0; i < s_.ranks[r].size(); ++i) {
      const Action& a = s_.ranks[r][i];
      if (IsCommunication(a.kind) || runs_[r].start[i] < 0) continue;
      items.push_back(absl::StrCat(runs_[r].start[i], ":", ToString(a)));
    }
    return absl::StrJoin(items, " ");
  }

  const Schedule& s_;
  const StageCosts& c_;
  std::vector<RankRun> runs_;
};

// -------------------------------------------------------------------------------------------------
// Lowering, part 2: breaking longer cycles of blocked sends
// -------------------------------------------------------------------------------------------------

// When every rank in a ring sends before it receives (breadth-first interleaved lists: rank p-1's
// chunk 0 feeds rank 0's chunk 1), no pair crosses but the ring deadlocks. A unit-cost run finds the
// stall; a rank blocked in a send T to rank q then gets T's receive moved into q's posted group, which
// matches at once, so each repair completes a transfer and the repairs end.
// A gradient's receive may not move above the send of its own activation.
bool SendsItsActivationFirst(const std::vector<Action>& list, size_t from, size_t recv) {
  const Action& r = list[recv];
  if (r.kind != ActionKind::kRecvBackward) return false;
  return std::any_of(list.begin() + from, list.begin() + recv, [&](const Action& a) {
    return a.kind == ActionKind::kSendForward && a.stage == r.stage && a.microbatch == r.microbatch;
  });
}

bool HoistIntoStalledGroup(std::vector<std::vector<Action>>& lists, const Simulator& sim) {
  for (size_t u = 0; u < lists.size(); ++u) {
    const RankRun& blocked = sim.run(static_cast<int>(u));
    if (!blocked.posted) continue;
    for (size_t k = 0; k < blocked.done_at.size(); ++k) {
      const Action& t = lists[u][blocked.next + k];
      if (blocked.done_at[k] >= 0 || !IsSend(t.kind)) continue;
      std::vector<Action>& list = lists[t.peer];
      const RankRun& target = sim.run(t.peer);
      if (!target.posted) continue;
      const std::optional<size_t> j = OtherEnd(IndexComm(list), t);
      if (!j || *j < target.group_end || SendsItsActivationFirst(list, target.group_end, *j)) {
        continue;
      }
      Action recv = list[*j];
      list.erase(list.begin() + *j);
      Action& head = list[target.next];
      if (head.group < 0) {
        int most = -1;
        for (const Action& a : list) most = std::max(most, a.group);
        head.group = most + 1;
      }
      recv.group = head.group;
      list.insert(list.begin() + target.group_end, recv);
      return true;
    }
  }
  return false;
}

void BreakSendCycles(Schedule& lowered) {
  if (!CheckAll(lowered).ok()) return;  // Simulate will say what is wrong with it
  const StageCosts unit = UniformCosts(lowered.num_stages, 1.0, 1.0);
  for (bool repaired = true; repaired;) {
    Simulator sim(lowered, unit);
    repaired = !sim.Run().ok() && HoistIntoStalledGroup(lowered.ranks, sim);
  }
  for (std::vector<Action>& list : lowered.ranks) RenumberGroups(list);
}

// -------------------------------------------------------------------------------------------------
// Grid
// -------------------------------------------------------------------------------------------------

std::string Marked(const Schedule& s, int r, size_t i, int mark_rank, int mark_index) {
  const std::string text = ToString(s.ranks[r][i]);
  const bool marked = r == mark_rank && static_cast<int>(i) == mark_index;
  return marked ? absl::StrCat("[", text, "]") : text;
}

// For lists the simulator cannot run: each rank's actions in order.
std::string PlainRows(const Schedule& s, int mark_rank, int mark_index) {
  std::string out;
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    std::vector<std::string> items;
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      items.push_back(Marked(s, static_cast<int>(r), i, mark_rank, mark_index));
    }
    absl::StrAppend(&out, "rank ", r, ": ", absl::StrJoin(items, " "), "\n");
  }
  return out;
}

// cells[rank][step] = the actions shown there, from a unit-cost run of the lists.
std::vector<std::map<int, std::vector<std::string>>> GridCells(const Schedule& s, int mark_rank, int mark_index) {
  StageCosts unit = UniformCosts(s.num_stages, 1.0, 1.0);
  unit.backward_input = unit.backward_weight = unit.forward;
  Simulator sim(s, unit);
  sim.Run().IgnoreError();  // a deadlocked run still says where each rank got to
  std::vector<std::map<int, std::vector<std::string>>> cells(s.num_ranks);
  for (int r = 0; r < s.num_ranks; ++r) {
    const RankRun& run = sim.run(r);
    int after = static_cast<int>(std::ceil(run.clock));  // where unreached actions continue
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      const bool marked = r == mark_rank && static_cast<int>(i) == mark_index;
      if (!IsCompute(a.kind) && !marked) continue;
      const bool reached = run.start[i] >= 0;
      const int step = reached ? static_cast<int>(std::lround(run.start[i])) : after;
      if (!reached && IsCompute(a.kind)) ++after;
      cells[r][step].push_back(Marked(s, r, i, mark_rank, mark_index));
    }
  }
  return cells;
}

}  // namespace

namespace {

double ActionCost(const StageCosts& c, const Action& a) {
  const int v = a.stage;
  switch (a.kind) {
    case ActionKind::kForward:
      return c.forward[v];
    case ActionKind::kBackward:
      return c.backward[v];
    case ActionKind::kBackwardInput:
      return c.backward_input.empty() ? c.backward[v] / 2 : c.backward_input[v];
    case ActionKind::kBackwardWeight:
      return c.backward_weight.empty() ? c.backward[v] / 2 : c.backward_weight[v];
    case ActionKind::kOptimizerStep:
      return c.optimizer;
    default:
      return 0;
  }
}

// The overlapped timing (StageCosts::overlap_communication) of lists that passed the blocking run:
// per rank a compute lane and a communication lane. nullopt if the lanes wait on each other.
class OverlappedRun {
 public:
  OverlappedRun(const Schedule& s, const StageCosts& c) : s_(s), c_(c), lanes_(s.num_ranks) {
    for (int r = 0; r < s.num_ranks; ++r) Index(r);
  }

  std::optional<SimulationResult> Run(const SimulationResult& blocking) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < s_.num_ranks; ++r) {
        while (StepCompute(r) || StepComm(r)) moved = true;
      }
    }
    SimulationResult out = blocking;
    out.makespan = 0;
    for (const Lane& l : lanes_) {
      if (l.compute < l.finish.size() || l.comm < l.finish.size()) return std::nullopt;
      out.makespan = std::max({out.makespan, l.compute_clock, l.comm_clock});
    }
    out.bubble_fraction = 0;
    for (int r = 0; r < s_.num_ranks; ++r) {
      out.bubble[r] = out.makespan > 0 ? 1 - out.busy[r] / out.makespan : 0;
      out.bubble_fraction += out.bubble[r] / s_.num_ranks;
      std::vector<std::string> items;
      for (size_t i = 0; i < s_.ranks[r].size(); ++i) {
        if (!IsCommunication(s_.ranks[r][i].kind)) {
          items.push_back(absl::StrCat(lanes_[r].start[i], ":", ToString(s_.ranks[r][i])));
        }
      }
      out.timeline[r] = absl::StrJoin(items, " ");
    }
    return out;
  }

 private:
  struct Lane {
    std::vector<double> finish, start;  // per action; < 0 while pending
    std::vector<int> needs;             // compute -> its receive's index (-1: none); send -> last compute before
    size_t compute = 0, comm = 0;       // next action of each lane
    double compute_clock = 0, comm_clock = 0;
    bool posted = false;
    size_t group_end = 0;
    double posted_at = 0;
  };

  void Index(int r) {
    Lane& l = lanes_[r];
    const std::vector<Action>& list = s_.ranks[r];
    l.finish.assign(list.size(), -1);
    l.start.assign(list.size(), -1);
    l.needs.assign(list.size(), -1);
    std::map<std::tuple<ActionKind, int, int>, int> recv;
    int last_compute = -1;
    for (size_t i = 0; i < list.size(); ++i) {
      const Action& a = list[i];
      if (IsCommunication(a.kind)) {
        if (!IsSend(a.kind)) recv[{a.kind, a.stage, a.microbatch}] = static_cast<int>(i);
        if (IsSend(a.kind)) l.needs[i] = last_compute;
        continue;
      }
      last_compute = static_cast<int>(i);
      const ActionKind input = a.kind == ActionKind::kForward ? ActionKind::kRecvForward : ActionKind::kRecvBackward;
      auto it = recv.find({input, a.stage, a.microbatch});
      if (it != recv.end() && a.kind != ActionKind::kBackwardWeight) l.needs[i] = it->second;
    }
    Skip(l, list);
  }

  // Moves each lane's pointer to its next action of its kind.
  void Skip(Lane& l, const std::vector<Action>& list) {
    while (l.compute < list.size() && IsCommunication(list[l.compute].kind)) ++l.compute;
    while (l.comm < list.size() && !IsCommunication(list[l.comm].kind)) ++l.comm;
  }

  bool StepCompute(int r) {
    Lane& l = lanes_[r];
    const std::vector<Action>& list = s_.ranks[r];
    if (l.compute >= list.size()) return false;
    const int need = l.needs[l.compute];
    if (need >= 0 && l.finish[need] < 0) return false;
    const double start = std::max(l.compute_clock, need >= 0 ? l.finish[need] : 0.0);
    l.start[l.compute] = start;
    l.compute_clock = l.finish[l.compute] = start + ActionCost(c_, list[l.compute]);
    ++l.compute;
    Skip(l, list);
    return true;
  }

  bool StepComm(int r) {
    Lane& l = lanes_[r];
    const std::vector<Action>& list = s_.ranks[r];
    if (l.comm >= list.size()) return false;
    if (!l.posted) {
      size_t end = l.comm + 1;
      while (list[l.comm].group >= 0 && end < list.size() && list[end].group == list[l.comm].group) ++end;
      double at = l.comm_clock;
      for (size_t i = l.comm; i < end; ++i) {
        const int need = l.needs[i];
        if (need >= 0 && l.finish[need] < 0) return false;  // a send waits for the computes before it
        if (need >= 0) at = std::max(at, l.finish[need]);
      }
      l.posted = true;
      l.group_end = end;
      l.posted_at = at;
      for (size_t i = l.comm; i < end; ++i) l.start[i] = at;
      return true;
    }
    bool moved = false, all = true;
    for (size_t i = l.comm; i < l.group_end; ++i) {
      if (l.finish[i] >= 0) continue;
      const Action& a = list[i];
      Lane& peer = lanes_[a.peer];
      for (size_t j = peer.comm; peer.posted && j < peer.group_end; ++j) {
        const Action& b = s_.ranks[a.peer][j];
        if (peer.finish[j] >= 0 || b.kind != Counterpart(a.kind) || b.peer != r || b.microbatch != a.microbatch ||
            RemoteStage(a.stage, a.kind) != b.stage) {
          continue;
        }
        l.finish[i] = peer.finish[j] = std::max(l.posted_at, peer.posted_at) + c_.p2p;
        moved = true;
        break;
      }
      all = all && l.finish[i] >= 0;
    }
    if (all) {
      for (size_t i = l.comm; i < l.group_end; ++i) l.comm_clock = std::max(l.comm_clock, l.finish[i]);
      l.comm = l.group_end;
      l.posted = false;
      Skip(l, list);
      moved = true;
    }
    return moved;
  }

  const Schedule& s_;
  const StageCosts& c_;
  std::vector<Lane> lanes_;
};

}  // namespace

absl::StatusOr<SimulationResult> Simulate(const Schedule& schedule, const StageCosts& costs) {
  if (absl::Status s = CheckShape(schedule); !s.ok()) return s;
  if (absl::Status s = CheckCosts(costs, schedule.num_stages); !s.ok()) return s;
  if (absl::Status s = CheckAll(schedule); !s.ok()) return s;
  Simulator sim(schedule, costs);
  if (absl::Status s = sim.Run(); !s.ok()) return s;
  if (!costs.overlap_communication) return sim.Result();
  std::optional<SimulationResult> overlapped = OverlappedRun(schedule, costs).Run(sim.Result());
  if (!overlapped) {
    return absl::FailedPreconditionError(
        absl::StrCat("schedule \"", schedule.name,
                     "\" runs under blocking send/receive but its compute and communication "
                     "lanes wait on each other when transfers overlap compute; Grid() shows the lists"));
  }
  return *overlapped;
}

std::string Grid(const Schedule& schedule, int mark_rank, int mark_index) {
  if (!CheckAll(schedule).ok()) return PlainRows(schedule, mark_rank, mark_index);
  const auto cells = GridCells(schedule, mark_rank, mark_index);
  int steps = 0;
  for (const auto& row : cells) {
    if (!row.empty()) steps = std::max(steps, row.rbegin()->first + 1);
  }
  std::vector<size_t> width(steps);
  for (int t = 0; t < steps; ++t) width[t] = absl::StrCat(t).size();
  for (const auto& row : cells) {
    for (const auto& [t, items] : row) width[t] = std::max(width[t], absl::StrJoin(items, " ").size());
  }
  auto pad = [](std::string text, size_t w) { return text.append(w - text.size(), ' '); };
  const std::string label = absl::StrCat("rank ", schedule.num_ranks - 1);
  std::string out = pad("step", label.size());
  for (int t = 0; t < steps; ++t) absl::StrAppend(&out, " ", pad(absl::StrCat(t), width[t]));
  out = std::string(absl::StripTrailingAsciiWhitespace(out)) + "\n";
  for (int r = 0; r < schedule.num_ranks; ++r) {
    std::string line = pad(absl::StrCat("rank ", r), std::max(label.size(), size_t{4}));
    for (int t = 0; t < steps; ++t) {
      auto it = cells[r].find(t);
      const std::string text = it == cells[r].end() ? "" : absl::StrJoin(it->second, " ");
      absl::StrAppend(&line, " ", pad(text, width[t]));
    }
    absl::StrAppend(&out, absl::StripTrailingAsciiWhitespace(line), "\n");
  }
  return out;
}

Schedule ForwardPart(const Schedule& lowered) {
  Schedule out = lowered;
  out.forward_only = true;
  for (std::vector<Action>& list : out.ranks) {
    std::vector<Action> kept;
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward || a.kind == ActionKind::kSendForward || a.kind == ActionKind::kRecvForward) {
        kept.push_back(a);
      }
    }
    list = std::move(kept);
  }
  return out;
}

}  // namespace stagehand
