// Tests of the schedule library: generator shapes, the communication pass against the reference
// generators, deadlock freedom and the bubble formula, the text form, slots, and the grid.
#include "schedule/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "schedule/reference_schedules.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;

Schedule Build(const std::string& name, int ranks, int microbatches) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, ranks, microbatches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

Schedule Parse(const std::string& text, int microbatches, const std::string& name = "hand") {
  absl::StatusOr<Schedule> s = ParseSchedule(text, name, microbatches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

Schedule Lower(const Schedule& compute) {
  absl::StatusOr<Schedule> s = AddCommunication(compute);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

SimulationResult Sim(const Schedule& s, const StageCosts& costs) {
  absl::StatusOr<SimulationResult> r = Simulate(s, costs);
  EXPECT_TRUE(r.ok()) << s.name << " p=" << s.num_ranks << " m=" << s.num_microbatches << ": " << r.status();
  return r.ok() ? *r : SimulationResult{};
}

SimulationResult Sim(const Schedule& s) { return Sim(s, UniformCosts(s.num_stages)); }

std::vector<std::string> Lists(const Schedule& s) {
  std::vector<std::string> out;
  for (const std::vector<Action>& list : s.ranks) out.push_back(ToString(list));
  return out;
}

bool Trains(const std::string& name, int p, int m) { return name != "1f1b" || m >= p; }

const char* const kNames[] = {"gpipe", "1f1b", "forward"};

// ----- Generators --------------------------------------------------------------------------------

TEST(GenerateGPipe, TwoRanks_IsForwardsThenReverseBackwardsComputeOnly) {
  absl::StatusOr<Schedule> s = GenerateGPipe(2, 2);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->name, "gpipe");
  EXPECT_EQ(s->num_stages, 2);
  EXPECT_EQ(s->stage_rank, (std::vector<int>{0, 1}));
  EXPECT_EQ(s->ChunksPerRank(), 1);
  EXPECT_THAT(Lists(*s), ElementsAreArray({"0F0 0F1 0B1 0B0 OPT", "1F0 1F1 1B1 1B0 OPT"}));
}

TEST(Generate1F1B, TwoRanksFourMicrobatches_IsWarmupSteadyCooldown) {
  absl::StatusOr<Schedule> s = Generate1F1B(2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_THAT(Lists(*s),
              ElementsAreArray({"0F0 0F1 0B0 0F2 0B1 0F3 0B2 0B3 OPT", "1F0 1B0 1F1 1B1 1F2 1B2 1F3 1B3 OPT"}));
}

TEST(Generate1F1B, FewerMicrobatchesThanRanks_IsInvalidArgumentWithAdvice) {
  absl::StatusOr<Schedule> s = Generate1F1B(4, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "1F1B needs at least as many micro-batches as stages (got 2 for 4 stages); "
            "use --micro-batches=4 or more, or --schedule=gpipe");
}

// Evaluation runs the forward part of the training list: for every generated schedule it is free of
// deadlock, and each rank runs every micro-batch forward through each stage it holds, nothing else.
TEST(ForwardPart, EveryGeneratedSchedule_SimulatesAndHasOnlyTheForwards) {
  const std::vector<std::tuple<const char*, int, int, int>> cases = {
      {"gpipe", 4, 8, 1}, {"1f1b", 4, 8, 1}, {"interleaved-1f1b", 4, 8, 2},
      {"zb-h1", 4, 8, 1}, {"zb-v", 4, 8, 2}, {"1f1b", 1, 4, 1}};
  for (const auto& [name, ranks, m, chunks] : cases) {
    absl::StatusOr<Schedule> training = MakeSchedule(name, ranks, m, chunks);
    ASSERT_TRUE(training.ok()) << name << ": " << training.status();
    const Schedule forward = ForwardPart(*training);
    EXPECT_TRUE(forward.forward_only) << name;
    absl::StatusOr<SimulationResult> sim = Simulate(forward, UniformCosts(forward.num_stages));
    EXPECT_TRUE(sim.ok()) << name << ": " << sim.status() << "\n" << ToString(forward);
    for (int r = 0; r < ranks; ++r) {
      int forwards = 0;
      for (const Action& a : forward.ranks[r]) {
        EXPECT_TRUE(a.kind == ActionKind::kForward || a.kind == ActionKind::kSendForward ||
                    a.kind == ActionKind::kRecvForward)
            << name << ": " << ToString(a);
        forwards += a.kind == ActionKind::kForward;
      }
      EXPECT_EQ(forwards, m * chunks) << name << " rank " << r;
    }
  }
}

TEST(GenerateForwardOnly, TwoRanks_HasForwardsOnly) {
  absl::StatusOr<Schedule> s = GenerateForwardOnly(2, 3);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(s->forward_only);
  EXPECT_THAT(Lists(*s), ElementsAreArray({"0F0 0F1 0F2", "1F0 1F1 1F2"}));
}

TEST(Generate, NoRanksOrNoMicrobatches_IsInvalidArgument) {
  for (auto* generate : {&GenerateGPipe, &Generate1F1B, &GenerateForwardOnly}) {
    EXPECT_EQ(generate(0, 4).status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(generate(2, 0).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Generate, AnySize_EmitsComputeOnlyWithEachPassOnce) {
  for (auto* generate : {&GenerateGPipe, &Generate1F1B, &GenerateForwardOnly}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = p; m <= 12; ++m) {
        absl::StatusOr<Schedule> s = generate(p, m);
        ASSERT_TRUE(s.ok()) << s.status();
        for (int r = 0; r < p; ++r) {
          std::map<std::pair<ActionKind, int>, int> count;
          for (const Action& a : s->ranks[r]) {
            EXPECT_FALSE(IsCommunication(a.kind)) << ToString(a);
            if (a.kind != ActionKind::kOptimizerStep) {
              EXPECT_EQ(a.stage, r);
            }
            ++count[{a.kind, a.microbatch}];
          }
          for (int mb = 0; mb < m; ++mb) {
            EXPECT_EQ((count[{ActionKind::kForward, mb}]), 1);
            EXPECT_EQ((count[{ActionKind::kBackward, mb}]), s->forward_only ? 0 : 1);
          }
        }
      }
    }
  }
}

TEST(MakeSchedule, UnknownName_IsInvalidArgumentListingNames) {
  absl::StatusOr<Schedule> s = MakeSchedule("zb", 2, 4);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("gpipe"), HasSubstr("1f1b"), HasSubstr("forward")));
}

// ----- AddCommunication: equal to the reference generators ---------------------------------------

// One action as the executor sees it: kind, micro-batch, peer, and group renumbered by first use.
using Step = std::tuple<int, int, int, int>;

int ReferenceKind(reference::ActionType t) {
  using T = reference::ActionType;
  switch (t) {
    case T::kForward:
      return static_cast<int>(ActionKind::kForward);
    case T::kBackward:
      return static_cast<int>(ActionKind::kBackward);
    case T::kBackwardInput:
      return static_cast<int>(ActionKind::kBackwardInput);
    case T::kBackwardWeight:
      return static_cast<int>(ActionKind::kBackwardWeight);
    case T::kSendActivation:
      return static_cast<int>(ActionKind::kSendForward);
    case T::kRecvActivation:
      return static_cast<int>(ActionKind::kRecvForward);
    case T::kSendGradient:
      return static_cast<int>(ActionKind::kSendBackward);
    case T::kRecvGradient:
      return static_cast<int>(ActionKind::kRecvBackward);
    case T::kOptimizerStep:
      return static_cast<int>(ActionKind::kOptimizerStep);
  }
  return -1;
}

template <typename A, typename KindOf>
std::vector<Step> Canonical(const std::vector<A>& list, KindOf kind_of) {
  std::map<int, int> renumbered;
  std::vector<Step> out;
  for (const A& a : list) {
    const int kind = kind_of(a);
    const bool opt = kind == static_cast<int>(ActionKind::kOptimizerStep);
    int group = -1;
    if (a.group >= 0) group = renumbered.emplace(a.group, renumbered.size()).first->second;
    out.emplace_back(kind, opt ? -1 : a.microbatch, a.peer, group);
  }
  return out;
}

absl::StatusOr<reference::Schedule> ReferenceMake(const std::string& name, int p, int m) {
  if (name == "gpipe") return reference::MakeGPipe(p, m);
  if (name == "1f1b") return reference::Make1F1B(p, m);
  return reference::MakeForwardOnly(p, m);
}

TEST(AddCommunication, GeneratedLists_EqualReferenceGeneratorsRankByRank) {
  for (const std::string name : kNames) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        if (!Trains(name, p, m)) continue;
        absl::StatusOr<reference::Schedule> ref = ReferenceMake(name, p, m);
        ASSERT_TRUE(ref.ok()) << ref.status();
        const Schedule lowered = Build(name, p, m);
        ASSERT_EQ(lowered.ranks.size(), ref->ranks.size());
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(Canonical(lowered.ranks[r], [](const Action& a) { return int(a.kind); }),
                    Canonical(ref->ranks[r], [](const reference::Action& a) { return ReferenceKind(a.type); }))
              << name << " p=" << p << " m=" << m << " rank " << r << ": " << ToString(lowered.ranks[r]);
        }
      }
    }
  }
}

