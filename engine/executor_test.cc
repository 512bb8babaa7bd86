// Tests of the pipeline engine on the CPU: a tiny real model split into fake stages (fake_stage.h), ranks
// as threads over the in-process transport (fake_transport.h), compared with a single-rank run.
#include "engine/executor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "engine/data.h"
#include "engine/fake_stage.h"
#include "engine/step_timer.h"
#include "schedule/schedule.h"
#include "transport/fake_transport.h"

namespace stagehand {
namespace {

// Tiny tensors: intra-op threads cost more than they give, and two ranks share this process's cores.
class OneThread : public ::testing::Environment {
 public:
  void SetUp() override { torch::set_num_threads(1); }
};
::testing::Environment* const kOneThread = ::testing::AddGlobalTestEnvironment(new OneThread);

constexpr int64_t kMicroBatch = 2;  // sequences per micro-batch
const FakeModel kModel;             // 4 layers: the embedding, two blocks, the head

// One rank: its stages (owned by the executor, kept here for their records) and its engine.
struct Rank {
  Streams streams{false};
  std::vector<FakeStage*> stages;
  std::unique_ptr<Executor> executor;
};

// `layers[c]` is the range of layers of chunk c.
std::unique_ptr<Rank> MakeRank(const Schedule& schedule, int rank, const std::vector<std::pair<int, int>>& layers,
                               const TokenSource* data, Transport* transport) {
  auto r = std::make_unique<Rank>();
  std::vector<std::unique_ptr<Stage>> chunks;
  for (const auto& [first, last] : layers) {
    auto stage = std::make_unique<FakeStage>(kModel, first, last);
    r->stages.push_back(stage.get());
    chunks.push_back(std::move(stage));
  }
  ExecutorOptions o;
  o.rank = rank;
  o.schedule = schedule;
  o.micro_batch = kMicroBatch;
  o.seq = kModel.seq;
  o.lr = 1e-2;  // large enough that a step visibly moves every parameter
  o.cuda_graphs = false;
  r->executor = std::make_unique<Executor>(std::move(o), std::move(chunks), data, transport, &r->streams);
  return r;
}

std::unique_ptr<TokenSource> Data() { return MakeSyntheticCorpus(kModel.vocab, kModel.seq, /*seed=*/3); }

// Tells the forward inputs of the first stage apart: the tokens of each micro-batch of `step`.
std::function<int(const torch::Tensor&)> IdentifyTokens(const TokenSource& data, int64_t step, int m) {
  std::vector<torch::Tensor> tokens;
  const torch::Tensor batch = data.Batch(step, 0, m * kMicroBatch);
  for (int mb = 0; mb < m; ++mb)
    tokens.push_back(batch.slice(0, mb * kMicroBatch, (mb + 1) * kMicroBatch).slice(1, 0, -1));
  return [tokens](const torch::Tensor& input) {
    for (size_t mb = 0; mb < tokens.size(); ++mb) {
      if (input.sizes() == tokens[mb].sizes() && torch::equal(input, tokens[mb])) return static_cast<int>(mb);
    }
    return -1;
  };
}

std::vector<torch::Tensor> Snapshot(const Executor& e) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : e.Parameters()) out.push_back(p.detach().clone());
  return out;
}

void ExpectClose(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << "parameter " << i;
    const double err = (got[i] - want[i]).abs().max().item<double>();
    const double scale = want[i].abs().max().item<double>();
    EXPECT_LE(err, 1e-6 * scale) << "parameter " << i;
  }
}

struct RunResult {
  std::vector<double> losses;
  std::vector<torch::Tensor> parameters;
};

