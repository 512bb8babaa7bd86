// Tests of the schedule generators and the simulator: action counts and order, the bubble formula,
// peak activations, deadlock and malformed-list detection, ToString.
#include "worker/schedule.h"

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

Action A(ActionType type, int microbatch, int peer = -1, int group = -1) {
  Action a;
  a.type = type;
  a.microbatch = microbatch;
  a.peer = peer;
  a.group = group;
  return a;
}

std::vector<std::string> Strings(const std::vector<Action>& list) {
  std::vector<std::string> out;
  for (const Action& a : list) out.push_back(ToString(a));
  return out;
}

Schedule Build(const std::string& name, int stages, int microbatches) {
  absl::StatusOr<Schedule> s = MakeSchedule(name, stages, microbatches);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *s : Schedule{};
}

SimulationResult Sim(const Schedule& s, const StageCosts& costs) {
  absl::StatusOr<SimulationResult> r = Simulate(s, costs);
  EXPECT_TRUE(r.ok()) << s.name << " p=" << s.num_ranks << " m=" << s.num_microbatches << ": "
                      << r.status();
  return r.ok() ? *r : SimulationResult{};
}

double Formula(int p, int m) { return static_cast<double>(p - 1) / (m + p - 1); }

// A two-rank, one-chunk training list written by hand, to be broken by each malformed test.
Schedule HandMade(std::vector<Action> rank0, std::vector<Action> rank1, int microbatches = 1) {
  Schedule s;
  s.name = "hand";
  s.num_ranks = 2;
  s.num_microbatches = microbatches;
  s.ranks = {std::move(rank0), std::move(rank1)};
  return s;
}

// The correct 2-stage, 1-micro-batch list; each malformed test changes one thing.
Schedule GoodTwoStage() {
  using T = ActionType;
  return HandMade({A(T::kForward, 0), A(T::kSendActivation, 0, 1), A(T::kRecvGradient, 0, 1),
                   A(T::kBackward, 0), A(T::kOptimizerStep, 0)},
                  {A(T::kRecvActivation, 0, 0), A(T::kForward, 0), A(T::kBackward, 0),
                   A(T::kSendGradient, 0, 0), A(T::kOptimizerStep, 0)});
}

// ----- ToString ----------------------------------------------------------------------------------

TEST(ToString, EachKind_HasShortForm) {
  using T = ActionType;
  EXPECT_EQ(ToString(A(T::kForward, 3)), "F3");
  EXPECT_EQ(ToString(A(T::kBackward, 3)), "B3");
  EXPECT_EQ(ToString(A(T::kBackwardInput, 3)), "BI3");
  EXPECT_EQ(ToString(A(T::kBackwardWeight, 3)), "BW3");
  EXPECT_EQ(ToString(A(T::kSendActivation, 3, 1)), "SA3>1");
  EXPECT_EQ(ToString(A(T::kRecvActivation, 3, 0)), "RA3<0");
  EXPECT_EQ(ToString(A(T::kSendGradient, 3, 0)), "SG3>0");
  EXPECT_EQ(ToString(A(T::kRecvGradient, 3, 1)), "RG3<1");
  EXPECT_EQ(ToString(A(T::kOptimizerStep, 0)), "OPT");
}

TEST(ToString, GroupAndChunk_AreAppended) {
  Action a = A(ActionType::kSendActivation, 3, 1, /*group=*/5);
  EXPECT_EQ(ToString(a), "SA3>1[g5]");
  a.chunk = 1;
  EXPECT_EQ(ToString(a), "SA3c1>1[g5]");
  Action f = A(ActionType::kForward, 2);
  f.chunk = 1;
  EXPECT_EQ(ToString(f), "F2c1");
}

// ----- Generators --------------------------------------------------------------------------------

TEST(MakeSchedule, KnownNames_PickTheirGenerator) {
  EXPECT_EQ(Build("gpipe", 2, 2).name, "gpipe");
  EXPECT_EQ(Build("1f1b", 2, 2).name, "1f1b");
  Schedule f = Build("forward", 2, 2);
  EXPECT_EQ(f.name, "forward");
  EXPECT_TRUE(f.forward_only);
}