// Pins the text of the most-run list: Megatron's order with each crossing exchange in one group.
TEST(AddCommunication, OneFOneBTwoRanks_GroupsOnlyCrossingExchanges) {
  EXPECT_THAT(Lists(Build("1f1b", 2, 4)),
              ElementsAreArray({"0F0 0SEND_F0 0F1 0SEND_F1|0RECV_B0 0B0 0F2 0SEND_F2|0RECV_B1 0B1 "
                                "0F3 0SEND_F3|0RECV_B2 0B2 0RECV_B3 0B3 OPT",
                                "1RECV_F0 1F0 1B0 1SEND_B0|1RECV_F1 1F1 1B1 1SEND_B1|1RECV_F2 1F2 "
                                "1B2 1SEND_B2|1RECV_F3 1F3 1B3 1SEND_B3 OPT"}));
}

TEST(AddCommunication, GPipeTwoRanks_SendThenReceiveThatDoNotCrossStayApart) {
  EXPECT_THAT(Lists(Build("gpipe", 2, 2)),
              ElementsAreArray({"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B1 0B1 0RECV_B0 0B0 OPT",
                                "1RECV_F0 1F0 1RECV_F1 1F1 1B1 1SEND_B1 1B0 1SEND_B0 OPT"}));
}

TEST(AddCommunication, ListWithSends_IsInvalidArgument) {
  absl::StatusOr<Schedule> s = AddCommunication(Build("gpipe", 2, 2));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("compute-only"));
}