// The whole model as one stage on one rank: the reference every split must match.
RunResult RunOneRank(const std::string& schedule, int m, int steps) {
  absl::StatusOr<Schedule> s = MakeSchedule(schedule, 1, m);
  EXPECT_TRUE(s.ok()) << s.status();
  auto data = Data();
  auto rank = MakeRank(*s, 0, {{0, kModel.num_layers}}, data.get(), nullptr);
  EXPECT_TRUE(rank->executor->Check().ok()) << rank->executor->Check();
  RunResult out;
  for (int step = 0; step < steps; ++step) {
    absl::StatusOr<StepResult> r = rank->executor->Step(step);
    EXPECT_TRUE(r.ok()) << r.status();
    if (r.ok()) out.losses.push_back(r->loss);
  }
  out.parameters = Snapshot(*rank->executor);
  return out;
}

// Runs `steps` steps on every rank, each on its own thread; returns each rank's results.
std::vector<std::vector<absl::StatusOr<StepResult>>> RunRanks(const std::vector<Rank*>& ranks, int steps) {
  std::vector<std::vector<absl::StatusOr<StepResult>>> results(ranks.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < ranks.size(); ++r) {
    threads.emplace_back([&, r] {
      for (int step = 0; step < steps; ++step) {
        results[r].push_back(ranks[r]->executor->Step(step));
        if (!results[r].back().ok()) return;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

int IndexOf(const std::vector<Action>& list, ActionKind kind, int microbatch) {
  for (size_t i = 0; i < list.size(); ++i) {
    if (list[i].kind == kind && list[i].microbatch == microbatch) return static_cast<int>(i);
  }
  return -1;
}

TEST(ExecutorTest, Step_SingleRank1F1B_CallsStageInListOrder) {
  absl::StatusOr<Schedule> s = MakeSchedule("1f1b", 1, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(ToString(s->ranks[0]), "0F0 0B0 0F1 0B1 0F2 0B2 0F3 0B3 OPT");
  auto data = Data();
  auto rank = MakeRank(*s, 0, {{0, kModel.num_layers}}, data.get(), nullptr);
  rank->stages[0]->set_identify(IdentifyTokens(*data, 0, 4));
  ASSERT_TRUE(rank->executor->Check().ok()) << rank->executor->Check();
  const std::vector<torch::Tensor> before = Snapshot(*rank->executor);

  absl::StatusOr<StepResult> r = rank->executor->Step(0);

  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(ToString(rank->stages[0]->calls()), "F0 L0 B0 F1 L1 B1 F2 L2 B2 F3 L3 B3");
  EXPECT_TRUE(r->has_loss);
  // Near uniform guessing at the start: ln(vocab) within a factor of two.
  EXPECT_GT(r->loss, 0.5 * std::log(kModel.vocab));
  EXPECT_LT(r->loss, 2.0 * std::log(kModel.vocab));
  EXPECT_EQ(r->tokens, 4 * kMicroBatch * kModel.seq);
  const std::vector<torch::Tensor> after = Snapshot(*rank->executor);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FALSE(torch::equal(after[i], before[i])) << "parameter " << i;
}

// A TokenSource that records which (step, index) batches it was asked for.
class RecordingSource : public TokenSource {
 public:
  explicit RecordingSource(std::unique_ptr<TokenSource> inner) : inner_(std::move(inner)) {}
  at::Tensor Batch(int64_t step, int64_t index, int64_t batch) const override {
    asked_.emplace_back(step, index);
    return inner_->Batch(step, index, batch);
  }
  const TokenSource& inner() const { return *inner_; }
  const std::vector<std::pair<int64_t, int64_t>>& asked() const { return asked_; }

 private:
  std::unique_ptr<TokenSource> inner_;
  mutable std::vector<std::pair<int64_t, int64_t>> asked_;
};

// Each step's batch is made once, at the end of the step before (PrefetchBatch), and it is that step's:
// the stage sees the step's own tokens in every micro-batch.
TEST(ExecutorTest, Step_NextBatchMadeAtTheEndOfAStep_IsTheNextStepsOwn) {
  absl::StatusOr<Schedule> s = MakeSchedule("1f1b", 1, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  RecordingSource data(Data());
  auto rank = MakeRank(*s, 0, {{0, kModel.num_layers}}, &data, nullptr);
  for (int step = 0; step < 3; ++step) {
    rank->stages[0]->set_identify(IdentifyTokens(data.inner(), step, 4));
    const size_t before = rank->stages[0]->calls().size();
    ASSERT_TRUE(rank->executor->Step(step).ok());
    const std::vector<FakeCall> calls(rank->stages[0]->calls().begin() + before, rank->stages[0]->calls().end());
    EXPECT_EQ(ToString(calls), "F0 L0 B0 F1 L1 B1 F2 L2 B2 F3 L3 B3") << "step " << step;
  }
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 0}, {1, 0}, {2, 0}, {3, 0}};
  EXPECT_EQ(data.asked(), want) << "step 0's batch at its start, then each next one at the end of a step";
}

TEST(ExecutorTest, Step_TwoRanksOverFakeTransport_MatchesOneRank) {
  constexpr int kM = 4, kSteps = 2;
  for (const std::string name : {"gpipe", "1f1b"}) {
    SCOPED_TRACE(name);
    const RunResult want = RunOneRank(name, kM, kSteps);
    absl::StatusOr<Schedule> s = MakeSchedule(name, 2, kM);
    ASSERT_TRUE(s.ok()) << s.status();
    auto data = Data();
    FakeFabric fabric(2);
    FakeTransport t0(&fabric, 0), t1(&fabric, 1);
    auto r0 = MakeRank(*s, 0, {{0, 2}}, data.get(), &t0);
    auto r1 = MakeRank(*s, 1, {{2, kModel.num_layers}}, data.get(), &t1);
    ASSERT_TRUE(r0->executor->Check().ok()) << r0->executor->Check();
    ASSERT_TRUE(r1->executor->Check().ok()) << r1->executor->Check();

    const auto results = RunRanks({r0.get(), r1.get()}, kSteps);

    ASSERT_EQ(results[0].size(), kSteps);
    ASSERT_EQ(results[1].size(), kSteps);
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_TRUE(results[0][step].ok()) << results[0][step].status();
      ASSERT_TRUE(results[1][step].ok()) << results[1][step].status();
      EXPECT_FALSE(results[0][step]->has_loss);
      ASSERT_TRUE(results[1][step]->has_loss);
      EXPECT_NEAR(results[1][step]->loss, want.losses[step], 1e-6 * want.losses[step]) << "step " << step;
    }
    std::vector<torch::Tensor> got = Snapshot(*r0->executor);
    for (const torch::Tensor& p : Snapshot(*r1->executor)) got.push_back(p);
    ExpectClose(got, want.parameters);
    // Rank 0 sends each micro-batch's activation and receives its gradient, both [batch, seq, hidden] fp32.
    const int64_t bytes = kMicroBatch * kModel.seq * kModel.hidden * 4;
    int sends = 0, recvs = 0;
    for (const FakeOp& op : fabric.OpsOf(0)) {
      EXPECT_EQ(op.peer, 1) << ToString(op);
      EXPECT_EQ(op.bytes, bytes) << ToString(op);
      (op.kind == FakeOp::kSend ? sends : recvs)++;
    }
    EXPECT_EQ(sends, kM * kSteps);
    EXPECT_EQ(recvs, kM * kSteps);
  }
}

TEST(ExecutorTest, Step_Inference_ForwardOnlyAndNoOptimizer) {
  absl::StatusOr<Schedule> s = MakeSchedule("forward", 2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(s->forward_only);
  auto data = Data();
  FakeFabric fabric(2);
  FakeTransport t0(&fabric, 0), t1(&fabric, 1);
  auto r0 = MakeRank(*s, 0, {{0, 2}}, data.get(), &t0);
  auto r1 = MakeRank(*s, 1, {{2, kModel.num_layers}}, data.get(), &t1);
  r0->stages[0]->set_identify(IdentifyTokens(*data, 0, 4));
  ASSERT_TRUE(r0->executor->Check().ok()) << r0->executor->Check();
  ASSERT_TRUE(r1->executor->Check().ok()) << r1->executor->Check();
  std::vector<torch::Tensor> before = Snapshot(*r0->executor);
  for (const torch::Tensor& p : Snapshot(*r1->executor)) before.push_back(p);

  const auto results = RunRanks({r0.get(), r1.get()}, 1);

  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(results[r].size(), 1);
    ASSERT_TRUE(results[r][0].ok()) << results[r][0].status();
    EXPECT_FALSE(results[r][0]->has_loss) << "rank " << r;
  }
  EXPECT_EQ(ToString(r0->stages[0]->calls()), "F0 F1 F2 F3");
  EXPECT_EQ(r1->stages[0]->kinds(), std::vector<char>(4, 'F'));  // no loss, no backward
  std::vector<torch::Tensor> after = Snapshot(*r0->executor);
  for (const torch::Tensor& p : Snapshot(*r1->executor)) after.push_back(p);
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) EXPECT_TRUE(torch::equal(after[i], before[i])) << "parameter " << i;
  for (const torch::Tensor& p : r1->executor->Parameters()) EXPECT_FALSE(p.grad().defined());
}

// The zero-bubble split and several chunks per rank: two ranks over the fake transport, one layer per
// virtual stage (interleaved and ZB-V: four stages on two ranks, two chunks each), match one rank's
// whole backward to 1e-6: I then W accumulates what B does, and local handoffs carry what transfers do.
TEST(ExecutorTest, Step_SplitBackwardAndTwoChunksPerRank_MatchOneRank) {
  constexpr int kM = 4, kSteps = 2;
  const RunResult want = RunOneRank("1f1b", kM, kSteps);
  for (const auto& [name, chunks] :
       std::vector<std::pair<std::string, int>>{{"zb-h1", 1}, {"interleaved-1f1b", 2}, {"zb-v", 2}}) {
    SCOPED_TRACE(name);
    absl::StatusOr<Schedule> s = MakeSchedule(name, 2, kM, chunks);
    ASSERT_TRUE(s.ok()) << s.status();
    const int per_stage = kModel.num_layers / s->num_stages;
    auto data = Data();
    FakeFabric fabric(2);
    FakeTransport t0(&fabric, 0), t1(&fabric, 1);
    std::vector<std::unique_ptr<Rank>> ranks;
    for (int r = 0; r < 2; ++r) {
      std::vector<std::pair<int, int>> layers;
      for (int v = 0; v < s->num_stages; ++v) {
        if (s->stage_rank[v] == r) layers.push_back({v * per_stage, (v + 1) * per_stage});
      }
      ranks.push_back(MakeRank(*s, r, layers, data.get(), r == 0 ? &t0 : &t1));
      ASSERT_TRUE(ranks[r]->executor->Check().ok()) << ranks[r]->executor->Check();
    }

    const auto results = RunRanks({ranks[0].get(), ranks[1].get()}, kSteps);

    const int loss_rank = s->stage_rank[s->num_stages - 1];
    for (int r = 0; r < 2; ++r) ASSERT_EQ(results[r].size(), kSteps);
    for (int step = 0; step < kSteps; ++step) {
      for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r][step].ok()) << results[r][step].status();
      ASSERT_TRUE(results[loss_rank][step]->has_loss);
      EXPECT_NEAR(results[loss_rank][step]->loss, want.losses[step], 1e-6 * want.losses[step]) << "step " << step;
    }
    // The model's parameters in stage order, from whichever rank holds each stage.
    std::vector<torch::Tensor> got;
    for (int v = 0; v < s->num_stages; ++v) {
      const Executor& e = *ranks[s->stage_rank[v]]->executor;
      const int chunk =
          static_cast<int>(std::find(e.chunk_stages().begin(), e.chunk_stages().end(), v) - e.chunk_stages().begin());
      for (const torch::Tensor& p : e.Parameters(chunk)) got.push_back(p.detach().clone());
    }
    ExpectClose(got, want.parameters);
  }
}

TEST(ExecutorTest, Check_ActionForAChunkItDoesNotHold_IsRefused) {
  // By hand: the parser would place stage 1 on the rank instead.
  Schedule s;
  s.name = "by hand";
  s.num_ranks = 1;
  s.num_stages = 1;
  s.num_microbatches = 1;
  s.forward_only = true;
  s.stage_rank = {0};
  Action f;
  f.kind = ActionKind::kForward;
  f.stage = 0;
  f.chunk = 1;
  f.microbatch = 0;
  s.ranks = {{f}};
  auto data = Data();
  auto rank = MakeRank(s, 0, {{0, kModel.num_layers}}, data.get(), nullptr);

  const absl::Status st = rank->executor->Check();

  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "0F0")) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "chunk 1")) << st;
}