TEST(MakeSchedule, UnknownName_IsInvalidArgumentListingNames) {
  absl::StatusOr<Schedule> s = MakeSchedule("zb", 2, 4);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(),
              AllOf(HasSubstr("gpipe"), HasSubstr("1f1b"), HasSubstr("forward")));
}

TEST(MakeSchedule, NoStagesOrNoMicrobatches_IsInvalidArgument) {
  for (const char* name : {"gpipe", "1f1b", "forward"}) {
    EXPECT_EQ(MakeSchedule(name, 0, 4).status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(MakeSchedule(name, 2, 0).status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_EQ(MakeSchedule(name, -1, -1).status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(Make1F1B, FewerMicrobatchesThanStages_IsInvalidArgumentWithAdvice) {
  absl::StatusOr<Schedule> s = Make1F1B(4, 2);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            "1F1B needs at least as many micro-batches as stages (got 2 for 4 stages); "
            "use --micro-batches=4 or more, or --schedule=gpipe");
}

TEST(MakeGPipe, FewerMicrobatchesThanStages_IsAllowed) {
  EXPECT_TRUE(MakeGPipe(4, 2).ok());
}

// Pins the order the executor walks: Megatron's, with each exchange of neighbours in one group.
TEST(Make1F1B, TwoStagesFourMicrobatches_IsWarmupSteadyCooldown) {
  Schedule s = Build("1f1b", 2, 4);
  EXPECT_THAT(Strings(s.ranks[0]),
              ElementsAre("F0", "SA0>1",                                   // warm-up
                          "F1", "SA1>1[g0]", "RG0<1[g0]", "B0",            // steady
                          "F2", "SA2>1[g1]", "RG1<1[g1]", "B1",            //
                          "F3", "SA3>1[g2]", "RG2<1[g2]", "B2",            //
                          "RG3<1", "B3", "OPT"));                           // cool-down
  EXPECT_THAT(Strings(s.ranks[1]),
              ElementsAre("RA0<0", "F0", "B0", "SG0>0[g0]", "RA1<0[g0]",  //
                          "F1", "B1", "SG1>0[g1]", "RA2<0[g1]",            //
                          "F2", "B2", "SG2>0[g2]", "RA3<0[g2]",            //
                          "F3", "B3", "SG3>0", "OPT"));
}

TEST(MakeGPipe, TwoStagesTwoMicrobatches_IsForwardsThenReverseBackwards) {
  Schedule s = Build("gpipe", 2, 2);
  EXPECT_THAT(Strings(s.ranks[0]),
              ElementsAre("F0", "SA0>1", "F1", "SA1>1", "RG1<1", "B1", "RG0<1", "B0", "OPT"));
  EXPECT_THAT(Strings(s.ranks[1]),
              ElementsAre("RA0<0", "F0", "RA1<0", "F1", "B1", "SG1>0", "B0", "SG0>0", "OPT"));
}

TEST(MakeForwardOnly, TwoStages_HasNoBackwardGradientOrOptimizer) {
  Schedule s = Build("forward", 2, 2);
  EXPECT_THAT(Strings(s.ranks[0]), ElementsAre("F0", "SA0>1", "F1", "SA1>1"));
  EXPECT_THAT(Strings(s.ranks[1]), ElementsAre("RA0<0", "F0", "RA1<0", "F1"));
}

TEST(MakeSchedule, SameArguments_GiveSameLists) {
  for (const char* name : {"gpipe", "1f1b", "forward"}) {
    Schedule a = Build(name, 4, 7);
    Schedule b = Build(name, 4, 7);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(Strings(a.ranks[r]), Strings(b.ranks[r])) << name;
  }
}

// How often each (rank, kind, micro-batch) occurs, plus sends and receives paired across ranks.
void ExpectEachActionOnce(const Schedule& s) {
  const int p = s.num_ranks;
  const bool train = !s.forward_only;
  std::map<std::tuple<int, int, ActionType, int>, int> sends;  // (from, to, kind, mb)
  for (int r = 0; r < p; ++r) {
    std::map<std::pair<ActionType, int>, int> count;
    for (const Action& a : s.ranks[r]) {
      ++count[{a.type, a.microbatch}];
      if (a.type == ActionType::kSendActivation) ++sends[{r, a.peer, a.type, a.microbatch}];
      if (a.type == ActionType::kSendGradient) ++sends[{r, a.peer, a.type, a.microbatch}];
      if (a.type == ActionType::kRecvActivation) {
        --sends[{a.peer, r, ActionType::kSendActivation, a.microbatch}];
      }
      if (a.type == ActionType::kRecvGradient) {
        --sends[{a.peer, r, ActionType::kSendGradient, a.microbatch}];
      }
    }
    for (int mb = 0; mb < s.num_microbatches; ++mb) {
      const auto n = [&](ActionType t) { return count[{t, mb}]; };
      EXPECT_EQ(n(ActionType::kForward), 1) << s.name << " rank " << r << " mb " << mb;
      EXPECT_EQ(n(ActionType::kBackward), train ? 1 : 0) << s.name << " rank " << r;
      EXPECT_EQ(n(ActionType::kRecvActivation), r > 0 ? 1 : 0) << s.name << " rank " << r;
      EXPECT_EQ(n(ActionType::kSendActivation), r < p - 1 ? 1 : 0) << s.name << " rank " << r;
      EXPECT_EQ(n(ActionType::kRecvGradient), train && r < p - 1 ? 1 : 0) << s.name;
      EXPECT_EQ(n(ActionType::kSendGradient), train && r > 0 ? 1 : 0) << s.name;
    }
    const int steps = count[{ActionType::kOptimizerStep, 0}];
    EXPECT_EQ(steps, train ? 1 : 0) << s.name;
    if (train) {
      EXPECT_EQ(s.ranks[r].back().type, ActionType::kOptimizerStep);
    }
  }
  for (const auto& [key, balance] : sends) EXPECT_EQ(balance, 0) << s.name << " unmatched send";
}

TEST(MakeSchedule, AnySize_EachActionAppearsExactlyOnce) {
  for (const char* name : {"gpipe", "1f1b", "forward"}) {
    for (int p = 1; p <= 6; ++p) {
      for (int m = 1; m <= 9; ++m) {
        if (std::string(name) == "1f1b" && m < p) continue;
        ExpectEachActionOnce(Build(name, p, m));
      }
    }
  }
}

// Every group holds one exchange with one neighbour: a send and a receive with the same peer.
TEST(Make1F1B, Groups_PairASendWithAReceiveOfTheSamePeer) {
  for (int p = 2; p <= 5; ++p) {
    Schedule s = Build("1f1b", p, p + 3);
    for (int r = 0; r < p; ++r) {
      std::map<int, std::vector<Action>> groups;
      for (const Action& a : s.ranks[r]) {
        if (a.group >= 0) groups[a.group].push_back(a);
      }
      for (const auto& [id, g] : groups) {
        ASSERT_EQ(g.size(), 2u) << "rank " << r << " group " << id;
        EXPECT_EQ(g[0].peer, g[1].peer);
        const bool send_first = g[0].type == ActionType::kSendActivation ||
                                g[0].type == ActionType::kSendGradient;
        EXPECT_TRUE(send_first) << ToString(g[0]);
      }
    }
  }
}

// ----- Simulator: bubble and memory --------------------------------------------------------------

TEST(Simulate, GPipe_BubbleMatchesFormula) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {  // also fewer micro-batches than stages
      SimulationResult r = Sim(Build("gpipe", p, m), UniformCosts(p, 1.0, 2.0));
      EXPECT_NEAR(r.bubble_fraction, Formula(p, m), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_NEAR(r.makespan, 3.0 * (m + p - 1), 1e-9) << "p=" << p << " m=" << m;
    }
  }
}

TEST(Simulate, 1F1B_BubbleMatchesFormula) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 32; ++m) {
      SimulationResult r = Sim(Build("1f1b", p, m), UniformCosts(p, 1.0, 2.0));
      EXPECT_NEAR(r.bubble_fraction, Formula(p, m), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_NEAR(r.makespan, 3.0 * (m + p - 1), 1e-9) << "p=" << p << " m=" << m;
    }
  }
}

TEST(Simulate, ForwardOnly_BubbleMatchesFormula) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 32; ++m) {
      SimulationResult r = Sim(Build("forward", p, m), UniformCosts(p, 1.0, 2.0));
      EXPECT_NEAR(r.bubble_fraction, Formula(p, m), 1e-9) << "p=" << p << " m=" << m;
      EXPECT_THAT(r.peak_activations, ElementsAreArray(std::vector<int>(p, 1)));
    }
  }
}