TEST(AddCommunication, StageOnAnotherRank_IsInvalidArgument) {
  absl::StatusOr<Schedule> s = GenerateGPipe(2, 2);
  ASSERT_TRUE(s.ok());
  s->ranks[0][0].stage = 1;
  EXPECT_EQ(AddCommunication(*s).status().code(), absl::StatusCode::kInvalidArgument);
}

// ----- AddCommunication: interleaved and zero-bubble lists ---------------------------------------

// Breadth-first interleaved GPipe: stage s on rank s % p, two chunks per rank.
Schedule InterleavedGPipe(int p, int m) {
  Schedule s;
  s.name = "interleaved";
  s.num_ranks = p;
  s.num_stages = 2 * p;
  s.num_microbatches = m;
  s.ranks.resize(p);
  for (int v = 0; v < 2 * p; ++v) s.stage_rank.push_back(v % p);
  auto add = [&](ActionKind kind, int v, int mb) {
    Action a;
    a.kind = kind;
    a.stage = v;
    a.microbatch = mb;
    s.ranks[v % p].push_back(a);
  };
  for (int chunk = 0; chunk < 2; ++chunk) {
    for (int mb = 0; mb < m; ++mb) {
      for (int r = 0; r < p; ++r) add(ActionKind::kForward, chunk * p + r, mb);
    }
  }
  for (int chunk = 1; chunk >= 0; --chunk) {
    for (int mb = m - 1; mb >= 0; --mb) {
      for (int r = 0; r < p; ++r) add(ActionKind::kBackward, chunk * p + r, mb);
    }
  }
  for (std::vector<Action>& list : s.ranks) {
    list.push_back(Action{ActionKind::kOptimizerStep});
  }
  return s;
}

TEST(AddCommunication, InterleavedTwoChunks_IsDeadlockFree) {
  for (int p = 2; p <= 4; ++p) {
    for (int m = 1; m <= 8; ++m) {
      const Schedule lowered = Lower(InterleavedGPipe(p, m));
      EXPECT_EQ(lowered.ChunksPerRank(), 2);
      const SimulationResult r = Sim(lowered, UniformCosts(2 * p));
      EXPECT_EQ(r.peak_activations, std::vector<int>(p, 2 * m)) << "p=" << p << " m=" << m;
    }
  }
}

// Pins the timed lowering on two ranks: each transfer sits where both ranks are between computes
// (2F0's output goes out with 2F1's input, both received by rank 1 before 3F0), in one order on both.
TEST(AddCommunication, InterleavedTwoRanks_PostsEachTransferWhereBothRanksMeet) {
  EXPECT_THAT(Lists(Lower(InterleavedGPipe(2, 2))),
              ElementsAreArray({"0F0 0SEND_F0 0F1 0SEND_F1|2RECV_F0 2F0 2RECV_F1|2SEND_F0 2F1 2SEND_F1 "
                                "2RECV_B1 2B1 2SEND_B1|2RECV_B0 2B0 0RECV_B1|2SEND_B0 0B1 0RECV_B0 0B0 OPT",
                                "1RECV_F0 1F0 1RECV_F1|1SEND_F0 1F1 1SEND_F1|3RECV_F0 3F0 3RECV_F1 3F1 3B1 "
                                "3SEND_B1 3B0 1RECV_B1|3SEND_B0 1B1 1SEND_B1|1RECV_B0 1B0 1SEND_B0 OPT"}));
}

// A hand-written interleaved 1F1B-like order; its exchanges need groups, so removing them deadlocks.
constexpr char kInterleaved[] = R"(
  # p=2, stages 0 and 2 on rank 0, 1 and 3 on rank 1
  rank 0: 0F0 0F1 2F0 2F1 2B0 2B1 0B0 0B1 OPT
  rank 1: 1F0 1F1 3F0 3B0 3F1 3B1 1B0 1B1 OPT
)";

TEST(AddCommunication, HandWrittenInterleaved_SetsChunksPeersAndRuns) {
  const Schedule lowered = Lower(Parse(kInterleaved, 2));
  EXPECT_EQ(lowered.stage_rank, (std::vector<int>{0, 1, 0, 1}));
  Sim(lowered);
  for (int r = 0; r < 2; ++r) {
    for (const Action& a : lowered.ranks[r]) {
      if (a.kind == ActionKind::kOptimizerStep) continue;
      EXPECT_EQ(a.chunk, a.stage / 2) << ToString(a);
      if (IsCommunication(a.kind)) {
        EXPECT_EQ(a.peer, 1 - r) << ToString(a);
      }
    }
  }
  // Both ranks post their transfers in one order, so even without its groups the list runs.
  Schedule ungrouped = lowered;
  for (std::vector<Action>& list : ungrouped.ranks) {
    for (Action& a : list) a.group = -1;
  }
  EXPECT_TRUE(Simulate(ungrouped, UniformCosts(4)).ok());
}

TEST(AddCommunication, ZeroBubbleSplit_SendsAfterInputGradientAndRuns) {
  const Schedule lowered =
      Lower(Parse("0F0 0F1 0I0 0W0 0I1 0W1 OPT\n"
                  "1F0 1I0 1F1 1I1 1W0 1W1 OPT\n",
                  2));
  EXPECT_THAT(Lists(lowered), ElementsAreArray({"0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0I0 0W0 0RECV_B1 0I1 0W1 OPT",
                                                "1RECV_F0 1F0 1RECV_F1 1I0 1SEND_B0 1F1 1I1 1SEND_B1 1W0 1W1 OPT"}));
  const SimulationResult r = Sim(lowered);
  EXPECT_EQ(r.peak_activations, (std::vector<int>{2, 2}));  // held until W
}

