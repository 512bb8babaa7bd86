// Tests of the proto conversion: round trips of generated and interleaved lists, the offset
// convention on the wire, and kinds this build does not know.
#include "schedule/schedule_proto.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "protos/schedule.pb.h"
#include "schedule/schedule.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

Schedule Build(const char* name, int ranks, int microbatches) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, ranks, microbatches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

TEST(FromProto, EveryRankOfGeneratedLists_RoundTrips) {
  for (const char* name : {"gpipe", "1f1b", "forward"}) {
    const Schedule s = Build(name, 4, 6);
    for (int r = 0; r < 4; ++r) {
      absl::StatusOr<Schedule> back = FromProto(ToProto(s, r));
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(back->name, s.name);
      EXPECT_EQ(back->num_ranks, 4);
      EXPECT_EQ(back->num_stages, 4);
      EXPECT_EQ(back->num_microbatches, 6);
      EXPECT_EQ(back->forward_only, s.forward_only);
      EXPECT_EQ(back->stage_rank, s.stage_rank);
      ASSERT_EQ(back->ranks.size(), 4u);
      for (int q = 0; q < 4; ++q) {
        if (q == r) {
          EXPECT_EQ(back->ranks[q], s.ranks[r]) << name << " rank " << r;
        } else {
          EXPECT_TRUE(back->ranks[q].empty());
        }
      }
    }
  }
}

TEST(FromProto, InterleavedTextList_RoundTripsChunks) {
  absl::StatusOr<Schedule> s = ParseSchedule(
      "0F0 0SEND_F0 2RECV_F0 2F0 2RECV_B0 2B0 2SEND_B0 0RECV_B0 0B0 OPT\n"
      "1RECV_F0 1F0 1SEND_F0 3RECV_F0 3F0 3B0 3SEND_B0 1RECV_B0 1B0 1SEND_B0 OPT\n",
      "hand", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  absl::StatusOr<Schedule> back = FromProto(ToProto(*s, 0));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ranks[0], s->ranks[0]);
  EXPECT_EQ(back->ranks[0][2].chunk, 1);
}

TEST(ToProto, PeerAndGroup_AreStoredPlusOne) {
  const Schedule s = Build("1f1b", 2, 2);  // rank 0: 0F0 0SEND_F0 0F1 0SEND_F1|0RECV_B0 ...
  const RankSchedule p = ToProto(s, 0);
  ASSERT_GE(p.actions_size(), 5);
  EXPECT_EQ(p.actions(0).kind(), ACTION_KIND_FORWARD);
  EXPECT_EQ(p.actions(0).peer(), 0);   // none
  EXPECT_EQ(p.actions(0).group(), 0);  // none
  EXPECT_EQ(p.actions(1).kind(), ACTION_KIND_SEND_FORWARD);
  EXPECT_EQ(p.actions(1).peer(), 2);   // rank 1
  EXPECT_EQ(p.actions(3).group(), 1);  // group 0
  EXPECT_EQ(p.actions(4).kind(), ACTION_KIND_RECV_BACKWARD);
  EXPECT_EQ(p.actions(4).group(), 1);
  EXPECT_EQ(p.actions(p.actions_size() - 1).kind(), ACTION_KIND_OPTIMIZER_STEP);
}

TEST(FromProto, UnknownKind_IsInvalidArgumentNamingKindAndPosition) {
  RankSchedule p = ToProto(Build("gpipe", 2, 2), 1);
  p.mutable_actions(3)->set_kind(static_cast<ScheduleActionKind>(99));
  absl::StatusOr<Schedule> s = FromProto(p);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("unknown action kind 99 at position 3"));
  p.mutable_actions(3)->set_kind(ACTION_KIND_UNSPECIFIED);
  EXPECT_THAT(FromProto(p).status().message(), HasSubstr("unknown action kind 0 at position 3"));
}

TEST(FromProto, RankOrStageRankOutOfShape_IsInvalidArgument) {
  RankSchedule p = ToProto(Build("gpipe", 2, 2), 1);
  p.set_rank(2);
  EXPECT_EQ(FromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
  p = ToProto(Build("gpipe", 2, 2), 1);
  p.add_stage_rank(0);
  EXPECT_THAT(FromProto(p).status().message(), HasSubstr("3 stage_rank entries for 2 stages"));
}

// What a worker does with its proto: the list it gets back still passes the simulator's checks
// once the other ranks' lists are put beside it.
TEST(FromProto, AllRanksReassembled_Simulate) {
  const Schedule s = Build("1f1b", 3, 5);
  Schedule joined;
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<Schedule> back = FromProto(ToProto(s, r));
    ASSERT_TRUE(back.ok()) << back.status();
    if (r == 0) joined = *back;
    joined.ranks[r] = back->ranks[r];
  }
  EXPECT_TRUE(Simulate(joined, UniformCosts(3)).ok());
}

}  // namespace
}  // namespace stagehand