TEST(Simulate, UniformCosts_ReportsBusyAndBubblePerRank) {
  SimulationResult r = Sim(Build("1f1b", 4, 8), UniformCosts(4, 1.0, 2.0));
  ASSERT_EQ(r.busy.size(), 4u);
  ASSERT_EQ(r.bubble.size(), 4u);
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_DOUBLE_EQ(r.busy[rank], 24.0);
    EXPECT_NEAR(r.bubble[rank], 1 - 24.0 / 33.0, 1e-9);
  }
}

TEST(Simulate, 1F1B_PeakActivationsAreStagesMinusRank) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = p; m <= 12; ++m) {
      SimulationResult r = Sim(Build("1f1b", p, m), UniformCosts(p));
      std::vector<int> expected;
      for (int rank = 0; rank < p; ++rank) expected.push_back(std::min(p - rank, m));
      EXPECT_EQ(r.peak_activations, expected) << "p=" << p << " m=" << m;
    }
  }
}

TEST(Simulate, GPipe_PeakActivationsAreMicrobatches) {
  for (int p = 1; p <= 8; ++p) {
    for (int m = 1; m <= 12; ++m) {
      SimulationResult r = Sim(Build("gpipe", p, m), UniformCosts(p));
      EXPECT_EQ(r.peak_activations, std::vector<int>(p, m)) << "p=" << p << " m=" << m;
    }
  }
}