// ----- Simulate: every generated list runs, with the textbook bubble ------------------------------

TEST(Simulate, EveryGeneratedList_IsDeadlockFree) {
  for (const std::string name : kNames) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        if (Trains(name, p, m)) Sim(Build(name, p, m));
      }
    }
  }
}

TEST(Simulate, GPipeAnd1F1B_BubbleIsBubbleBound) {
  for (const std::string name : {"gpipe", "1f1b"}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        if (!Trains(name, p, m)) continue;
        const SimulationResult r = Sim(Build(name, p, m), UniformCosts(p, 1.0, 2.0));
        EXPECT_NEAR(r.bubble_fraction, BubbleBound(p, m), 1e-9) << name << " p=" << p << " m=" << m;
        EXPECT_NEAR(r.makespan, 3.0 * (m + p - 1), 1e-9) << name << " p=" << p << " m=" << m;
      }
    }
  }
}

TEST(Simulate, ForwardOnly_BubbleIsBubbleBoundHoldingOneActivation) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      const SimulationResult r = Sim(Build("forward", p, m));
      EXPECT_NEAR(r.bubble_fraction, BubbleBound(p, m), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_EQ(r.peak_activations, std::vector<int>(p, 1));
    }
  }
}

TEST(Simulate, 1F1B_PeakActivationsAreRanksMinusRank) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 12; ++m) {
      std::vector<int> expected;
      for (int r = 0; r < p; ++r) expected.push_back(p - r);
      EXPECT_EQ(Sim(Build("1f1b", p, m)).peak_activations, expected) << "p=" << p << " m=" << m;
    }
  }
}

TEST(Simulate, GPipe_PeakActivationsAreMicrobatches) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 12; ++m) {
      EXPECT_EQ(Sim(Build("gpipe", p, m)).peak_activations, std::vector<int>(p, m));
    }
  }
}

TEST(Simulate, P2pAndOptimizerCost_StayDeadlockFreeAndLengthen) {
  for (const std::string name : kNames) {
    for (int p = 2; p <= 6; ++p) {
      StageCosts costs = UniformCosts(p);
      const double base = Sim(Build(name, p, 2 * p), costs).makespan;
      costs.p2p = 0.25;
      costs.optimizer = 0.5;
      EXPECT_GT(Sim(Build(name, p, 2 * p), costs).makespan, base) << name << " p=" << p;
    }
  }
}

TEST(Simulate, SingleRankSplitBackward_CostsHalfAndHalf) {
  const SimulationResult r = Sim(Parse("0F0 0F1 0I0 0I1 0W0 0W1 OPT", 2), UniformCosts(1, 1, 2));
  EXPECT_DOUBLE_EQ(r.makespan, 6.0);
  EXPECT_EQ(r.peak_activations, std::vector<int>{2});
  EXPECT_EQ(r.timeline, std::vector<std::string>{"0:0F0 1:0F1 2:0I0 3:0I1 4:0W0 5:0W1 6:OPT"});
}

TEST(Simulate, UniformCosts_ReportsBusyAndBubblePerRank) {
  const SimulationResult r = Sim(Build("1f1b", 4, 8), UniformCosts(4, 1.0, 2.0));
  ASSERT_EQ(r.busy.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_DOUBLE_EQ(r.busy[rank], 24.0);
    EXPECT_NEAR(r.bubble[rank], 1 - 24.0 / 33.0, 1e-9);
  }
}

// ----- Simulate: deadlock and malformed lists ----------------------------------------------------

// 1F1B's steady-state exchange with both ranks sending first and no groups.
constexpr char kUngrouped[] = R"(
  rank 0: 0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1 OPT
  rank 1: 1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1 OPT
)";

TEST(Simulate, BothSendFirstWithoutGroup_IsDeadlockNamingEachStuckAction) {
  absl::StatusOr<SimulationResult> r = Simulate(Parse(kUngrouped, 2), UniformCosts(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("deadlock"), HasSubstr("rank 0 waits at 0SEND_F1 (action 3)"),
                                          HasSubstr("rank 1 waits at 1SEND_B0 (action 3)")));
}

TEST(Simulate, SameExchangeGrouped_Completes) {
  const Schedule s = Parse(R"(
    rank 0: 0F0 0SEND_F0 0F1 0SEND_F1|0RECV_B0 0B0 0RECV_B1 0B1 OPT
    rank 1: 1RECV_F0 1F0 1B0 1SEND_B0|1RECV_F1 1F1 1B1 1SEND_B1 OPT
  )",
                           2);
  EXPECT_NEAR(Sim(s, UniformCosts(2, 1, 2)).bubble_fraction, BubbleBound(2, 2), 1e-9);
}

TEST(Simulate, ReceivesInTheWrongOrder_IsDeadlock) {
  absl::StatusOr<SimulationResult> r =
      Simulate(Parse("0F0 0SEND_F0 0F1 0SEND_F1\n1RECV_F1 1F1 1RECV_F0 1F0", 2), UniformCosts(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("rank 0 waits at 0SEND_F0"), HasSubstr("rank 1 waits at 1RECV_F1")));
}

