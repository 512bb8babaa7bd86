// Tests of the layout planner, on a profile recorded on an H200 (launcher/testdata/).
#include "launcher/layout.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "protos/job.pb.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

LayoutRequest RecordedGpt13b(int workers, int64_t memory_bytes) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::ifstream in(std::string(srcdir ? srcdir : ".") + "/stagehand/launcher/testdata/gpt-1.3b-h200-mb4.profile.textproto");
  std::stringstream text;
  text << in.rdbuf();
  LayerProfile profile;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text.str(), &profile));
  EXPECT_EQ(profile.layers_size(), 50);
  LayoutRequest r;
  for (const LayerCost& c : profile.layers()) {
    r.layers.push_back({c.forward_ms(), c.backward_ms(), c.param_bytes(), c.activation_bytes()});
  }
  r.profile_micro_batch = profile.micro_batch();
  r.workers = workers;
  r.global_batch = 32;
  r.memory_bytes = memory_bytes;
  r.replica_gbps = 100;
  return r;
}

constexpr int64_t kH200 = int64_t{143} * 1000 * 1000 * 1000 * 9 / 10;

TEST(LayoutTest, MicroBatchCandidates_ForStages_AscendingUnique) {
  EXPECT_EQ(MicroBatchCandidates(2), (std::vector<int>{2, 4, 8, 16, 32}));
  EXPECT_EQ(MicroBatchCandidates(8), (std::vector<int>{8, 16, 32}));  // 4 x 8 = 32 is among them
}

TEST(LayoutTest, AllReduceMs_TwoReplicas_IsTheBytesOverTheBandwidth) {
  EXPECT_DOUBLE_EQ(AllReduceMs(1000 * 1000 * 1000, 2, 100), 10);
  EXPECT_DOUBLE_EQ(AllReduceMs(1000 * 1000 * 1000, 1, 100), 0);
}

TEST(LayoutTest, ChooseLayout_RecordedH200Profile_IsDeterministicAndExplained) {
  absl::StatusOr<LayoutChoice> a = ChooseLayout(RecordedGpt13b(8, kH200));
  absl::StatusOr<LayoutChoice> b = ChooseLayout(RecordedGpt13b(8, kH200));
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_GE(a->ranked.size(), 3u);
  ASSERT_EQ(a->ranked.size(), b->ranked.size());
  for (size_t i = 0; i < a->ranked.size(); ++i) EXPECT_EQ(Describe(a->ranked[i]), Describe(b->ranked[i]));
  for (size_t i = 0; i + 1 < a->ranked.size(); ++i) EXPECT_LE(a->ranked[i].step_ms, a->ranked[i + 1].step_ms);
  for (const LayoutCandidate& c : a->ranked) {
    EXPECT_EQ(c.stages * c.replicas, 8);
    EXPECT_EQ(int64_t{c.micro_batches} * c.micro_batch * c.replicas, 32);
  }
  // The best three, as the launcher prints them.
  std::cout << "best of " << a->ranked.size() << " (" << a->skipped.size() << " skipped):\n";
  for (int i = 0; i < 3; ++i) std::cout << "  " << Describe(a->ranked[i]) << "\n";
  EXPECT_THAT(Describe(a->ranked[0]), HasSubstr("replicas"));
  EXPECT_THAT(Describe(a->ranked[0]), HasSubstr("all-reduce"));
}

// The recorded run: 2 stages, 1F1B, 8 micro-batches of 4 measured 0.3255 s/step; the simulation of the
// same layout from the same profile is close (no transfers, no optimizer: it is under).
TEST(LayoutTest, ChooseLayout_RecordedRunsLayout_PredictsNearTheMeasuredStep) {
  absl::StatusOr<LayoutChoice> c = ChooseLayout(RecordedGpt13b(2, kH200));
  ASSERT_TRUE(c.ok()) << c.status();
  bool found = false;
  for (const LayoutCandidate& x : c->ranked) {
    if (x.stages != 2 || x.schedule != "1f1b" || x.micro_batches != 8) continue;
    found = true;
    std::cout << Describe(x) << " against 325.5 ms measured\n";
    EXPECT_NEAR(x.step_ms, 325.5, 0.25 * 325.5);
  }
  EXPECT_TRUE(found);
}

TEST(LayoutTest, ChooseLayout_OneDeviceCannotHoldTheModel_EveryLayoutSplitsIt) {
  // 21 GB of parameters and state: 16 GB devices need at least 2 stages.
  absl::StatusOr<LayoutChoice> c = ChooseLayout(RecordedGpt13b(4, int64_t{16} << 30));
  ASSERT_TRUE(c.ok()) << c.status();
  for (const LayoutCandidate& x : c->ranked) EXPECT_GE(x.stages, 2) << Describe(x);
  EXPECT_THAT(absl::StrJoin(c->skipped, "\n"), HasSubstr("1 stages x 4 replicas"));
}

TEST(LayoutTest, ChooseLayout_ShardedOptimizer_NeedsLessMemoryPerDevice) {
  LayoutRequest r = RecordedGpt13b(4, int64_t{18} << 30);
  absl::StatusOr<LayoutChoice> plain = ChooseLayout(r);
  r.shard_optimizer = true;
  absl::StatusOr<LayoutChoice> sharded = ChooseLayout(r);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  // ZeRO-1 over 4 replicas keeps 10 of 16 bytes per parameter: one stage fits 18 GiB.
  bool one_stage = false;
  for (const LayoutCandidate& x : sharded->ranked) one_stage |= x.stages == 1;
  EXPECT_TRUE(one_stage);
  if (plain.ok()) {
    for (const LayoutCandidate& x : plain->ranked) EXPECT_GE(x.stages, 2);
  }
}

TEST(LayoutTest, ChooseLayout_UnknownScheduleName_IsSkippedNamingIt) {
  LayoutRequest r = RecordedGpt13b(2, kH200);
  r.schedules = {"1f1b", "no-such-schedule"};
  absl::StatusOr<LayoutChoice> c = ChooseLayout(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(absl::StrJoin(c->skipped, "\n"), HasSubstr("no-such-schedule"));
  for (const LayoutCandidate& x : c->ranked) EXPECT_EQ(x.schedule, "1f1b");
}

TEST(LayoutTest, ChooseLayout_NoLayers_IsInvalidArgument) {
  LayoutRequest r;
  EXPECT_EQ(ChooseLayout(r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace stagehand