// A transfer cost only stretches the lists; it must not turn them into a deadlock.
TEST(Simulate, P2pAndOptimizerCost_StayDeadlockFreeAndLengthen) {
  for (const char* name : {"gpipe", "1f1b", "forward"}) {
    for (int p = 1; p <= 6; ++p) {
      StageCosts costs = UniformCosts(p);
      const double base = Sim(Build(name, p, 2 * p), costs).makespan;
      costs.p2p = 0.25;
      costs.optimizer = 0.5;
      const double slower = Sim(Build(name, p, 2 * p), costs).makespan;
      if (p > 1) {
        EXPECT_GT(slower, base) << name << " p=" << p;
      }
    }
  }
}

// The slowest stage bounds the step: it must run all its forwards and backwards.
TEST(Simulate, OneSlowStage_BoundsTheMakespan) {
  StageCosts costs = UniformCosts(3);
  costs.forward[1] = 3;
  costs.backward[1] = 6;
  for (const char* name : {"gpipe", "1f1b"}) {
    SimulationResult r = Sim(Build(name, 3, 6), costs);
    EXPECT_DOUBLE_EQ(r.busy[1], 6 * 9.0);
    EXPECT_GE(r.makespan, 6 * 9.0 + 1 + 2) << name;  // plus the other stages' share before/after
    EXPECT_LT(r.bubble[1], r.bubble[0]) << name;
  }
}

// The format already carries zero-bubble's split backward; the simulator times and checks it.
TEST(Simulate, SplitBackward_CostsHalfAndHalfAndFreesAfterWeightGradient) {
  using T = ActionType;
  Schedule s;
  s.name = "zb1";
  s.num_ranks = 1;
  s.num_microbatches = 2;
  s.ranks = {{A(T::kForward, 0), A(T::kForward, 1), A(T::kBackwardInput, 0),
              A(T::kBackwardInput, 1), A(T::kBackwardWeight, 0), A(T::kBackwardWeight, 1),
              A(T::kOptimizerStep, 0)}};
  SimulationResult r = Sim(s, UniformCosts(1, 1.0, 2.0));
  EXPECT_DOUBLE_EQ(r.makespan, 6.0);
  EXPECT_EQ(r.peak_activations, std::vector<int>{2});
}

// ----- Simulator: deadlock -----------------------------------------------------------------------