void ExpectMalformed(const Schedule& s, const std::string& why) {
  absl::StatusOr<SimulationResult> r = Simulate(s, UniformCosts(s.num_stages));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(why));
}

Schedule GoodTwoStage() { return Build("gpipe", 2, 1); }  // 0F0 0SEND_F0 0RECV_B0 0B0 OPT / ...

TEST(Simulate, BackwardBeforeForward_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  std::swap(s.ranks[1][1], s.ranks[1][2]);
  ExpectMalformed(s, "rank 1 action 1 (1B0): backward before its forward");
}

TEST(Simulate, BackwardBeforeGradientReceived_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  std::swap(s.ranks[0][2], s.ranks[0][3]);
  ExpectMalformed(s, "backward before its gradient is received");
}

TEST(Simulate, MissingOrMisplacedOptimizerStep_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[1].pop_back();
  ExpectMalformed(s, "rank 1: a training list must end with its optimizer step");
  s = GoodTwoStage();
  std::swap(s.ranks[0][3], s.ranks[0][4]);
  ExpectMalformed(s, "the optimizer step must be last");
}

TEST(Simulate, MicrobatchNeverRun_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.num_microbatches = 2;
  ExpectMalformed(s, "micro-batch 1: missing");
}

TEST(Simulate, WrongPeerStageOrChunk_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[1][0].peer = 1;
  ExpectMalformed(s, "the other end is rank 0, not 1");
  s = GoodTwoStage();
  s.ranks[1][1].stage = 0;
  ExpectMalformed(s, "stage_rank does not place that stage on this rank");
  s = GoodTwoStage();
  s.ranks[1][1].chunk = 1;
  ExpectMalformed(s, "chunk should be 0");
}

TEST(Simulate, SendPastTheLastStageOrTwice_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  Action send = s.ranks[0][1];
  send.stage = 1;
  send.peer = 0;
  s.ranks[1].insert(s.ranks[1].begin() + 2, send);
  ExpectMalformed(s, "no stage on that side");
  s = GoodTwoStage();
  s.ranks[0].insert(s.ranks[0].begin() + 1, s.ranks[0][0]);
  ExpectMalformed(s, "twice");
}

TEST(Simulate, GroupOnComputeOrReused_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[0][0].group = 0;
  ExpectMalformed(s, "only sends and receives belong to a group");
  s = Parse(kUngrouped, 2);
  s.ranks[0][1].group = s.ranks[0][3].group = 0;
  ExpectMalformed(s, "group id reused");
}

TEST(Simulate, BackwardInForwardOnlyList_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.forward_only = true;
  ExpectMalformed(s, "a forward-only list has no backward");
}

TEST(Simulate, WrongShapeOrCosts_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.num_ranks = 3;
  ExpectMalformed(s, "3 ranks with 2 lists");
  absl::StatusOr<SimulationResult> r = Simulate(GoodTwoStage(), UniformCosts(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("one entry per virtual stage"));
}

TEST(Simulate, LocalNeighbourStage_NeedsNoTransferButItsOrder) {
  // Stages 0 and 1 on rank 0: the forward of stage 1 follows stage 0's locally.
  const Schedule s = Parse("0F0 1F0 1B0 0B0 OPT", 1);
  EXPECT_EQ(s.stage_rank, (std::vector<int>{0, 0}));
  Sim(s);
  ExpectMalformed(Parse("1F0 0F0 1B0 0B0 OPT", 1), "runs before stage 0's forward");
}

// ----- Text form ---------------------------------------------------------------------------------

Action Make(ActionKind kind, int stage, int mb, int group = -1) {
  Action a;
  a.kind = kind;
  a.stage = stage;
  a.microbatch = mb;
  a.group = group;
  return a;
}

TEST(ToString, EachKind_PrintsAsTorchDoes) {
  using K = ActionKind;
  EXPECT_EQ(ToString(Make(K::kForward, 1, 3)), "1F3");
  EXPECT_EQ(ToString(Make(K::kBackward, 1, 3)), "1B3");
  EXPECT_EQ(ToString(Make(K::kBackwardInput, 1, 3)), "1I3");
  EXPECT_EQ(ToString(Make(K::kBackwardWeight, 1, 3)), "1W3");
  EXPECT_EQ(ToString(Make(K::kSendForward, 0, 3)), "0SEND_F3");
  EXPECT_EQ(ToString(Make(K::kRecvForward, 1, 3)), "1RECV_F3");
  EXPECT_EQ(ToString(Make(K::kSendBackward, 1, 2)), "1SEND_B2");
  EXPECT_EQ(ToString(Make(K::kRecvBackward, 1, 2)), "1RECV_B2");
  EXPECT_EQ(ToString(Make(K::kOptimizerStep, 0, -1)), "OPT");
}

TEST(ToString, List_JoinsGroupsWithBar) {
  using K = ActionKind;
  EXPECT_EQ(ToString(std::vector<Action>{Make(K::kForward, 0, 1), Make(K::kSendForward, 0, 1, 4),
                                         Make(K::kRecvBackward, 0, 0, 4), Make(K::kBackward, 0, 0)}),
            "0F1 0SEND_F1|0RECV_B0 0B0");
}

TEST(ParseSchedule, GeneratedLists_RoundTrip) {
  for (const std::string name : kNames) {
    for (int p = 1; p <= 5; ++p) {
      for (int m = p; m <= p + 3; ++m) {
        const Schedule s = Build(name, p, m);
        const Schedule back = Parse(ToString(s), m, name);
        EXPECT_EQ(back.ranks, s.ranks) << ToString(s);
        EXPECT_EQ(back.stage_rank, s.stage_rank);
        EXPECT_EQ(back.num_stages, s.num_stages);
        EXPECT_EQ(back.forward_only, s.forward_only);
      }
    }
  }
}

TEST(ParseSchedule, Interleaved_RoundTripsWithChunks) {
  const Schedule s = Lower(InterleavedGPipe(3, 2));
  const Schedule back = Parse(ToString(s), 2);
  EXPECT_EQ(back.ranks, s.ranks);
  EXPECT_EQ(back.stage_rank, (std::vector<int>{0, 1, 2, 0, 1, 2}));
}

TEST(ParseActions, PeersAndChunks_FollowStageRank) {
  absl::StatusOr<std::vector<Action>> list = ParseActions("2RECV_F0 2F0 2SEND_F0|0RECV_B1", 0, {0, 1, 0, 1});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[0].peer, 1);
  EXPECT_EQ((*list)[1].chunk, 1);
  EXPECT_EQ((*list)[1].peer, -1);
  EXPECT_EQ((*list)[2].group, 0);
  EXPECT_EQ((*list)[3].group, 0);
  EXPECT_EQ((*list)[3].chunk, 0);
  EXPECT_EQ((*list)[0].group, -1);
}

