// The one place schedules meet protobuf: one rank's list as a stagehand.RankSchedule for the wire
// (launcher to worker), and back.
#ifndef STAGEHAND_SCHEDULE_SCHEDULE_PROTO_H_
#define STAGEHAND_SCHEDULE_SCHEDULE_PROTO_H_

#include "absl/status/statusor.h"
#include "protos/schedule.pb.h"
#include "schedule/schedule.h"

namespace stagehand {

// Rank `rank`'s list with the schedule's metadata (name, sizes, stage_rank). peer and group are
// stored plus one (0: none), as protos/schedule.proto documents.
RankSchedule ToProto(const Schedule& schedule, int rank);

// A Schedule whose `ranks` has num_ranks entries with only ranks[rank] filled. INVALID_ARGUMENT for
// an unknown or unspecified action kind ("unknown action kind 99 at position 3": a newer launcher),
// a rank outside [0, num_ranks), or a stage_rank that does not have num_stages entries.
absl::StatusOr<Schedule> FromProto(const RankSchedule& proto);

}  // namespace stagehand

#endif  // STAGEHAND_SCHEDULE_SCHEDULE_PROTO_H_