// 1F1B's steady-state exchange written as plain sends and receives: both ranks send first.
Schedule UngroupedExchange() {
  using T = ActionType;
  return HandMade({A(T::kForward, 0), A(T::kSendActivation, 0, 1), A(T::kForward, 1),
                   A(T::kSendActivation, 1, 1), A(T::kRecvGradient, 0, 1), A(T::kBackward, 0),
                   A(T::kRecvGradient, 1, 1), A(T::kBackward, 1), A(T::kOptimizerStep, 0)},
                  {A(T::kRecvActivation, 0, 0), A(T::kForward, 0), A(T::kBackward, 0),
                   A(T::kSendGradient, 0, 0), A(T::kRecvActivation, 1, 0), A(T::kForward, 1),
                   A(T::kBackward, 1), A(T::kSendGradient, 1, 0), A(T::kOptimizerStep, 0)},
                  /*microbatches=*/2);
}

TEST(Simulate, BothSendFirstWithoutGroup_IsDeadlockNamingEachStuckAction) {
  absl::StatusOr<SimulationResult> r = Simulate(UngroupedExchange(), UniformCosts(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(),
              AllOf(HasSubstr("deadlock"), HasSubstr("rank 0 at action 3 waits on SA1>1"),
                    HasSubstr("rank 1 at action 3 waits on SG0>0")));
}

TEST(Simulate, SameExchangeGrouped_Completes) {
  Schedule s = UngroupedExchange();
  s.ranks[0][3].group = 0;  // SA1 with RG0
  s.ranks[0][4].group = 0;
  s.ranks[1][3].group = 0;  // SG0 with RA1
  s.ranks[1][4].group = 0;
  SimulationResult r = Sim(s, UniformCosts(2, 1.0, 2.0));
  EXPECT_NEAR(r.bubble_fraction, Formula(2, 2), 1e-9);
}

// The groups are what make 1F1B work under blocking semantics, at every pipeline depth.
TEST(Simulate, 1F1BWithGroupsRemoved_Deadlocks) {
  for (int p = 2; p <= 6; ++p) {
    Schedule s = Build("1f1b", p, p + 2);
    for (std::vector<Action>& list : s.ranks) {
      for (Action& a : list) a.group = -1;
    }
    EXPECT_EQ(Simulate(s, UniformCosts(p)).status().code(), absl::StatusCode::kFailedPrecondition)
        << "p=" << p;
  }
}

TEST(Simulate, ReceiveNeverSent_IsDeadlock) {
  using T = ActionType;
  // Rank 1 waits for micro-batch 1 before micro-batch 0, which rank 0 sends first.
  Schedule s = HandMade({A(T::kForward, 0), A(T::kSendActivation, 0, 1), A(T::kForward, 1),
                         A(T::kSendActivation, 1, 1)},
                        {A(T::kRecvActivation, 1, 0), A(T::kForward, 1),
                         A(T::kRecvActivation, 0, 0), A(T::kForward, 0)},
                        /*microbatches=*/2);
  s.forward_only = true;
  absl::StatusOr<SimulationResult> r = Simulate(s, UniformCosts(2));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), AllOf(HasSubstr("SA0>1"), HasSubstr("RA1<0")));
}

// ----- Simulator: malformed lists ----------------------------------------------------------------

void ExpectMalformed(const Schedule& s, const std::string& why) {
  absl::StatusOr<SimulationResult> r = Simulate(s, UniformCosts(s.num_ranks * s.chunks_per_rank));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(why));
}

TEST(Simulate, GoodHandMadeList_Runs) { Sim(GoodTwoStage(), UniformCosts(2)); }

TEST(Simulate, BackwardBeforeForward_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  std::swap(s.ranks[1][1], s.ranks[1][2]);  // B0 before F0
  ExpectMalformed(s, "rank 1 action 1 (B0): backward before its forward");
}

TEST(Simulate, BackwardBeforeGradientReceived_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  std::swap(s.ranks[0][2], s.ranks[0][3]);
  ExpectMalformed(s, "backward before its gradient is received");
}

TEST(Simulate, MissingOptimizerStep_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[1].pop_back();
  ExpectMalformed(s, "rank 1: a training list must end with its optimizer step");
}

TEST(Simulate, OptimizerStepNotLast_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  std::swap(s.ranks[0][3], s.ranks[0][4]);
  ExpectMalformed(s, "the optimizer step must be last");
}

TEST(Simulate, MicrobatchNeverRun_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.num_microbatches = 2;
  ExpectMalformed(s, "micro-batch 1: missing");
}