void ExpectParseError(absl::string_view text, int rank, const std::vector<int>& stage_rank, const std::string& why) {
  absl::StatusOr<std::vector<Action>> list = ParseActions(text, rank, stage_rank);
  EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument) << text;
  EXPECT_THAT(list.status().message(), HasSubstr(why)) << text;
}

TEST(ParseActions, BadTokens_AreInvalidArgumentNamingTheToken) {
  ExpectParseError("0F0 1X3", 0, {0}, "unknown kind \"X\" in action \"1X3\"");
  ExpectParseError("F3", 0, {0}, "cannot parse action \"F3\"; expected {stage}{KIND}");
  ExpectParseError("0F", 0, {0}, "cannot parse action \"0F\"");
  ExpectParseError("0f0", 0, {0}, "cannot parse action \"0f0\"");
  ExpectParseError("0F0|", 0, {0}, "empty action in group \"0F0|\"");
  ExpectParseError("5F0", 0, {0, 1}, "action \"5F0\" on rank 0: there is no stage 5");
  ExpectParseError("1F0", 0, {0, 1}, "stage 1 lives on rank 1");
  ExpectParseError("1SEND_F0", 1, {0, 1}, "action \"1SEND_F0\" on rank 1: no stage 2");
  ExpectParseError("0RECV_F0", 0, {0, 1}, "no stage -1");
  ExpectParseError("0SEND_F0", 0, {0, 0}, "stage 1 is on this rank too");
}

TEST(ParseSchedule, BadPlacementOrNumbering_IsInvalidArgument) {
  auto error = [](const std::string& text) {
    absl::StatusOr<Schedule> s = ParseSchedule(text, "hand", 1);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << text;
    return std::string(s.status().message());
  };
  EXPECT_THAT(error("0F0\n0F0"), HasSubstr("stage 0 is computed on ranks 0 and 1"));
  EXPECT_THAT(error("0F0\n2F0"), HasSubstr("stage 1 is computed on no rank"));
  EXPECT_THAT(error("rank 1: 0F0"), HasSubstr("says rank 1 but is list 0"));
  EXPECT_THAT(error("# only a comment\n"), HasSubstr("0 lists"));
  EXPECT_THAT(error("0F0 0Q0"), HasSubstr("\"0Q0\""));
}

TEST(ParseSchedule, CommentsAndBlankLines_AreSkipped) {
  const Schedule s = Parse("# two ranks\n\nrank 0: 0F0 0SEND_F0  # forward\n  1RECV_F0 1F0\n", 1);
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_TRUE(s.forward_only);
  Sim(s);
}

// ----- AssignSlots -------------------------------------------------------------------------------

TEST(AssignSlots, OneFOneB_SlotsAreTheRanksFromThisOneToTheLast) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, p + 1, 2 * p, 32}) {
      const Schedule s = Build("1f1b", p, m);
      for (int r = 0; r < p; ++r) {
        const SlotPlan plan = AssignSlots(s.ranks[r], m, false);
        EXPECT_EQ(plan.slots, p - r) << "p=" << p << " m=" << m << " rank " << r;
        EXPECT_EQ(static_cast<int>(plan.slot_of.size()), m);
      }
    }
  }
}

TEST(AssignSlots, GPipeHoldsEveryMicrobatch_InferenceOne) {
  const Schedule gpipe = Build("gpipe", 2, 8);
  const Schedule forward = Build("forward", 2, 16);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(AssignSlots(gpipe.ranks[r], 8, false).slots, 8);
    const SlotPlan f = AssignSlots(forward.ranks[r], 16, true);
    EXPECT_EQ(f.slots, 1);
    EXPECT_EQ(f.slot_of, std::vector<int>(16, 0));
  }
}

TEST(AssignSlots, TwoChunks_KeyedPerChunkAndMicrobatch) {
  const Schedule s = Lower(InterleavedGPipe(2, 2));
  const SlotPlan plan = AssignSlots(s.ranks[0], 2, false);
  EXPECT_EQ(plan.slot_of, (std::vector<int>{0, 1, 2, 3}));  // [chunk * m + mb]
  EXPECT_EQ(plan.slots, 4);
}