TEST(ExecutorTest, Step_StageThrows_ErrorNamesRankAndAction) {
  absl::StatusOr<Schedule> s = MakeSchedule("1f1b", 1, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  auto data = Data();
  auto rank = MakeRank(*s, 0, {{0, kModel.num_layers}}, data.get(), nullptr);
  rank->stages[0]->set_identify(IdentifyTokens(*data, 0, 4));
  rank->stages[0]->set_throw_on_forward(2);

  absl::StatusOr<StepResult> r = rank->executor->Step(0);

  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "rank 0, 0F2")) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "fails as the test asked")) << r.status();
  EXPECT_EQ(rank->executor->failed_action(), IndexOf(s->ranks[0], ActionKind::kForward, 2));
}

TEST(ExecutorTest, Step_TransportAborted_FailsInsteadOfHanging) {
  absl::StatusOr<Schedule> s = MakeSchedule("1f1b", 2, 4);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->ranks[1][0].kind, ActionKind::kRecvForward);
  auto data = Data();
  FakeFabric fabric(2);
  FakeTransport t1(&fabric, 1);
  auto r1 = MakeRank(*s, 1, {{2, kModel.num_layers}}, data.get(), &t1);
  ASSERT_TRUE(r1->executor->Check().ok()) << r1->executor->Check();
  const auto start = std::chrono::steady_clock::now();

  // Rank 0 never runs: rank 1 waits at its first receive until the transport is aborted.
  absl::StatusOr<StepResult> r = absl::UnknownError("not run");
  std::thread thread([&] { r = r1->executor->Step(0); });
  const absl::Status blocked = fabric.AwaitBlocked(1);
  t1.Abort();
  thread.join();

  EXPECT_TRUE(blocked.ok()) << blocked;
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_TRUE(absl::StartsWith(r.status().message(), "rank 1, 1RECV_F0")) << r.status();
  EXPECT_EQ(r1->executor->failed_action(), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));  // the fabric's bound
}

