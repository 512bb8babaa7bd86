// Converts schedules to and from protos/schedule.proto; the only translation unit of //schedule that
// sees generated protobuf code.
#include "schedule/schedule_proto.h"

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

// One table both ways, so that the two enums cannot drift apart silently.
constexpr std::pair<ActionKind, ScheduleActionKind> kKinds[] = {
    {ActionKind::kForward, ACTION_KIND_FORWARD},
    {ActionKind::kBackward, ACTION_KIND_BACKWARD},
    {ActionKind::kBackwardInput, ACTION_KIND_BACKWARD_INPUT},
    {ActionKind::kBackwardWeight, ACTION_KIND_BACKWARD_WEIGHT},
    {ActionKind::kSendForward, ACTION_KIND_SEND_FORWARD},
    {ActionKind::kRecvForward, ACTION_KIND_RECV_FORWARD},
    {ActionKind::kSendBackward, ACTION_KIND_SEND_BACKWARD},
    {ActionKind::kRecvBackward, ACTION_KIND_RECV_BACKWARD},
    {ActionKind::kOptimizerStep, ACTION_KIND_OPTIMIZER_STEP},
};

ScheduleActionKind ToProtoKind(ActionKind kind) {
  for (const auto& [ours, wire] : kKinds) {
    if (ours == kind) return wire;
  }
  return ACTION_KIND_UNSPECIFIED;
}

// Takes the int, not the enum: proto3 keeps values it does not know (a newer peer's kinds).
std::optional<ActionKind> FromProtoKind(int kind) {
  for (const auto& [ours, wire] : kKinds) {
    if (wire == kind) return ours;
  }
  return std::nullopt;
}

absl::Status CheckMetadata(const RankSchedule& p) {
  if (p.num_ranks() < 1 || p.rank() < 0 || p.rank() >= p.num_ranks()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule \"", p.name(), "\" is for rank ", p.rank(), " of ",
                                                   p.num_ranks(), "; the rank must lie in [0, num_ranks)"));
  }
  if (p.stage_rank_size() != p.num_stages()) {
    return absl::InvalidArgumentError(absl::StrCat("schedule \"", p.name(), "\" has ", p.stage_rank_size(),
                                                   " stage_rank entries for ", p.num_stages(),
                                                   " stages; the sender must give one rank per virtual stage"));
  }
  return absl::OkStatus();
}

}  // namespace

RankSchedule ToProto(const Schedule& schedule, int rank) {
  RankSchedule p;
  p.set_name(schedule.name);
  p.set_rank(rank);
  p.set_num_ranks(schedule.num_ranks);
  p.set_num_stages(schedule.num_stages);
  p.set_num_microbatches(schedule.num_microbatches);
  p.set_forward_only(schedule.forward_only);
  for (int r : schedule.stage_rank) p.add_stage_rank(r);
  if (rank < 0 || rank >= static_cast<int>(schedule.ranks.size())) return p;
  for (const Action& a : schedule.ranks[rank]) {
    ScheduleAction* out = p.add_actions();
    out->set_kind(ToProtoKind(a.kind));
    out->set_stage(a.stage);
    out->set_chunk(a.chunk);
    out->set_microbatch(a.microbatch);
    out->set_peer(a.peer + 1);  // 0 on the wire: no peer
    out->set_group(a.group + 1);
  }
  return p;
}

absl::StatusOr<Schedule> FromProto(const RankSchedule& proto) {
  if (absl::Status s = CheckMetadata(proto); !s.ok()) return s;
  Schedule s;
  s.name = proto.name();
  s.num_ranks = proto.num_ranks();
  s.num_stages = proto.num_stages();
  s.num_microbatches = proto.num_microbatches();
  s.forward_only = proto.forward_only();
  s.stage_rank.assign(proto.stage_rank().begin(), proto.stage_rank().end());
  s.ranks.resize(s.num_ranks);
  std::vector<Action>& list = s.ranks[proto.rank()];
  for (int i = 0; i < proto.actions_size(); ++i) {
    const ScheduleAction& in = proto.actions(i);
    const std::optional<ActionKind> kind = FromProtoKind(in.kind());
    if (!kind) {
      return absl::InvalidArgumentError(absl::StrCat("unknown action kind ", static_cast<int>(in.kind()),
                                                     " at position ", i, " of rank ", proto.rank(),
                                                     "'s list; the sender is newer than this build, so update it"));
    }
    Action a;
    a.kind = *kind;
    a.stage = in.stage();
    a.chunk = in.chunk();
    a.microbatch = in.microbatch();
    a.peer = in.peer() - 1;
    a.group = in.group() - 1;
    list.push_back(a);
  }
  return s;
}

}  // namespace stagehand