TEST(AssignSlots, SplitBackward_HoldsUntilWeightGradient) {
  const Schedule s = Parse("0F0 0I0 0F1 0W0 0I1 0W1 OPT", 2);
  EXPECT_EQ(AssignSlots(s.ranks[0], 2, false).slots, 2);
}

// ----- Grid and BubbleBound ----------------------------------------------------------------------

TEST(Grid, OneFOneB_ShowsComputeByStep) {
  EXPECT_EQ(Grid(Build("1f1b", 2, 2)),
            "step   0   1   2   3   4   5\n"
            "rank 0 0F0 0F1     0B0     0B1\n"
            "rank 1     1F0 1B0 1F1 1B1\n");
}

TEST(Grid, Deadlock_MarksTheStuckActionAndShowsTheRest) {
  const Schedule s = Parse(kUngrouped, 2);
  const std::string grid = Grid(s, 0, 3);
  EXPECT_THAT(grid, AllOf(HasSubstr("[0SEND_F1]"), HasSubstr("0B1"), HasSubstr("1B0")));
  EXPECT_THAT(Grid(s, 1, 2), HasSubstr("[1B0]"));
  EXPECT_THAT(Grid(s), Not(HasSubstr("[")));
}

TEST(Grid, MalformedList_FallsBackToPlainRows) {
  Schedule s = GoodTwoStage();
  s.ranks[1].pop_back();
  EXPECT_EQ(Grid(s, 1, 0), "rank 0: 0F0 0SEND_F0 0RECV_B0 0B0 OPT\nrank 1: [1RECV_F0] 1F0 1B0 1SEND_B0\n");
}

TEST(BubbleBound, Values_AreTheTextbookFormula) {
  EXPECT_DOUBLE_EQ(BubbleBound(1, 4), 0.0);
  EXPECT_DOUBLE_EQ(BubbleBound(4, 4), 3.0 / 7.0);
  EXPECT_DOUBLE_EQ(BubbleBound(4, 4, 2), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(BubbleBound(0, 4), 0.0);
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

// A huge stage number is refused before anything is sized by it (an input of tests/fuzz:job_file_fuzz).
TEST(ParseSchedule, HugeStageNumber_IsInvalidArgumentWithoutAllocating) {
  absl::StatusOr<Schedule> s = ParseSchedule("0F0 437220932B0 OPT\n", "fuzz", 1);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("stage 1 is computed on no rank"), std::string::npos) << s.status();
}

// The largest int as a stage is refused without overflowing the stage count.
TEST(ParseSchedule, StageIntMax_IsInvalidArgumentWithoutOverflow) {
  absl::StatusOr<Schedule> s = ParseSchedule("0F0 0F1 0B1 0B0 2147483647F1\n", "fuzz", 2);
  ASSERT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.status().message().find("stage 1 is computed on no rank"), std::string::npos) << s.status();
}

}  // namespace
}  // namespace stagehand

// ----- Interleaved 1F1B, ZB-H1, ZB-V ---------------------------------------------------------------

namespace stagehand {
namespace {

Schedule Make(const std::string& name, int p, int m, int chunks) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, p, m, chunks);
  EXPECT_TRUE(s.ok()) << name << " p=" << p << " m=" << m << ": " << s.status();
  return s.ok() ? *s : Schedule{};
}

// Idle time of rank-mean: makespan minus the mean busy time.
double Idle(const SimulationResult& r) { return r.bubble_fraction * r.makespan; }

// Equal F, I and W costs: B = I + W = 2F.
StageCosts EqualFIW(int stages) {
  StageCosts c = UniformCosts(stages, 1.0, 2.0);
  c.backward_input = c.backward_weight = c.forward;
  return c;
}

TEST(GenerateInterleaved1F1B, StageOnRankModPAndEachPassOnce) {
  for (int p = 1; p <= 4; ++p) {
    for (int v = 1; v <= 3; ++v) {
      absl::StatusOr<Schedule> s = GenerateInterleaved1F1B(p, v, 2 * p);
      ASSERT_TRUE(s.ok()) << s.status();
      EXPECT_EQ(s->num_stages, p * v);
      EXPECT_EQ(s->ChunksPerRank(), v);
      for (int stage = 0; stage < p * v; ++stage) EXPECT_EQ(s->stage_rank[stage], stage % p);
      for (int r = 0; r < p; ++r) {
        std::map<std::tuple<ActionKind, int, int>, int> count;
        for (const Action& a : s->ranks[r]) {
          EXPECT_FALSE(IsCommunication(a.kind)) << ToString(a);
          ++count[{a.kind, a.stage, a.microbatch}];
        }
        for (int c = 0; c < v; ++c) {
          for (int mb = 0; mb < 2 * p; ++mb) {
            EXPECT_EQ((count[{ActionKind::kForward, c * p + r, mb}]), 1);
            EXPECT_EQ((count[{ActionKind::kBackward, c * p + r, mb}]), 1);
          }
        }
      }
    }
  }
}