TEST(Simulate, ReceiveFromWrongPeer_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[1][0].peer = 1;
  ExpectMalformed(s, "the other end is rank 0, not 1");
}

TEST(Simulate, SendPastTheLastStage_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[1].insert(s.ranks[1].begin() + 2, A(ActionType::kSendActivation, 0, 0));
  ExpectMalformed(s, "no stage on that side");
}

TEST(Simulate, ForwardTwice_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[0].insert(s.ranks[0].begin() + 1, A(ActionType::kForward, 0));
  ExpectMalformed(s, "twice");
}

TEST(Simulate, MicrobatchOutOfRange_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[0][0].microbatch = 1;
  ExpectMalformed(s, "micro-batch out of range");
}

TEST(Simulate, GroupOnComputeOrReused_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.ranks[0][0].group = 0;
  ExpectMalformed(s, "only sends and receives belong to a group");
  s = GoodTwoStage();
  s.ranks[0][1].group = 0;
  s.ranks[0][2].group = 0;
  s.ranks[1][0].group = 0;
  s.ranks[1][3].group = 0;  // not adjacent to the first use
  ExpectMalformed(s, "group id reused");
}

TEST(Simulate, BackwardInForwardOnlyList_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.forward_only = true;
  ExpectMalformed(s, "a forward-only list has no backward");
}

TEST(Simulate, WrongShape_IsInvalidArgument) {
  Schedule s = GoodTwoStage();
  s.num_ranks = 3;
  ExpectMalformed(s, "2 lists for 3 ranks");
  s = GoodTwoStage();
  absl::StatusOr<SimulationResult> r = Simulate(s, UniformCosts(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("one entry per virtual stage"));
}

// ----------------------------------------------------------------------------------------------------
// Slots (the executor's CUDA-graph buffers).

// Replays a rank's list against a slot plan: no two micro-batches may hold one slot at once.
void ExpectSlotsNeverShared(const std::vector<Action>& actions, const SlotPlan& plan, bool release_after_forward) {
  std::map<int, int> holder;  // slot -> micro-batch
  for (const Action& x : actions) {
    if (x.type == ActionType::kForward) {
      const int slot = plan.slot_of[x.microbatch];
      ASSERT_GE(slot, 0) << "F" << x.microbatch;
      ASSERT_LT(slot, plan.slots);
      EXPECT_EQ(holder.count(slot), 0u) << "F" << x.microbatch << " takes slot " << slot << " held by "
                                         << holder[slot];
      if (!release_after_forward) holder[slot] = x.microbatch;
    } else if (x.type == ActionType::kBackward) {
      holder.erase(plan.slot_of[x.microbatch]);
    }
  }
}

TEST(AssignSlots, OneF1B_SlotsAreTheStagesFromThisOneToTheLast) {
  for (int p : {1, 2, 3, 4, 8}) {
    for (int m : {p, p + 1, 2 * p, 32}) {
      absl::StatusOr<Schedule> s = Make1F1B(p, m);
      ASSERT_TRUE(s.ok()) << s.status();
      for (int r = 0; r < p; ++r) {
        const SlotPlan plan = AssignSlots(s->ranks[r], m, false);
        EXPECT_EQ(plan.slots, p - r) << "p=" << p << " m=" << m << " rank " << r;
        ExpectSlotsNeverShared(s->ranks[r], plan, false);
      }
    }
  }
}

TEST(AssignSlots, GPipeHoldsEveryMicroBatch_InferenceOne) {
  absl::StatusOr<Schedule> gpipe = MakeGPipe(2, 8), forward = MakeForwardOnly(2, 16);
  ASSERT_TRUE(gpipe.ok() && forward.ok());
  for (int r = 0; r < 2; ++r) {
    const SlotPlan g = AssignSlots(gpipe->ranks[r], 8, false);
    EXPECT_EQ(g.slots, 8);
    ExpectSlotsNeverShared(gpipe->ranks[r], g, false);
    const SlotPlan f = AssignSlots(forward->ranks[r], 16, true);
    EXPECT_EQ(f.slots, 1);
    EXPECT_EQ(f.slot_of, std::vector<int>(16, 0));
  }
}

}  // namespace
}  // namespace stagehand