TEST(ExecutorTest, Step_TwoChunksOnOneRank_PassesActivationsLocally) {
  constexpr int kSteps = 2;
  const RunResult want = RunOneRank("gpipe", 1, kSteps);
  absl::StatusOr<Schedule> s = ParseSchedule("0F0 1F0 1B0 0B0 OPT", "local", 1);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->stage_rank, (std::vector<int>{0, 0}));
  auto data = Data();
  auto rank = MakeRank(*s, 0, {{0, 2}, {2, kModel.num_layers}}, data.get(), /*transport=*/nullptr);
  ASSERT_TRUE(rank->executor->Check().ok()) << rank->executor->Check();

  std::vector<double> losses;
  for (int step = 0; step < kSteps; ++step) {
    absl::StatusOr<StepResult> r = rank->executor->Step(step);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_loss);
    losses.push_back(r->loss);
  }

  EXPECT_EQ(rank->stages[0]->kinds(), (std::vector<char>{'F', 'B', 'F', 'B'}));
  EXPECT_EQ(rank->stages[1]->kinds(), (std::vector<char>{'F', 'L', 'B', 'F', 'L', 'B'}));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(losses[step], want.losses[step], 1e-6 * want.losses[step]) << "step " << step;
  }
  ExpectClose(Snapshot(*rank->executor), want.parameters);
}

}  // namespace
}  // namespace stagehand