TEST(GenerateInterleaved1F1B, MicrobatchesNotAMultipleOfRanks_IsInvalidArgumentWithAdvice) {
  absl::StatusOr<Schedule> s = GenerateInterleaved1F1B(4, 2, 6);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), AllOf(HasSubstr("Megatron's rule"), HasSubstr("--micro_batches=8")));
  EXPECT_EQ(GenerateInterleaved1F1B(2, 0, 4).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GenerateZeroBubbleH1, SplitsEveryBackwardAndNeedsMAtLeastP) {
  absl::StatusOr<Schedule> s = GenerateZeroBubbleH1(2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(ToString(s->ranks[0]), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0F3 0I2 0W2 0I3 0W3 OPT");
  EXPECT_EQ(ToString(s->ranks[1]), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1F3 1I3 1W2 1W3 OPT");
  absl::StatusOr<Schedule> few = GenerateZeroBubbleH1(4, 3);
  EXPECT_EQ(few.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(few.status().message(), HasSubstr("--micro_batches=4"));
}

TEST(GenerateZeroBubbleV, RankHoldsStagesRAnd2pMinus1MinusR) {
  absl::StatusOr<Schedule> s = GenerateZeroBubbleV(4, 8);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->stage_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0}));
  EXPECT_EQ(s->ChunksPerRank(), 2);
}

TEST(MakeSchedule, ChunksThatDoNotFitTheSchedule_AreInvalidArgumentNamingTheFlag) {
  for (const auto& [name, chunks] :
       std::vector<std::pair<std::string, int>>{{"zb-v", 1}, {"zb-v", 3}, {"1f1b", 2}, {"gpipe", 2}, {"zb-h1", 2}}) {
    absl::StatusOr<Schedule> s = MakeSchedule(name, 2, 4, chunks);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << name << " " << chunks;
    EXPECT_THAT(s.status().message(), HasSubstr("--stage_chunks")) << name << " " << chunks;
  }
  EXPECT_EQ(DefaultChunks("zb-v"), 2);
  EXPECT_EQ(DefaultChunks("interleaved-1f1b"), 2);
  EXPECT_EQ(DefaultChunks("zb-h1"), 1);
}

// The CI sweep: every list lowered and simulated (blocking send/receive) for p = 1..8, m up to 32.
TEST(Simulate, InterleavedAndZeroBubbleLists_AreDeadlockFree) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      if (m % p == 0) {
        for (int v = 2; v <= 3; ++v) Sim(Make("interleaved-1f1b", p, m, v), EqualFIW(p * v));
      }
      if (m >= p) Sim(Make("zb-h1", p, m, 1), EqualFIW(p));
      Sim(Make("zb-v", p, m, 2), EqualFIW(2 * p));
    }
  }
}

// With transfers beside compute (the GPU executor), exactly the textbook bubble; with blocking
// transfers (the CPU transport) a rank sometimes waits for its peer to finish a compute, never less.
TEST(Simulate, Interleaved_BubbleIsPMinus1OverVmPlusPMinus1) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 32; m += p) {
      for (int v = 2; v <= 3; ++v) {
        for (double b : {1.0, 2.0}) {
          StageCosts costs = UniformCosts(p * v, 1.0, b);
          const Schedule s = Make("interleaved-1f1b", p, m, v);
          const SimulationResult blocking = Sim(s, costs);
          costs.overlap_communication = true;
          const SimulationResult overlapped = Sim(s, costs);
          EXPECT_NEAR(overlapped.bubble_fraction, BubbleBound(p, m, v), 1e-9)
              << "p=" << p << " m=" << m << " v=" << v << " b=" << b;
          EXPECT_GE(blocking.makespan, overlapped.makespan - 1e-9) << "p=" << p << " m=" << m << " v=" << v;
        }
      }
    }
  }
}

TEST(Simulate, Interleaved4RanksBlocking_KeepsTheTextbookBubble) {
  for (int m : {4, 8, 32}) {
    EXPECT_NEAR(Sim(Make("interleaved-1f1b", 4, m, 2), UniformCosts(8, 1.0, 2.0)).bubble_fraction, BubbleBound(4, m, 2),
                1e-9)
        << "m=" << m;
  }
}

TEST(Simulate, ZeroBubbleH1_IdleIsAtMostAThirdOf1F1BsWithTheSameMemory) {
  for (int p = 1; p <= 8; ++p) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 1, 32}) {
      const Schedule zb_list = Make("zb-h1", p, m, 1), base_list = Make("1f1b", p, m, 1);
      for (bool overlap : {false, true}) {
        StageCosts costs = EqualFIW(p);
        costs.overlap_communication = overlap;
        const SimulationResult zb = Sim(zb_list, costs);
        const SimulationResult base = Sim(base_list, costs);
        EXPECT_LE(Idle(zb), Idle(base) / 3 + 1e-9) << "p=" << p << " m=" << m << " overlap=" << overlap;
        EXPECT_LE(zb.bubble_fraction, base.bubble_fraction) << "p=" << p << " m=" << m;
        EXPECT_EQ(*std::max_element(zb.peak_activations.begin(), zb.peak_activations.end()), p)
            << "p=" << p << " m=" << m;
      }
    }
  }
}

TEST(Simulate, ZeroBubbleV_BubbleBelowZeroBubbleH1s) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 2 * p; m <= 32; m += p) {
      const SimulationResult v = Sim(Make("zb-v", p, m, 2), EqualFIW(2 * p));
      const SimulationResult h1 = Sim(Make("zb-h1", p, m, 1), EqualFIW(p));
      EXPECT_LT(v.bubble_fraction, h1.bubble_fraction) << "p=" << p << " m=" << m;
    }
  }
}

}  // namespace
}  // namespace stagehand
