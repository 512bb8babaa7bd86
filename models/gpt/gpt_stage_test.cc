// Tests of the GPT stages, loss, fused AdamW and token sources, on the CPU with the tiny preset. The
// CUDA tests (bf16 autocast, fused AdamW on the GPU) skip themselves without a GPU; they run on the
// GPU host through the bundle.
#include "models/gpt/gpt_stage.h"

#include <ATen/cuda/CUDAContext.h>

#include <ATen/autocast_mode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "models/gpt/gpt_description.h"
#include "engine/stage.h"
#include "engine/data.h"
#include "kernels/fused_backward_kernels.h"
#include "kernels/fused_kernels.h"
#include "kernels/gelu_kernels.h"
#include "kernels/gemm_gelu.h"
#include "kernels/gemm_residual.h"
#include "kernels/lt_gemm.h"
#include "nn/nn.h"
#include "engine/split_backward_check.h"
#include "engine/stage.h"

namespace stagehand {
namespace {

// Tiny tensors: intra-op threads cost more than they give, and on a loaded 2-core machine OpenMP's
// spinning threads made the tests twenty times slower.
class OneThread : public ::testing::Environment {
 public:
  void SetUp() override { torch::set_num_threads(1); }
};
::testing::Environment* const kOneThread = ::testing::AddGlobalTestEnvironment(new OneThread);

GptConfig Preset(const std::string& name) {
  absl::StatusOr<ModelSpec> spec = GptDescription().Resolve(name, {});
  EXPECT_TRUE(spec.ok()) << spec.status();
  return GptConfigFromSpec(*spec);
}

GptConfig Tiny() { return Preset("tiny"); }

// 2VH (embedding, head) + L (12H^2 + 13H) (qkv, proj, fc1, fc2 with biases; two LayerNorms) + 2H (final
// LayerNorm).
int64_t ExpectedParameters(const GptConfig& c) {
  const int64_t h = c.hidden;
  return 2 * c.vocab * h + c.layers * (12 * h * h + 13 * h) + 2 * h;
}

int64_t CountParameters(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

torch::Tensor Tokens(const GptConfig& c, int64_t batch, uint64_t seed) {
  return MakeSyntheticCorpus(c.vocab, c.seq, seed)->Batch(0, 0, batch).slice(1, 0, c.seq);
}

void ExpectSameParameters(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "parameter " << i;
}

std::vector<torch::Tensor> Concat(std::vector<torch::Tensor> a, const std::vector<torch::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// ----------------------------------------------------------------------------------------------------
// Presets (models/description_test.cc checks the descriptions themselves).

TEST(GptConfigFromSpec, Presets_GiveTheirSizes) {
  GptConfig c = Tiny();
  EXPECT_EQ(c.vocab, 256);
  EXPECT_EQ(c.hidden, 64);
  EXPECT_EQ(c.seq, 32);
  EXPECT_FALSE(c.bf16_autocast);
  GptConfig big = Preset("gpt-1.3b");
  EXPECT_TRUE(big.bf16_autocast);
  EXPECT_EQ(big.pipeline_layers(), 50);  // embedding, 24 blocks as attention and MLP halves, head
  EXPECT_EQ(ExpectedParameters(big), 1342820352);
}

// ----------------------------------------------------------------------------------------------------
// Stages.

TEST(GptStage, ParameterCount_MatchesFormula) {
  GptConfig other = Tiny();
  other.vocab = 100;
  other.hidden = 48;
  other.heads = 3;
  other.layers = 3;
  for (const GptConfig& c : {Tiny(), other}) {
    GptStage whole(c, 0, c.pipeline_layers(), 1);
    EXPECT_EQ(CountParameters(*whole), ExpectedParameters(c));
    GptStage a(c, 0, 2, 1), b(c, 2, c.pipeline_layers(), 1);
    EXPECT_EQ(CountParameters(*a) + CountParameters(*b), ExpectedParameters(c));
  }
}

TEST(GptStage, SplitAtAnyLayer_MatchesWholeModel) {
  const GptConfig c = Tiny();
  const int n = c.pipeline_layers();
  GptStage whole(c, 0, n, 7);
  torch::Tensor tokens = Tokens(c, 3, 1);
  torch::NoGradGuard no_grad;
  torch::Tensor expected = whole(tokens);
  for (int cut = 1; cut < n; ++cut) {
    GptStage a(c, 0, cut, 7), b(c, cut, n, 7);
    EXPECT_FALSE(b->has_embedding());
    EXPECT_FALSE(a->has_head());
    torch::Tensor hidden = a(tokens);
    EXPECT_EQ(hidden.scalar_type(), torch::kFloat32);
    EXPECT_EQ(hidden.sizes(), (std::vector<int64_t>{3, c.seq, c.hidden}));
    EXPECT_TRUE(torch::equal(b(hidden), expected)) << "cut at layer " << cut;
    ExpectSameParameters(Concat(a->parameters(), b->parameters()), whole->parameters());
  }
}

TEST(GptStage, ThreeStages_MatchWholeModel) {
  const GptConfig c = Tiny();
  GptStage whole(c, 0, c.pipeline_layers(), 7);
  GptStage a(c, 0, 1, 7), b(c, 1, 4, 7), d(c, 4, c.pipeline_layers(), 7);
  torch::Tensor tokens = Tokens(c, 2, 2);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(d(b(a(tokens))), whole(tokens)));
}

TEST(GptStage, Seed_ChangesParameters) {
  const GptConfig c = Tiny();
  GptStage a(c, 1, 2, 1), b(c, 1, 2, 2), a_again(c, 1, 2, 1);
  EXPECT_FALSE(torch::equal(a->parameters()[2], b->parameters()[2]));
  ExpectSameParameters(a->parameters(), a_again->parameters());
}

TEST(GptStage, InitOnSeveralThreads_MatchesOneThread) {
  const GptConfig c = Tiny();
  torch::set_num_threads(2);
  GptStage parallel(c, 0, c.pipeline_layers(), 4);
  torch::set_num_threads(1);
  ExpectSameParameters(parallel->parameters(), GptStage(c, 0, c.pipeline_layers(), 4)->parameters());
}

TEST(GptStage, Init_HasGptStatistics) {
  GptConfig c = Tiny();
  c.hidden = 256;
  c.layers = 8;
  GptStage block(c, 1, 3, 3);  // the first block: its attention and MLP halves
  for (const auto& item : block->named_parameters()) {
    const std::string& name = item.key();
    const torch::Tensor& p = item.value();
    if (name.find("ln") != std::string::npos) {
      const bool weight = name.find("weight") != std::string::npos;
      EXPECT_TRUE(torch::equal(p, weight ? torch::ones_like(p) : torch::zeros_like(p))) << name;
    } else if (name.find("bias") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::zeros_like(p))) << name;
    } else {
      const bool residual = name.find("proj") != std::string::npos || name.find("fc2") != std::string::npos;
      const double std = residual ? 0.02 / std::sqrt(2.0 * c.layers) : 0.02;
      EXPECT_NEAR(p.std().item<double>(), std, 0.05 * std) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.05 * std) << name;
    }
  }
}

TEST(GptStage, FusedQkvGrad_GivesAutogradsGradients) {
  GptConfig c = Tiny();
  torch::Tensor tokens = Tokens(c, 2, 5);
  auto grads = [&](bool fused) {
    c.fused_qkv_grad = fused;
    GptStage model(c, 0, c.pipeline_layers(), 3);
    LanguageModelLoss(model(tokens), tokens).backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.grad());
    return out;
  };
  const std::vector<torch::Tensor> fused = grads(true), plain = grads(false);
  ASSERT_EQ(fused.size(), plain.size());
  for (size_t i = 0; i < fused.size(); ++i) EXPECT_TRUE(torch::allclose(fused[i], plain[i], 1e-6, 1e-9)) << i;
}

// On the CPU the fused bias gradient's functions take their fallbacks (ATen's copies and sums), so the
// gradients are autograd's of the unfused ops, with q, k, v's gradients assembled either way.
TEST(GptStage, FusedBiasGrad_GivesUnfusedGradients) {
  GptConfig c = Tiny();
  torch::Tensor tokens = Tokens(c, 2, 5);
  auto grads = [&](bool fused_bias, bool fused_qkv) {
    c.fused_bias_grad = fused_bias;
    c.fused_qkv_grad = fused_qkv;
    GptStage model(c, 0, c.pipeline_layers(), 3);
    LanguageModelLoss(model(tokens), tokens).backward();
    std::vector<torch::Tensor> out;
    for (const auto& p : model->parameters()) out.push_back(p.grad());
    return out;
  };
  const std::vector<torch::Tensor> plain = grads(false, false);
  for (bool fused_qkv : {true, false}) {
    const std::vector<torch::Tensor> fused = grads(true, fused_qkv);
    ASSERT_EQ(fused.size(), plain.size());
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_TRUE(torch::allclose(fused[i], plain[i], 1e-5, 1e-8)) << "fused_qkv_grad " << fused_qkv << " " << i;
    }
  }
}

TEST(GptStage, FusedBiasGradOption_False_TurnsItOff) {
  ModelSpec spec = *GptDescription().Resolve("tiny", {});
  EXPECT_TRUE(GptConfigFromSpec(spec).fused_bias_grad);
  (*spec.mutable_options())["fused_bias_grad"] = "false";
  EXPECT_FALSE(GptConfigFromSpec(spec).fused_bias_grad);
}

TEST(GptStage, FusedQkvGradOption_False_TurnsItOff) {
  ModelSpec spec = *GptDescription().Resolve("tiny", {});
  EXPECT_TRUE(GptConfigFromSpec(spec).fused_qkv_grad);
  (*spec.mutable_options())["fused_qkv_grad"] = "false";
  EXPECT_FALSE(GptConfigFromSpec(spec).fused_qkv_grad);
}

TEST(GptStage, Forward_ShapesAndFp32) {
  const GptConfig c = Tiny();
  GptStage whole(c, 0, c.pipeline_layers(), 1);
  EXPECT_TRUE(whole->has_embedding());
  EXPECT_TRUE(whole->has_head());
  torch::Tensor logits = whole(Tokens(c, 2, 1));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, c.seq, c.vocab}));
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
}

TEST(GptStage, FutureTokens_DoNotChangeEarlierLogits) {
  const GptConfig c = Tiny();
  GptStage whole(c, 0, c.pipeline_layers(), 1);
  torch::Tensor tokens = Tokens(c, 1, 1);
  torch::Tensor changed = tokens.clone();
  changed.index_put_({0, c.seq - 1}, (tokens.index({0, c.seq - 1}) + 1) % c.vocab);
  torch::NoGradGuard no_grad;
  torch::Tensor a = whole(tokens), b = whole(changed);
  const int64_t s = c.seq - 1;
  EXPECT_TRUE(torch::allclose(a.slice(1, 0, s), b.slice(1, 0, s), 0.0, 1e-6));
  EXPECT_FALSE(torch::allclose(a.slice(1, s), b.slice(1, s)));
}

TEST(GptStage, WrongInput_Throws) {
  const GptConfig c = Tiny();
  GptStage first(c, 0, 2, 1), middle(c, 2, 3, 1);
  EXPECT_THROW(first(torch::zeros({1, c.seq, c.hidden})), c10::Error);      // hidden states to the embedding
  EXPECT_THROW(middle(torch::zeros({1, c.seq}, torch::kLong)), c10::Error);  // tokens to a block
  EXPECT_THROW(middle(torch::zeros({1, c.seq, c.hidden + 1})), c10::Error);  // wrong width
  EXPECT_THROW(GptStage(c, 2, 2, 1), c10::Error);                            // an empty range
  EXPECT_THROW(GptStage(c, 0, c.pipeline_layers() + 1, 1), c10::Error);
}

TEST(GptStage, Bf16AutocastWithCpuInput_RunsInFp32) {
  GptConfig c = Tiny();
  GptStage plain(c, 0, c.pipeline_layers(), 1);
  c.bf16_autocast = true;
  GptStage autocast(c, 0, c.pipeline_layers(), 1);
  torch::Tensor tokens = Tokens(c, 2, 1);
  torch::NoGradGuard no_grad;
  torch::Tensor logits = autocast(tokens);
  EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(logits, plain(tokens)));
}

// The linear layers' own backward (weight gradients accumulated into .grad by a GEMM) against central
// differences, in float64 where the check is exact to ~1e-7: the embedding, every linear of a block and
// the head, weights and biases.
TEST(GptStage, Gradients_MatchFiniteDifferences) {
  torch::manual_seed(11);  // the probe below: the same numbers whichever tests ran before
  GptConfig c = Tiny();
  c.layers = 1;
  GptStage model(c, 0, c.pipeline_layers(), 1);
  model->to(torch::kFloat64);
  torch::Tensor tokens = Tokens(c, 2, 1);
  torch::Tensor probe = torch::randn({2, c.seq, c.vocab}, torch::kFloat64);
  auto objective = [&] { return (model(tokens) * probe).sum(); };
  objective().backward();
  std::map<std::string, torch::Tensor> params;
  for (const auto& item : model->named_parameters()) params[item.key()] = item.value();
  for (const char* name : {"layers.0.weight", "layers.1.qkv.weight", "layers.1.qkv.bias", "layers.1.proj.weight",
                           "layers.2.fc1.weight", "layers.2.fc2.weight", "layers.2.fc2.bias", "layers.1.ln1.weight",
                           "layers.3.lm_head.weight"}) {
    ASSERT_TRUE(params.count(name)) << name;
    torch::Tensor p = params[name];
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat64) << name;
    for (int64_t index : {int64_t{0}, p.numel() / 2 + 1, p.numel() - 1}) {
      const double h = 1e-6;
      torch::Tensor flat = p.view({-1});
      torch::NoGradGuard no_grad;
      const double saved = flat[index].item<double>();
      flat[index].fill_(saved + h);
      const double up = objective().item<double>();
      flat[index].fill_(saved - h);
      const double down = objective().item<double>();
      flat[index].fill_(saved);
      const double numeric = (up - down) / (2 * h), analytic = p.grad().view({-1})[index].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << name << "[" << index << "]";
    }
  }
}

// Micro-batches add up: two backward passes leave the sum of their gradients in .grad.
TEST(GptStage, TwoBackwardPasses_AccumulateGradients) {
  const GptConfig c = Tiny();
  GptStage model(c, 0, c.pipeline_layers(), 1);
  model->to(torch::kFloat64);
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 1);
  auto grads_of = [&](std::vector<int64_t> indices) {
    for (auto& p : model->parameters()) p.mutable_grad().reset();
    for (int64_t i : indices) {
      torch::Tensor batch = corpus->Batch(0, i, 2);
      (model(batch.slice(1, 0, c.seq)).to(torch::kFloat64).logsumexp(-1).mean()).backward();
    }
    std::vector<torch::Tensor> out;
    for (auto& p : model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  std::vector<torch::Tensor> a = grads_of({0}), b = grads_of({1}), both = grads_of({0, 1});
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_TRUE(torch::allclose(both[i], a[i] + b[i], 1e-12, 1e-14)) << "parameter " << i;
  }
}

// The Stage interface's default zero-bubble split over the stage's layers (whose Dense layers add their
// weight gradients themselves): I gives the input's gradient and no parameter gradient, W then the
// parameters' gradients of the whole backward.
struct ModuleStage : Stage {
  explicit ModuleStage(GptStage m) : module(std::move(m)) {}
  TensorSpec Input(int64_t) const override { return {}; }
  TensorSpec Output(int64_t) const override { return {}; }
  torch::Tensor Forward(const torch::Tensor& input) override { return module(input); }
  std::vector<torch::Tensor> Parameters() override { return module->parameters(); }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override { return {}; }
  GptStage module;
};

TEST(GptStage, SplitBackward_InputThenWeightGradients_MatchTheWholeBackward) {
  const GptConfig c = Tiny();
  const int n = c.pipeline_layers();
  for (const int last : {n - 1, n}) {  // a middle stage (given its output's gradient) and the last (a loss)
    SCOPED_TRACE(last);
    ModuleStage stage(GptStage(c, 1, last, 7));
    torch::manual_seed(3);
    const torch::Tensor hidden = torch::randn({2, c.seq, c.hidden});
    const torch::Tensor grad_out = torch::randn({2, c.seq, c.hidden});
    const torch::Tensor targets = Tokens(c, 2, 5);
    auto run = [&](const torch::Tensor& x) {
      torch::Tensor out = stage.Forward(x);
      return last == n ? LanguageModelLoss(out, targets) : out;
    };
    const torch::Tensor g = last == n ? torch::Tensor() : grad_out;
    torch::Tensor x1 = hidden.clone().requires_grad_(true);
    stage.Backward(run(x1), g);
    std::vector<torch::Tensor> want;
    for (auto& p : stage.Parameters()) want.push_back(p.grad().clone());
    for (auto& p : stage.Parameters()) p.mutable_grad().reset();

    torch::Tensor x2 = hidden.clone().requires_grad_(true);
    const torch::Tensor out = run(x2);
    const torch::Tensor dx = stage.BackwardInput(x2, out, g);
    EXPECT_TRUE(torch::allclose(dx, x1.grad(), 1e-6, 1e-7));
    for (auto& p : stage.Parameters()) EXPECT_FALSE(p.grad().defined() && p.grad().abs().sum().item<double>() > 0);
    stage.BackwardWeight(out, g);
    const std::vector<torch::Tensor> got = stage.Parameters();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(got[i].grad().defined()) << "parameter " << i;
      EXPECT_TRUE(torch::allclose(got[i].grad(), want[i], 1e-6, 1e-7)) << "parameter " << i;
    }
  }
}

// The family's stages (as the worker builds them) defer their linear layers' weight GEMMs from I to W:
// after I those weights' gradients are untouched, and I + W is the whole backward to the bit. With
// --model_option=deferred_wgrad=false they take the Stage interface's defaults, also exact.
TEST(GptFamily, SplitBackward_DeferredWeightGradients_IPlusWIsTheWholeBackwardExactly) {
  absl::StatusOr<ModelSpec> spec = GptDescription().Resolve("tiny", {});
  ASSERT_TRUE(spec.ok()) << spec.status();
  const GptConfig c = GptConfigFromSpec(*spec);
  const int n = c.pipeline_layers();
  auto linear_weight = [](const std::string& name) {
    for (const char* w : {".qkv.weight", ".proj.weight", ".fc1.weight", ".fc2.weight", ".lm_head.weight"}) {
      if (name.size() > strlen(w) && name.compare(name.size() - strlen(w), strlen(w), w) == 0) return true;
    }
    return false;
  };
  torch::manual_seed(3);
  const torch::Tensor hidden = torch::randn({2, c.seq, c.hidden});
  const torch::Tensor grad_out = torch::randn({2, c.seq, c.hidden});
  const torch::Tensor tokens = Tokens(c, 2, 4), targets = Tokens(c, 2, 5);
  for (const bool defer : {true, false}) {
    JobSpec job;
    job.set_device("cpu");
    *job.mutable_model_spec() = *spec;
    if (!defer) (*job.mutable_model_spec()->mutable_options())["deferred_wgrad"] = "false";
    // The first stage (tokens in), a middle one (given its output's gradient), the last (a loss).
    for (auto [first, last] : std::vector<std::pair<int, int>>{{0, 3}, {1, n - 1}, {2, n}}) {
      SCOPED_TRACE(absl::StrCat(defer ? "deferred" : "defaults", " [", first, ", ", last, ")"));
      auto make = [&, first = first, last = last]() {
        StageOptions o;
        o.job = &job;
        o.first_layer = first;
        o.last_layer = last;
        o.num_layers = n;
        o.seed = 7;
        absl::StatusOr<std::unique_ptr<Stage>> stage = MakeGptFamily()->MakeStage(o);
        EXPECT_TRUE(stage.ok()) << stage.status();
        return std::move(*stage);
      };
      ExpectSplitBackwardIsTheWholeBackward(
          make, first == 0 ? tokens : hidden, last == n ? torch::Tensor() : grad_out,
          [&](const torch::Tensor& logits) { return LanguageModelLoss(logits, targets); }, linear_weight);
    }
  }
}

// bf16 autocast (here on the CPU, as the GPU path does it on CUDA): the linear layers compute with bf16
// copies of their weights, cast once and cast again only when the weights change in place (an optimizer
// step, or a direct update); the gradients land in the fp32 parameters, close to the fp32 ones.
class CpuBf16Autocast {
 public:
  CpuBf16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
  }
  ~CpuBf16Autocast() {
    at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCPU, false);
  }
};

TEST(GptStage, Bf16CastWeights_FollowInPlaceUpdatesAndGiveFp32Gradients) {
  const GptConfig c = Tiny();
  GptStage model(c, 0, c.pipeline_layers(), 1), reference(c, 0, c.pipeline_layers(), 1);
  torch::Tensor tokens = Tokens(c, 2, 1);
  torch::Tensor targets = MakeSyntheticCorpus(c.vocab, c.seq, 1)->Batch(0, 0, 2).slice(1, 1);
  LanguageModelLoss(reference(tokens), targets).backward();
  {
    CpuBf16Autocast autocast;
    torch::Tensor logits = model(tokens);
    EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
    LanguageModelLoss(logits, targets).backward();
  }
  const std::vector<torch::Tensor> ours = model->parameters(), fp32 = reference->parameters();
  for (size_t i = 0; i < ours.size(); ++i) {
    ASSERT_TRUE(ours[i].grad().defined()) << "parameter " << i;
    EXPECT_EQ(ours[i].grad().scalar_type(), torch::kFloat32);
    const double scale = fp32[i].grad().abs().max().item<double>();
    EXPECT_LT((ours[i].grad() - fp32[i].grad()).abs().max().item<double>(), 0.05 * scale + 1e-6) << "parameter " << i;
  }

  CpuBf16Autocast autocast;
  torch::NoGradGuard no_grad;
  const torch::Tensor before = model(tokens);
  EXPECT_TRUE(torch::equal(model(tokens), before));  // same weights, same cast
  FusedAdamW optimizer(model->parameters(), 1e-2);
  optimizer.Step();  // in place: the casts must follow
  const torch::Tensor stepped = model(tokens);
  EXPECT_FALSE(torch::equal(stepped, before));
  // Only the head's weight changes: the result is what a model built with that weight gives.
  torch::Tensor head = model->named_parameters()["layers.9.lm_head.weight"];
  head.mul_(0.5);
  torch::Tensor fresh_logits;
  {
    GptStage fresh(c, 0, c.pipeline_layers(), 1);
    auto theirs = fresh->parameters();
    auto mine = model->parameters();
    for (size_t i = 0; i < mine.size(); ++i) theirs[i].copy_(mine[i]);
    fresh_logits = fresh(tokens);
  }
  EXPECT_TRUE(torch::equal(model(tokens), fresh_logits));
  EXPECT_FALSE(torch::equal(model(tokens), stepped));
}

// ----------------------------------------------------------------------------------------------------
// Loss and training.

TEST(LanguageModelLoss, UntrainedTinyModel_IsNearLnVocab) {
  const GptConfig c = Tiny();
  GptStage whole(c, 0, c.pipeline_layers(), 1);
  torch::Tensor batch = MakeSyntheticCorpus(c.vocab, c.seq, 1)->Batch(0, 0, 8);
  torch::NoGradGuard no_grad;
  torch::Tensor loss = LanguageModelLoss(whole(batch.slice(1, 0, c.seq)), batch.slice(1, 1));
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  EXPECT_NEAR(loss.item<double>(), std::log(256.0), 0.5);
}

TEST(LanguageModelLoss, Bf16Logits_MatchesManualCrossEntropyInFp32) {
  torch::manual_seed(0);
  torch::Tensor logits = torch::randn({2, 3, 5}).to(torch::kBFloat16);
  torch::Tensor targets = torch::randint(5, {2, 3}, torch::kLong);
  torch::Tensor loss = LanguageModelLoss(logits, targets);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  torch::Tensor logp = torch::log_softmax(logits.to(torch::kFloat32), -1);
  torch::Tensor expected = -logp.gather(-1, targets.unsqueeze(-1)).mean();
  EXPECT_NEAR(loss.item<double>(), expected.item<double>(), 1e-6);
}

TEST(Training, TinyModelOnSyntheticCorpus_LossFallsWellBelowLnVocab) {
  const GptConfig c = Tiny();
  GptStage model(c, 0, c.pipeline_layers(), 5);
  FusedAdamW optimizer(model->parameters(), 3e-3);
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 11);
  for (int64_t step = 0; step < 150; ++step) {
    torch::Tensor batch = corpus->Batch(step, 0, 16);
    torch::Tensor loss = LanguageModelLoss(model(batch.slice(1, 0, c.seq)), batch.slice(1, 1));
    loss.backward();
    optimizer.Step();
    optimizer.ZeroGrad();
  }
  torch::NoGradGuard no_grad;
  torch::Tensor held_out = corpus->Batch(1000000, 0, 64);  // a step never trained on
  const double loss = LanguageModelLoss(model(held_out.slice(1, 0, c.seq)), held_out.slice(1, 1)).item<double>();
  RecordProperty("held_out_loss", std::to_string(loss));
  // Uniform guessing gives ln 256 = 5.55, the best possible about 0.88; 150 steps reach about 0.9.
  EXPECT_LT(loss, 1.5);
}

// ----------------------------------------------------------------------------------------------------
// FusedAdamW.

std::vector<torch::Tensor> RandomParams(torch::Device device) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params;
  for (auto shape : {std::vector<int64_t>{7, 5}, {13}, {3, 4, 2}}) {
    params.push_back(torch::randn(shape).to(device).requires_grad_());
  }
  return params;
}

void ExpectFusedAdamWMatchesTorch(torch::Device device) {
  std::vector<torch::Tensor> fused = RandomParams(device), reference = RandomParams(torch::kCPU);
  const double lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
  FusedAdamW ours(fused, lr, beta1, beta2, eps, weight_decay);
  torch::optim::AdamW theirs(
      reference, torch::optim::AdamWOptions(lr).betas({beta1, beta2}).eps(eps).weight_decay(weight_decay));
  torch::manual_seed(4);
  for (int step = 0; step < 5; ++step) {
    for (size_t i = 0; i < fused.size(); ++i) {
      // Every other step the last parameter has no gradient: both optimizers skip it.
      if (step % 2 == 1 && i + 1 == fused.size()) continue;
      torch::Tensor g = torch::randn(fused[i].sizes());
      fused[i].mutable_grad() = g.to(device);
      reference[i].mutable_grad() = g.clone();
    }
    ours.Step();
    theirs.step();
    ours.ZeroGrad();
    theirs.zero_grad();
    for (size_t i = 0; i < fused.size(); ++i) {
      EXPECT_FALSE(fused[i].grad().defined());
      const double diff = (fused[i].detach().cpu() - reference[i].detach()).abs().max().item<double>();
      EXPECT_LE(diff, 1e-6) << "parameter " << i << " after step " << step;
    }
  }
  EXPECT_FALSE(torch::equal(fused[0].detach().cpu(), RandomParams(torch::kCPU)[0].detach()));  // it moved
}

TEST(FusedAdamW, FewSteps_MatchesTorchAdamW) { ExpectFusedAdamWMatchesTorch(torch::kCPU); }

// Zeroing in place (what captured CUDA graphs need): the same gradient tensors, zeroed, and zeros for a
// parameter that had none; the default sets them to None.
TEST(FusedAdamW, ZeroGradInPlace_KeepsGradientTensors) {
  torch::Tensor a = torch::ones({3}).requires_grad_(true), b = torch::ones({2, 2}).requires_grad_(true);
  a.mutable_grad() = torch::full({3}, 5.0);
  const void* address = a.grad().data_ptr();
  FusedAdamW optimizer({a, b});
  optimizer.ZeroGrad(/*set_to_none=*/false);
  EXPECT_EQ(a.grad().data_ptr(), address);
  EXPECT_TRUE(torch::equal(a.grad(), torch::zeros({3})));
  ASSERT_TRUE(b.grad().defined());
  EXPECT_TRUE(torch::equal(b.grad(), torch::zeros({2, 2})));
  optimizer.ZeroGrad();
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
}

// ----------------------------------------------------------------------------------------------------
// Token sources.

TEST(SyntheticCorpus, SameSeedStepIndex_SameBatch) {
  const GptConfig c = Tiny();
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 9);
  torch::Tensor a = corpus->Batch(3, 1, 4);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, c.seq + 1}));
  EXPECT_EQ(a.scalar_type(), torch::kLong);
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_GE(a.min().item<int64_t>(), 0);
  EXPECT_LT(a.max().item<int64_t>(), c.vocab);
  EXPECT_TRUE(torch::equal(a, MakeSyntheticCorpus(c.vocab, c.seq, 9)->Batch(3, 1, 4)));  // another instance, as another rank
  EXPECT_TRUE(torch::equal(a, corpus->Batch(3, 1, 8).slice(0, 0, 4)));       // rows do not depend on batch size
}

TEST(SyntheticCorpus, DifferentIndexStepOrSeed_DifferentBatch) {
  const GptConfig c = Tiny();
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 9);
  torch::Tensor a = corpus->Batch(3, 1, 4);
  EXPECT_FALSE(torch::equal(a, corpus->Batch(3, 2, 4)));
  EXPECT_FALSE(torch::equal(a, corpus->Batch(4, 1, 4)));
  EXPECT_FALSE(torch::equal(a, MakeSyntheticCorpus(c.vocab, c.seq, 10)->Batch(3, 1, 4)));
}

TEST(SyntheticCorpus, NextToken_MostlyFollowsOneSuccessor) {
  const GptConfig c = Tiny();
  torch::Tensor batch = MakeSyntheticCorpus(c.vocab, c.seq, 9)->Batch(0, 0, 256);
  std::vector<std::vector<int>> counts(c.vocab, std::vector<int>(c.vocab));
  auto t = batch.accessor<int64_t, 2>();
  for (int64_t r = 0; r < batch.size(0); ++r) {
    for (int64_t s = 0; s < c.seq; ++s) ++counts[t[r][s]][t[r][s + 1]];
  }
  int64_t followed = 0;
  for (const auto& row : counts) followed += *std::max_element(row.begin(), row.end());
  const double fraction = static_cast<double>(followed) / (batch.size(0) * c.seq);
  EXPECT_GT(fraction, 0.85);
  EXPECT_LT(fraction, 0.95);
}

TEST(SyntheticCorpus, ReferenceSizes_AreFast) {
  absl::StatusOr<GptConfig> c = Preset("gpt-1.3b");
  ASSERT_TRUE(c.ok());
  auto corpus = MakeSyntheticCorpus(c->vocab, c->seq, 1);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(corpus->Batch(0, i, 8).size(1), c->seq + 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
}

std::string WriteTokens(const std::string& name, const std::vector<uint16_t>& tokens) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return path;
}

TEST(OpenTokenFile, RoundTrip_WindowsOfTheFileDeterministicInStepAndIndex) {
  const GptConfig c = Tiny();
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 200;  // each window counts up mod 200
  const std::string path = WriteTokens("round_trip.bin", tokens);
  absl::StatusOr<std::unique_ptr<TokenSource>> source = OpenTokenFile(path, c.vocab, c.seq, 5);
  ASSERT_TRUE(source.ok()) << source.status();
  torch::Tensor batch = (*source)->Batch(2, 0, 8);
  ASSERT_EQ(batch.sizes(), (std::vector<int64_t>{8, c.seq + 1}));
  EXPECT_EQ(batch.scalar_type(), torch::kLong);
  torch::Tensor next = (batch.slice(1, 0, c.seq) + 1) % 200;
  EXPECT_TRUE(torch::equal(batch.slice(1, 1), next));
  EXPECT_TRUE((batch.select(1, 0) != batch[0][0]).any().item<bool>());  // rows start at different offsets

  absl::StatusOr<std::unique_ptr<TokenSource>> again = OpenTokenFile(path, c.vocab, c.seq, 5);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(torch::equal((*again)->Batch(2, 0, 8), batch));
  EXPECT_FALSE(torch::equal((*source)->Batch(2, 1, 8), batch));
  EXPECT_FALSE(torch::equal((*source)->Batch(3, 0, 8), batch));
}

TEST(OpenTokenFile, ExactlySeqPlusOneTokens_GivesTheWholeFile) {
  const GptConfig c = Tiny();
  std::vector<uint16_t> tokens(c.seq + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 255 - i;
  absl::StatusOr<std::unique_ptr<TokenSource>> source = OpenTokenFile(WriteTokens("exact.bin", tokens), c.vocab, c.seq, 5);
  ASSERT_TRUE(source.ok()) << source.status();
  torch::Tensor batch = (*source)->Batch(0, 0, 2);
  for (int64_t t = 0; t <= c.seq; ++t) EXPECT_EQ(batch[1][t].item<int64_t>(), 255 - t);
}

void ExpectInvalid(const absl::StatusOr<std::unique_ptr<TokenSource>>& source, const std::string& part) {
  ASSERT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
  EXPECT_NE(source.status().message().find(part), std::string::npos) << source.status();
}

TEST(OpenTokenFile, Missing_IsInvalidArgumentNamingIt) {
  const std::string path = ::testing::TempDir() + "/no_such_tokens.bin";
  ExpectInvalid(OpenTokenFile(path, 256, 32, 1), path);
}

TEST(OpenTokenFile, Directory_IsInvalidArgument) {
  ExpectInvalid(OpenTokenFile(::testing::TempDir(), 256, 32, 1), "not a regular file");
}

TEST(OpenTokenFile, FewerThanSeqPlusOneTokens_IsInvalidArgument) {
  const GptConfig c = Tiny();
  ExpectInvalid(OpenTokenFile(WriteTokens("short.bin", std::vector<uint16_t>(c.seq, 1)), c.vocab, c.seq, 1), "seq + 1 = 33");
  ExpectInvalid(OpenTokenFile(WriteTokens("empty.bin", {}), c.vocab, c.seq, 1), "seq + 1 = 33");
}

TEST(OpenTokenFile, OddSize_IsInvalidArgument) {
  const std::string path = WriteTokens("odd.bin", std::vector<uint16_t>(100, 1));
  std::ofstream(path, std::ios::binary | std::ios::app).put('\0');
  ExpectInvalid(OpenTokenFile(path, 256, 32, 1), "odd");
}

TEST(OpenTokenFile, TokenOutsideVocab_IsInvalidArgumentNamingIt) {
  std::vector<uint16_t> tokens(100, 1);
  tokens[42] = 300;
  ExpectInvalid(OpenTokenFile(WriteTokens("big_token.bin", tokens), 256, 32, 1), "token 300 at position 42");
}

// ----------------------------------------------------------------------------------------------------
// CUDA: skipped without a GPU.

TEST(GptStageCuda, Bf16Autocast_Fp32HiddenBf16LogitsCloseToFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  GptConfig c = Tiny();
  GptStage reference(c, 0, c.pipeline_layers(), 1);
  c.bf16_autocast = true;
  GptStage a(c, 0, 3, 1), b(c, 3, c.pipeline_layers(), 1);
  a->to(torch::kCUDA);
  b->to(torch::kCUDA);
  torch::Tensor tokens = Tokens(c, 4, 1);
  torch::Tensor hidden = a(tokens.cuda());
  EXPECT_EQ(hidden.scalar_type(), torch::kFloat32);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCUDA));  // the stage restored the state
  torch::Tensor logits = b(hidden);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  torch::Tensor expected = reference(tokens);
  const double diff = (logits.cpu().to(torch::kFloat32) - expected).abs().max().item<double>();
  EXPECT_LT(diff, 0.05 * expected.abs().max().item<double>() + 1e-2);

  // Training through bf16 autocast: gradients reach the fp32 parameters of both stages.
  torch::Tensor loss = LanguageModelLoss(logits, MakeSyntheticCorpus(c.vocab, c.seq, 1)->Batch(0, 0, 4).slice(1, 1));
  EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
  loss.backward();
  for (const auto& p : a->parameters()) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
  }
  EXPECT_TRUE(b->parameters()[0].grad().defined());
}

TEST(GptStageCuda, Bf16AutocastAfterOptimizerStep_UsesUpdatedWeights) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  GptConfig c = Tiny();
  c.bf16_autocast = true;
  GptStage model(c, 0, c.pipeline_layers(), 1);
  model->to(torch::kCUDA);
  torch::Tensor tokens = Tokens(c, 2, 1).cuda();
  torch::Tensor before = model(tokens).detach();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.mul_(2.0);
  }
  // A stale cache of bf16 weight copies would give the old logits again.
  EXPECT_FALSE(torch::equal(model(tokens).detach(), before));
}

// "flash" keeps cuDNN's attention out even where LibTorch would put it first (Hopper): it is switched
// off; any other choice puts LibTorch's setting back. No GPU needed: the switch is LibTorch's global.
TEST(SelectAttentionKernel, Flash_SwitchesCudnnOffAndTheOthersBackOn) {
  const bool initially = at::globalContext().userEnabledCuDNNSDP();
  ASSERT_TRUE(SelectAttentionKernel("flash").ok());
  EXPECT_FALSE(at::globalContext().userEnabledCuDNNSDP());
  ASSERT_TRUE(SelectAttentionKernel("cudnn").ok());
  EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), initially);
  ASSERT_TRUE(SelectAttentionKernel("flash").ok());
  ASSERT_TRUE(SelectAttentionKernel("torch").ok());
  EXPECT_EQ(at::globalContext().userEnabledCuDNNSDP(), initially);
  EXPECT_FALSE(SelectAttentionKernel("fa3").ok());
}

// The attention kernel choice takes effect (LibTorch picks the kernel named first for gpt-1.3b's
// attention shapes), and the kernels agree on a bf16 forward and backward within bf16 tolerance.
TEST(GptStageCuda, AttentionKernels_AreChosenAndAgree) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto bf16 = torch::TensorOptions().dtype(torch::kBFloat16).device(torch::kCUDA);
  torch::Tensor q = torch::randn({4, 16, 1024, 128}, bf16);
  auto chosen = [&] {
    return static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, q, q, {}, 0.0, /*is_causal=*/true));
  };
  ASSERT_TRUE(SelectAttentionKernel("flash").ok());
  EXPECT_EQ(chosen(), at::SDPBackend::flash_attention);
  ASSERT_TRUE(SelectAttentionKernel("cudnn").ok());
  EXPECT_EQ(chosen(), at::SDPBackend::cudnn_attention);
  EXPECT_EQ(SelectAttentionKernel("fa3").code(), absl::StatusCode::kInvalidArgument);

  GptConfig c = Tiny();
  c.bf16_autocast = true;
  c.heads = 2;  // head size 32
  c.seq = 128;
  torch::Tensor tokens = Tokens(c, 4, 1).cuda();
  auto run = [&](const std::string& kernel) {
    EXPECT_TRUE(SelectAttentionKernel(kernel).ok());
    GptStage model(c, 0, c.pipeline_layers(), 1);
    model->to(torch::kCUDA);
    torch::Tensor logits = model(tokens);
    LanguageModelLoss(logits, tokens).backward();
    return std::make_pair(logits.detach().to(torch::kFloat32), model->parameters()[1].grad().clone());
  };
  auto [flash_logits, flash_grad] = run("flash");
  auto [cudnn_logits, cudnn_grad] = run("cudnn");
  ASSERT_TRUE(SelectAttentionKernel("cudnn").ok());
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max()).item<double>();
  };
  EXPECT_LT(rel(cudnn_logits, flash_logits), 2e-2);
  EXPECT_LT(rel(cudnn_grad, flash_grad), 5e-2);
  EXPECT_GT(flash_grad.abs().max().item<double>(), 0);
}

// The fused kernel writes what autocast computes for a LayerNorm feeding a GEMM (ATen's fp32
// LayerNorm, then a cast to bf16): every element within a bf16 ulp, the mean and rstd ATen's backward
// takes, rows that do not fill a block, and a refusal of row lengths it does not take.
TEST(FusedKernelsCuda, LayerNormToBf16_MatchesLayerNormThenCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t cols : {128, 2048, 4096}) {
    SCOPED_TRACE(cols);
    const int64_t rows = 1001;
    torch::Tensor x = torch::randn({rows, cols}, f32) * 3 + 1;
    torch::Tensor gamma = torch::randn({cols}, f32), beta = torch::randn({cols}, f32);
    torch::Tensor y = torch::empty({rows, cols}, f32.dtype(torch::kBFloat16));
    torch::Tensor mean = torch::empty({rows}, f32), rstd = torch::empty({rows}, f32);
    ASSERT_EQ(LayerNormToBf16(x.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
                              reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), mean.data_ptr<float>(),
                              rstd.data_ptr<float>(), rows, cols, 1e-5f, at::cuda::getCurrentCUDAStream()),
              cudaSuccess);
    auto [ref, ref_mean, ref_rstd] = at::native_layer_norm(x, {cols}, gamma, beta, 1e-5);
    const torch::Tensor expected = ref.to(torch::kBFloat16).to(torch::kFloat32), got = y.to(torch::kFloat32);
    // A bf16 ulp is at most 2^-7 of the value: the fp32 results may round to neighbouring bf16 values.
    const torch::Tensor off = (got - expected).abs() > expected.abs() * std::ldexp(1.0, -7) + 1e-6;
    EXPECT_EQ(off.sum().item<int64_t>(), 0);
    EXPECT_LT((got - expected).ne(0).to(torch::kFloat32).mean().item<double>(), 0.01);
    EXPECT_TRUE(torch::allclose(mean, ref_mean.view({rows}), 1e-5, 1e-6));
    EXPECT_TRUE(torch::allclose(rstd, ref_rstd.view({rows}), 1e-5, 1e-6));
  }
  EXPECT_FALSE(LayerNormToBf16Supports(100));
  EXPECT_EQ(LayerNormToBf16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, 1e-5f, nullptr),
            cudaErrorInvalidValue);
  // A row start that is not 16-byte aligned (a view one element in) is refused, not read out of line.
  torch::Tensor x = torch::randn({4 * 128 + 1}, f32), g = torch::ones({128}, f32), b = torch::zeros({128}, f32);
  torch::Tensor y = torch::empty({4, 128}, f32.dtype(torch::kBFloat16)), stats = torch::empty({8}, f32);
  EXPECT_EQ(LayerNormToBf16(x.data_ptr<float>() + 1, g.data_ptr<float>(), b.data_ptr<float>(),
                            reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), stats.data_ptr<float>(),
                            stats.data_ptr<float>() + 4, 4, 128, 1e-5f, at::cuda::getCurrentCUDAStream()),
            cudaErrorInvalidValue);
}

// A stage with the fused LayerNorm trains as one without: the same logits and gradients within bf16
// tolerance.
TEST(GptStageCuda, FusedLayerNorm_MatchesUnfusedForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  GptConfig c = Tiny();
  c.bf16_autocast = true;
  c.hidden = 128;
  torch::Tensor tokens = Tokens(c, 4, 1).cuda();
  auto run = [&](bool fused) {
    c.fused_layernorm = fused;
    GptStage model(c, 0, c.pipeline_layers(), 1);
    model->to(torch::kCUDA);
    torch::Tensor logits = model(tokens);
    LanguageModelLoss(logits, tokens).backward();
    std::vector<torch::Tensor> grads;
    for (const auto& p : model->parameters()) grads.push_back(p.grad().clone());
    return std::make_pair(logits.detach().to(torch::kFloat32), grads);
  };
  auto [fused_logits, fused_grads] = run(true);
  auto [plain_logits, plain_grads] = run(false);
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
  };
  EXPECT_LT(rel(fused_logits, plain_logits), 2e-2);
  ASSERT_EQ(fused_grads.size(), plain_grads.size());
  for (size_t i = 0; i < fused_grads.size(); ++i) EXPECT_LT(rel(fused_grads[i], plain_grads[i]), 5e-2) << "parameter " << i;
}

// skip + x W^T + b as one GEMM (DenseImpl::ForwardResidual), cuBLASLt's and our CUTLASS kernel: the fp32
// sum of the bf16 product and the fp32 stream, so it is close to an fp32 reference with the bf16-rounded
// weight (closer than autocast's, which rounds the branch to bf16 first), its gradients are the
// reference's to bf16 rounding, skip's gradient is the output's exactly, and without autograd it gives
// the same output; with kCutlass on an sm_90 GPU that output is our kernel's, bit for bit (not
// cuBLASLt's fallback).
TEST(DenseCuda, ForwardResidual_MatchesFp32ReferenceAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device cuda(torch::kCUDA, 0);
  for (auto [rows, in, out, bias, gemm] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool, ResidualGemm>>{
           {66, 256, 384, true, ResidualGemm::kCublasLt},
           {1, 128, 128, true, ResidualGemm::kCublasLt},
           {1001, 512, 136, false, ResidualGemm::kCublasLt},
           {66, 256, 384, true, ResidualGemm::kCutlass},
           {1, 128, 128, true, ResidualGemm::kCutlass},
           {1001, 512, 136, false, ResidualGemm::kCutlass},
           {1000, 4104, 260, true, ResidualGemm::kCutlass},
           {4096, 2048, 2048, true, ResidualGemm::kCutlass}}) {
    SCOPED_TRACE(absl::StrCat(rows, " x ", in, " -> ", out, bias ? " with bias" : "",
                              gemm == ResidualGemm::kCutlass ? ", CUTLASS" : ", cuBLASLt"));
    torch::manual_seed(3);
    Dense d(in, out, bias, cuda);
    at::Generator gen = LayerGenerator(5, 0, cuda);
    d->InitWeight(0.05, gen);
    if (bias) {
      torch::NoGradGuard no_grad;
      d->bias.normal_(0.0, 0.1);
    }
    const torch::Tensor x = torch::randn({rows, in}, torch::TensorOptions().device(cuda)).to(torch::kBFloat16);
    const torch::Tensor skip0 = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
    const torch::Tensor g = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
    auto run = [&](ResidualGemm kind) {
      d->zero_grad();
      torch::Tensor xi = x.clone().requires_grad_(true), skip = skip0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        CudaBf16Autocast autocast;
        y = d->ForwardResidual(xi, skip, kind);
      }
      EXPECT_EQ(y.scalar_type(), torch::kFloat32);
      y.backward(g);
      std::vector<torch::Tensor> r = {y.detach(), xi.grad().to(torch::kFloat32), skip.grad(), d->weight.grad().clone()};
      if (bias) r.push_back(d->bias.grad().clone());
      return r;
    };
    const std::vector<torch::Tensor> fused = run(gemm), plain = run(ResidualGemm::kOff);
    // The fp32 reference, with the weight rounded to bf16 as the GEMM reads it.
    torch::Tensor xr = x.to(torch::kFloat32).requires_grad_(true);
    torch::Tensor wr = d->weight.detach().to(torch::kBFloat16).to(torch::kFloat32).requires_grad_(true);
    torch::Tensor br = bias ? d->bias.detach().clone().requires_grad_(true) : torch::zeros({out}, xr.options());
    torch::Tensor yr = skip0 + at::matmul(xr, wr.t()) + br;
    yr.backward(g);
    auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
      return ((a - b).abs().max() / b.abs().max().clamp_min(1e-12)).item<double>();
    };
    EXPECT_LT(rel(fused[0], yr.detach()), 1e-4) << "output against fp32";
    EXPECT_LT(rel(plain[0], yr.detach()), 1e-2) << "autocast's output against fp32";
    EXPECT_LT(rel(fused[1], xr.grad()), 1e-2) << "dx";
    EXPECT_TRUE(torch::equal(fused[2], g)) << "skip's gradient is the output's";
    EXPECT_LT(rel(fused[3], wr.grad()), 1e-2) << "dW";
    if (bias) EXPECT_LT(rel(fused[4], br.grad()), 1e-2) << "db";
    for (size_t i = 1; i < fused.size(); ++i) EXPECT_LT(rel(fused[i], plain[i]), 2e-2) << "gradient " << i << " vs autocast's";
    torch::Tensor no_grad_y;
    {
      torch::NoGradGuard no_grad;
      CudaBf16Autocast autocast;
      no_grad_y = d->ForwardResidual(x, skip0, gemm);
    }
    EXPECT_TRUE(torch::equal(no_grad_y, fused[0])) << "inference gives the training forward's output";
    if (gemm == ResidualGemm::kCutlass && GemmResidualAvailable()) {
      const torch::Tensor w = d->weight.detach().to(torch::kBFloat16);
      torch::Tensor direct = torch::empty_like(skip0);
      ASSERT_EQ(GemmResidualFp32(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                                 reinterpret_cast<const uint16_t*>(w.data_ptr<at::BFloat16>()),
                                 bias ? d->bias.data_ptr<float>() : nullptr, skip0.data_ptr<float>(),
                                 direct.data_ptr<float>(), rows, out, in, at::cuda::getCurrentCUDAStream()),
                cudaSuccess);
      EXPECT_TRUE(torch::equal(no_grad_y, direct)) << "the forward ran our CUTLASS kernel";
    }
  }
}

// Our CUTLASS residual GEMM takes the models' shapes itself (gpt-1.3b's proj and fc2, tinyllama-1.1b's
// down_proj without a bias, and a ragged one) and agrees with cuBLASLt's product to fp32 summation order.
TEST(DenseCuda, CutlassResidualGemm_TakesModelShapesAndAgreesWithCublasLt) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  if (!GemmResidualAvailable()) GTEST_SKIP() << "not an sm_90 GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kFloat32);
  for (auto [m, n, k, bias] : std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{
           {2048, 2048, 2048, true}, {2048, 2048, 8192, true}, {1024, 2048, 5632, false}, {77, 136, 512, true}}) {
    SCOPED_TRACE(absl::StrCat(m, " x ", k, " -> ", n, bias ? " with bias" : ""));
    const torch::Tensor x = torch::randn({m, k}, f32).to(torch::kBFloat16);
    const torch::Tensor w = (torch::randn({n, k}, f32) * 0.02).to(torch::kBFloat16);
    const torch::Tensor b = torch::randn({n}, f32) * 0.1, c = torch::randn({m, n}, f32);
    torch::Tensor ours = torch::full({m, n}, std::nan(""), f32), theirs = torch::empty({m, n}, f32);
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); };
    const float* bias_ptr = bias ? b.data_ptr<float>() : nullptr;
    ASSERT_EQ(GemmResidualFp32(bits(x), bits(w), bias_ptr, c.data_ptr<float>(), ours.data_ptr<float>(), m, n, k,
                               at::cuda::getCurrentCUDAStream()),
              cudaSuccess);
    ASSERT_EQ(LtLinearAddFp32(at::cuda::getCurrentCUDABlasLtHandle(), at::cuda::getCUDABlasLtWorkspace(),
                              at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream(), x.data_ptr(),
                              w.data_ptr(), bias_ptr, c.data_ptr<float>(), theirs.data_ptr<float>(), m, n, k),
              "");
    EXPECT_LT(((ours - theirs).abs().max() / theirs.abs().max()).item<double>(), 1e-5);
  }
}

// Layers of one shape share one algorithm timing (lt_gemm.h): the first of three Dense layers with their own
// biases may time the heuristic's algorithms, the other two reuse its choice, and each still adds its own bias.
TEST(DenseCuda, ForwardResidual_LayersOfOneShapeShareOneTiming) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const torch::Device cuda(torch::kCUDA, 0);
  const int64_t rows = 2048, in = 1536, out = 768;  // a shape no other test here uses
  std::vector<Dense> layers;
  for (int i = 0; i < 3; ++i) {
    layers.emplace_back(in, out, true, cuda);
    at::Generator gen = LayerGenerator(7, i, cuda);
    layers.back()->InitWeight(0.05, gen);
    torch::NoGradGuard no_grad;
    layers.back()->bias.fill_(static_cast<double>(i));
  }
  const torch::Tensor x = torch::randn({rows, in}, torch::TensorOptions().device(cuda)).to(torch::kBFloat16);
  const torch::Tensor skip = torch::randn({rows, out}, torch::TensorOptions().device(cuda));
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> ys;
  {
    CudaBf16Autocast autocast;
    const int64_t before = LtAlgorithmTimings();
    ys.push_back(layers[0]->ForwardResidual(x, skip, ResidualGemm::kCublasLt));
    const int64_t after_first = LtAlgorithmTimings();
    EXPECT_LE(after_first - before, 1);
    for (int i = 1; i < 3; ++i) ys.push_back(layers[i]->ForwardResidual(x, skip, ResidualGemm::kCublasLt));
    EXPECT_EQ(LtAlgorithmTimings(), after_first) << "a second layer of a known shape timed again";
  }
  for (int i = 0; i < 3; ++i) {  // the fp32 reference, outside autocast (which would round its product to bf16)
    torch::Tensor ref = skip + at::matmul(x.to(torch::kFloat32), layers[i]->weight.detach().to(torch::kBFloat16).to(torch::kFloat32).t()) +
                        static_cast<double>(i);
    EXPECT_LT(((ys[i] - ref).abs().max() / ref.abs().max()).item<double>(), 1e-4) << "layer " << i;
  }
}

// Parameters drawn on the device depend on (seed, layer) alone, as on the CPU: any split gives the
// whole model's, and they have the GPT's statistics.
TEST(GptStageCuda, InitOnDevice_SplitMatchesWholeWithGptStatistics) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  GptConfig c = Tiny();
  c.hidden = 256;
  const torch::Device cuda(torch::kCUDA, 0);
  const int n = c.pipeline_layers();
  GptStage whole(c, 0, n, 7, cuda), a(c, 0, 3, 7, cuda), b(c, 3, n, 7, cuda);
  ExpectSameParameters(Concat(a->parameters(), b->parameters()), whole->parameters());
  for (const auto& item : whole->named_parameters()) {
    const std::string& name = item.key();
    if (name.find("ln") != std::string::npos) continue;  // LayerNorms are made on the CPU; the stage moves them
    EXPECT_TRUE(item.value().is_cuda()) << name;
    if (name.find("qkv.weight") != std::string::npos || name.find("fc1.weight") != std::string::npos) {
      EXPECT_NEAR(item.value().std().item<double>(), 0.02, 0.001) << name;
    }
  }
}

TEST(FusedAdamWCuda, FewSteps_MatchesTorchAdamWOnCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  ExpectFusedAdamWMatchesTorch(torch::kCUDA);
}

// The reference model on one GPU, as the 1-GPU peer line of targets.md (GB=32 as 4 micro-batches of 8):
// parameter count, CPU init time, step time, peak memory. Minutes of work: run it by hand on the GPU host
// with --gtest_also_run_disabled_tests --gtest_filter='*Reference*'.
TEST(GptStageCuda, DISABLED_ReferenceModel_OneGpuStep) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  torch::set_num_threads(8);
  absl::StatusOr<GptConfig> c = Preset("gpt-1.3b");
  ASSERT_TRUE(c.ok());
  using Clock = std::chrono::steady_clock;
  auto seconds_since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  auto t0 = Clock::now();
  GptStage model(*c, 0, c->pipeline_layers(), 1);
  const double init_s = seconds_since(t0);
  EXPECT_EQ(CountParameters(*model), ExpectedParameters(*c));
  model->to(torch::kCUDA);
  FusedAdamW optimizer(model->parameters(), 1e-4);
  auto corpus = MakeSyntheticCorpus(c->vocab, c->seq, 1);
  torch::Tensor loss_sum = torch::zeros({}, torch::kCUDA);  // no .item() per micro-batch: it would stall
  auto step = [&](int64_t s) {
    for (int64_t m = 0; m < 4; ++m) {
      // Pinned and non-blocking: a blocking copy would synchronise and expose the kernel launches.
      torch::Tensor batch = corpus->Batch(s, m, 8).pin_memory().to(torch::TensorOptions(torch::kCUDA), true);
      torch::Tensor l = LanguageModelLoss(model(batch.slice(1, 0, c->seq)), batch.slice(1, 1)) / 4;
      l.backward();
      loss_sum += l.detach();
    }
    optimizer.Step();
    optimizer.ZeroGrad();
  };
  for (int s = 0; s < 3; ++s) step(s);
  torch::cuda::synchronize();
  loss_sum.zero_();
  c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  t0 = Clock::now();
  for (int s = 3; s < 11; ++s) step(s);
  torch::cuda::synchronize();
  const double step_s = seconds_since(t0) / 8;
  const double peak_gib = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[0].peak / 1073741824.0;
  std::cout << "gpt-1.3b: " << CountParameters(*model) << " parameters, CPU init " << init_s << " s, step "
            << step_s << " s (" << 32 * c->seq / step_s << " tokens/s), mean loss " << loss_sum.item<double>() / 8
            << ", peak allocated " << peak_gib << " GiB\n";
}

// The model options that turn the fused mechanisms off: unset is on, "false" is off.
TEST(GptConfig, ModelOptions_FalseTurnsFusedMechanismsOff) {
  ModelSpec spec;
  GptConfig on = GptConfigFromSpec(spec);
  EXPECT_TRUE(on.fused_norm_backward);
  EXPECT_TRUE(on.fused_cross_entropy);
  (*spec.mutable_options())["fused_norm_backward"] = "false";
  (*spec.mutable_options())["fused_cross_entropy"] = "false";
  GptConfig off = GptConfigFromSpec(spec);
  EXPECT_FALSE(off.fused_norm_backward);
  EXPECT_FALSE(off.fused_cross_entropy);
  EXPECT_TRUE(off.fused_qkv_grad);
}

// On the CPU (and for fp32 logits) the fused loss is the plain one, gradients included.
TEST(FusedLoss, Cpu_IsLanguageModelLoss) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({2, 5, 11}, torch::requires_grad());
  torch::Tensor targets = torch::randint(0, 11, {2, 5}, torch::kInt64);
  torch::Tensor a = FusedLanguageModelLoss(logits, targets);
  torch::Tensor ga = torch::autograd::grad({a}, {logits})[0];
  torch::Tensor b = LanguageModelLoss(logits, targets);
  torch::Tensor gb = torch::autograd::grad({b}, {logits})[0];
  EXPECT_EQ(a.item<float>(), b.item<float>());
  EXPECT_TRUE(torch::equal(ga, gb));
}

// The fused norm backward (LayerNorm and RMSNorm) from a bf16 gradient against ATen's backward of the
// upcast gradient (LayerNorm) and the formula in double (RMSNorm): fp32 arithmetic in another order,
// so within 1e-4 relative; rows that do not fill a block or the grid; row lengths it refuses.
TEST(FusedKernelsCuda, NormBackward_MatchesAten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  auto rel = [](const torch::Tensor& a, const torch::Tensor& b) {
    return ((a.to(torch::kFloat64) - b.to(torch::kFloat64)).norm() / b.to(torch::kFloat64).norm()).item<double>();
  };
  // Every row-length shape of the kernel (threads per row 16 .. 512: rows per block 64 .. 2), rows that
  // fill a block, leave one part-full, outnumber the blocks, and leave the last sweep part-full.
  for (int64_t cols : {128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096}) {
    for (int64_t rows : {1, 3, 1001, 8192, 8197}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      torch::Tensor x = torch::randn({rows, cols}, f32) * 3 + 1;
      torch::Tensor gamma = torch::randn({cols}, f32), beta = torch::randn({cols}, f32);
      torch::Tensor dy = torch::randn({rows, cols}, f32).to(torch::kBFloat16);
      auto [y, mean, rstd] = at::native_layer_norm(x, {cols}, gamma, beta, 1e-5);
      std::vector<torch::Tensor> got = NormBackwardFromBf16(dy, x, gamma, mean, rstd);
      ASSERT_EQ(got.size(), 3u);
      auto [dx, dgamma, dbeta] =
          at::native_layer_norm_backward(dy.to(torch::kFloat32), x, {cols}, mean, rstd, gamma, beta, {true, true, true});
      EXPECT_LT(rel(got[0], dx), 1e-4);
      EXPECT_LT(rel(got[1], dgamma), 1e-4);
      EXPECT_LT(rel(got[2], dbeta), 1e-4);
      EXPECT_TRUE(got[0].isfinite().all().item<bool>());
      // The residual stream's gradient added in the same pass.
      const torch::Tensor skip = torch::randn({rows, cols}, f32);
      std::vector<torch::Tensor> with_skip = NormBackwardFromBf16(dy, x, gamma, mean, rstd, skip);
      ASSERT_EQ(with_skip.size(), 3u);
      EXPECT_LT(rel(with_skip[0], dx + skip), 1e-4);
      EXPECT_TRUE(torch::equal(with_skip[1], got[1])) << "deterministic dgamma";
      EXPECT_TRUE(torch::equal(with_skip[2], got[2])) << "deterministic dbeta";
      EXPECT_LE(NormBackwardPartials(rows, cols), rows) << "no more partial rows than rows";

      // RMSNorm: y = x rstd w.
      const torch::Tensor xd = x.to(torch::kFloat64), dyd = dy.to(torch::kFloat64), wd = gamma.to(torch::kFloat64);
      const torch::Tensor rstd_d = torch::rsqrt(xd.pow(2).mean(-1, true) + 1e-5);
      const torch::Tensor g = dyd * wd;
      const torch::Tensor dx_ref = rstd_d * g - xd * rstd_d.pow(3) * (g * xd).mean(-1, true);
      const torch::Tensor dw_ref = (dyd * xd * rstd_d).sum(0);
      std::vector<torch::Tensor> rms =
          NormBackwardFromBf16(dy, x, gamma, torch::Tensor(), rstd_d.to(torch::kFloat32).contiguous());
      ASSERT_EQ(rms.size(), 3u);
      EXPECT_LT(rel(rms[0], dx_ref), 1e-4);
      EXPECT_LT(rel(rms[1], dw_ref), 1e-4);
      EXPECT_FALSE(rms[2].defined());
    }
  }
  // What the kernel does not take comes back empty, for the caller's own backward.
  torch::Tensor x = torch::randn({4, 100}, f32), w = torch::ones({100}, f32), r = torch::ones({4, 1}, f32);
  EXPECT_TRUE(NormBackwardFromBf16(x.to(torch::kBFloat16), x, w, torch::Tensor(), r).empty());
  torch::Tensor x2 = torch::randn({4, 128}, f32), w2 = torch::ones({128}, f32);
  EXPECT_TRUE(NormBackwardFromBf16(x2, x2, w2, torch::Tensor(), r).empty());  // an fp32 gradient
  EXPECT_EQ(NormBackward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 4, 100, nullptr),
            cudaErrorInvalidValue);
}

// The fused cross-entropy against torch's on the upcast logits: the loss within 1e-5 relative, the
// gradient (of 0.25 x the loss, so the incoming gradient counts) within a bf16 rounding of torch's fp32
// one, ignored targets (-100) out of the mean; vocabularies of 8k (vectors) and not (one at a time).
TEST(FusedKernelsCuda, CrossEntropy_MatchesTorchsOnUpcastLogits) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t vocab : {32768, 32000, 1001}) {
    SCOPED_TRACE(vocab);
    const int64_t b = 3, s = 67;
    torch::Tensor base = (torch::randn({b, s, vocab}, cuda) * 4).to(torch::kBFloat16);
    torch::Tensor targets = torch::randint(0, vocab, {b, s}, cuda.dtype(torch::kInt64));
    targets.index_put_({0, torch::indexing::Slice(0, 5)}, -100);
    torch::Tensor fused_in = base.clone().requires_grad_(true), ref_in = base.clone().requires_grad_(true);
    torch::Tensor loss = FusedLanguageModelLoss(fused_in, targets);
    torch::Tensor ref = LanguageModelLoss(ref_in, targets);
    EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5 * std::abs(ref.item<double>()));
    (loss * 0.25).backward();
    // The reference gradient in fp32 (the cast's backward would round it to bf16).
    torch::Tensor ref_f32 = base.to(torch::kFloat32).requires_grad_(true);
    (LanguageModelLoss(ref_f32, targets) * 0.25).backward();
    const torch::Tensor got = fused_in.grad().to(torch::kFloat32), want = ref_f32.grad();
    ASSERT_EQ(fused_in.grad().scalar_type(), torch::kBFloat16);
    const torch::Tensor off = (got - want).abs() > want.abs() * std::ldexp(1.0, -7) + 1e-9;
    EXPECT_EQ(off.sum().item<int64_t>(), 0);
    EXPECT_EQ(got.index({0, torch::indexing::Slice(0, 5)}).abs().max().item<float>(), 0.f);  // ignored rows
  }
}

// When an inference stage keeps only bf16 weights: inference on CUDA under autocast, no saved
// parameters, the option not "false".
TEST(LowersDenseWeights, OnlyForInferenceUnderAutocastOnCuda) {
  JobSpec job;
  job.mutable_pipeline()->set_inference(true);
  const torch::Device cuda(torch::kCUDA, 0), cpu(torch::kCPU);
  EXPECT_TRUE(LowersDenseWeights(job, cuda, true));
  EXPECT_FALSE(LowersDenseWeights(job, cpu, true));
  EXPECT_FALSE(LowersDenseWeights(job, cuda, false));
  JobSpec saves = job;
  saves.set_save_params(true);
  EXPECT_FALSE(LowersDenseWeights(saves, cuda, true));
  JobSpec off = job;
  (*off.mutable_model_spec()->mutable_options())["inference_bf16_weights"] = "false";
  EXPECT_FALSE(LowersDenseWeights(off, cuda, true));
  JobSpec training = job;
  training.mutable_pipeline()->set_inference(false);
  EXPECT_FALSE(LowersDenseWeights(training, cuda, true));
}

// The lowered weights give the very logits the fp32 ones did (the forward cast them to bf16 anyway),
// and every linear layer's weight is bf16 afterwards.
TEST(GptStageCuda, LowerDenseWeights_SameLogitsInBf16) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  GptConfig c = Tiny();
  c.bf16_autocast = true;
  c.hidden = 128;
  torch::Tensor tokens = Tokens(c, 4, 1).cuda();
  GptStage model(c, 0, c.pipeline_layers(), 1);
  model->to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const torch::Tensor before = model(tokens).clone();
  LowerDenseWeights(*model, at::kBFloat16);
  const torch::Tensor after = model(tokens);
  EXPECT_TRUE(torch::equal(before, after));
  int lowered = 0;
  for (const auto& item : model->named_parameters()) {
    const bool dense = item.key().find("ln") == std::string::npos && item.key().find("layers.0.") != 0;
    if (dense) {
      EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
      ++lowered;
    }
  }
  EXPECT_GT(lowered, 0);
}


// gelu(fc(x)) and its gradients (x, weight, bias) by plain autograd over at::linear and at::gelu, in fp32.
struct GeluReference {
  torch::Tensor y, dx, dw, db;
};
GeluReference LinearGeluReference(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b,
                                  const torch::Tensor& dy) {
  torch::Tensor xr = x.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor wr = w.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor br = b.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor y = at::gelu(at::linear(xr, wr, br));
  y.backward(dy.to(torch::kFloat32));
  return {y.detach(), xr.grad(), wr.grad(), br.grad()};
}

double MaxRel(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kFloat32) - b.to(torch::kFloat32)).abs().max() / b.to(torch::kFloat32).abs().max().clamp_min(1e-12))
      .item<double>();
}

// On the CPU (fp32) ForwardGelu's own autograd function runs (the ATen fallback inside it): the same
// output and gradients as autograd over at::gelu(at::linear), for batched inputs.
TEST(DenseForwardGelu, Cpu_MatchesAutogradOfGeluOfLinear) {
  torch::manual_seed(3);
  Dense fc(24, 40, true);
  at::Generator gen = LayerGenerator(1, 1);
  fc->InitWeight(0.3, gen);
  {
    torch::NoGradGuard no_grad;
    fc->bias.normal_(0.0, 0.5, gen);
  }
  torch::Tensor x = torch::randn({3, 5, 24}).requires_grad_(true);
  torch::Tensor dy = torch::randn({3, 5, 40});
  const GeluReference ref = LinearGeluReference(x, fc->weight, fc->bias, dy);
  torch::Tensor y = fc->ForwardGelu(x, /*fused=*/true);
  ASSERT_EQ(y.sizes(), ref.y.sizes());
  EXPECT_TRUE(torch::allclose(y, ref.y, 1e-5, 1e-6));
  y.backward(dy);
  EXPECT_TRUE(torch::allclose(x.grad(), ref.dx, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->weight.grad(), ref.dw, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->bias.grad(), ref.db, 1e-4, 1e-6));
  // Without grad the same values (the forward-only path), and unfused the same too.
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::allclose(fc->ForwardGelu(x, true), ref.y, 1e-5, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->ForwardGelu(x, false), ref.y, 1e-5, 1e-6));
}

// Under DeferWeightGrads the weight's gradient goes to the queue as (weight, dh, x) and reaches .grad only
// at Apply; the input's and the bias's arrive at once.
TEST(DenseForwardGelu, Cpu_DeferredWeightGradIsQueuedUntilApply) {
  torch::manual_seed(4);
  Dense fc(16, 32, true);
  at::Generator gen = LayerGenerator(2, 1);
  fc->InitWeight(0.3, gen);
  torch::Tensor x = torch::randn({2, 7, 16}).requires_grad_(true);
  torch::Tensor dy = torch::randn({2, 7, 32});
  const GeluReference ref = LinearGeluReference(x, fc->weight, fc->bias, dy);
  WeightGradQueue queue;
  {
    DeferWeightGrads route(&queue);
    fc->ForwardGelu(x, true).backward(dy);
  }
  EXPECT_FALSE(fc->weight.grad().defined());
  ASSERT_EQ(queue.size(), 1u);
  EXPECT_TRUE(torch::allclose(x.grad(), ref.dx, 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(fc->bias.grad(), ref.db, 1e-4, 1e-6));
  queue.Apply();
  ASSERT_TRUE(fc->weight.grad().defined());
  EXPECT_TRUE(torch::allclose(fc->weight.grad(), ref.dw, 1e-4, 1e-6));
}

// The model option turns the fused path off, and only that one.
TEST(GptConfigFromSpec, FusedGeluOptions) {
  ModelSpec spec;
  EXPECT_TRUE(GptConfigFromSpec(spec).fused_gelu);
  EXPECT_TRUE(GptConfigFromSpec(spec).fused_gelu_gemm);
  (*spec.mutable_options())["fused_gelu"] = "false";
  EXPECT_FALSE(GptConfigFromSpec(spec).fused_gelu);
  EXPECT_TRUE(GptConfigFromSpec(spec).fused_gelu_gemm);
  (*spec.mutable_options())["fused_gelu_gemm"] = "false";
  EXPECT_FALSE(GptConfigFromSpec(spec).fused_gelu_gemm);
}

// The fused forward and backward under bf16 autocast against fp32 autograd of linear + gelu, on
// gpt-1.3b's training shape (8 x 1024 tokens, 2048 -> 8192) and odd ones (rows not a multiple of a tile;
// a width the kernels do not take, which falls back): the fused path's error is no worse than the ATen
// bf16 path's (fused_gelu=false) and small in itself.
TEST(DenseForwardGeluCuda, RealAndOddShapes_MatchFp32AutogradAsWellAsAten) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  struct Shape {
    int64_t b, s, in, out;
  };
  for (const Shape& sh : {Shape{8, 1024, 2048, 8192}, Shape{3, 37, 72, 200}, Shape{1, 5, 64, 104}, Shape{2, 9, 36, 50}}) {
    SCOPED_TRACE(absl::StrCat(sh.b, "x", sh.s, " ", sh.in, "->", sh.out));
    torch::manual_seed(5);
    Dense fc(sh.in, sh.out, true, torch::kCUDA);
    at::Generator gen = LayerGenerator(3, 1, torch::kCUDA);
    fc->InitWeight(0.02, gen);
    {
      torch::NoGradGuard no_grad;
      fc->bias.normal_(0.0, 0.5, gen);
    }
    torch::Tensor x0 = torch::randn({sh.b, sh.s, sh.in}, torch::kCUDA).to(torch::kBFloat16).to(torch::kFloat32);
    torch::Tensor dy = (torch::randn({sh.b, sh.s, sh.out}, torch::kCUDA) * 1e-2).to(torch::kBFloat16);
    const GeluReference ref = LinearGeluReference(x0, fc->weight.to(torch::kBFloat16), fc->bias.to(torch::kBFloat16), dy);
    auto run = [&](bool fused) {
      fc->weight.mutable_grad().reset();
      fc->bias.mutable_grad().reset();
      torch::Tensor x = x0.clone().requires_grad_(true);
      torch::Tensor y;
      {
        CudaBf16Autocast autocast;
        y = fc->ForwardGelu(x, fused);
      }
      EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
      y.backward(dy);
      torch::Tensor y_nograd;
      {
        torch::NoGradGuard no_grad;
        CudaBf16Autocast autocast;
        y_nograd = fc->ForwardGelu(x0, fused);
      }
      // The forward-only kernel (no pre-activation output) has another cluster shape: the same sums, a
      // bf16 rounding apart at most.
      EXPECT_TRUE(torch::allclose(y_nograd, y.detach(), 8e-3, 1e-3)) << "the forward-only path's output";
      return GeluReference{y.detach(), x.grad(), fc->weight.grad().clone(), fc->bias.grad().clone()};
    };
    const GeluReference fused = run(true), aten = run(false);
    const double tol[] = {1e-2, 2e-2, 2e-2, 2e-2};
    const torch::Tensor* f[] = {&fused.y, &fused.dx, &fused.dw, &fused.db};
    const torch::Tensor* a[] = {&aten.y, &aten.dx, &aten.dw, &aten.db};
    const torch::Tensor* r[] = {&ref.y, &ref.dx, &ref.dw, &ref.db};
    const char* names[] = {"y", "dx", "dweight", "dbias"};
    for (int i = 0; i < 4; ++i) {
      const double ef = MaxRel(*f[i], *r[i]), ea = MaxRel(*a[i], *r[i]);
      EXPECT_LT(ef, tol[i]) << names[i] << " (ATen's bf16 path: " << ea << ")";
      EXPECT_LE(ef, 2 * ea + 1e-3) << names[i];
    }
  }
}

// The kernels themselves on an sm_90 GPU: the one-GEMM forward writes gelu(h) and h as cuBLAS + ATen
// do (to a bf16 rounding), refuses what it does not take; the fused backward is deterministic and
// matches ATen's gelu_backward and the fp32 column sums.
TEST(GemmGeluCuda, KernelsMatchAtenAndRefuseWhatTheyDoNotTake) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  auto o = torch::TensorOptions().device(torch::kCUDA).dtype(torch::kBFloat16);
  auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  torch::manual_seed(6);
  if (GemmGeluAvailable()) {
    for (int64_t m : {8192, 300, 1}) {
      const int64_t n = 8192 / (m == 8192 ? 1 : 32), k = 2048 / (m == 8192 ? 1 : 16);
      torch::Tensor x = torch::randn({m, k}, o), w = torch::randn({n, k}, o) * 0.05, b = torch::randn({n}, o);
      torch::Tensor h_ref = at::linear(x.to(torch::kFloat32), w.to(torch::kFloat32), b.to(torch::kFloat32));
      torch::Tensor a_ref = at::gelu(h_ref);
      torch::Tensor a = torch::empty({m, n}, o), h = torch::empty({m, n}, o), a2 = torch::empty({m, n}, o);
      ASSERT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a), bits(h), m, n, k, stream), cudaSuccess);
      ASSERT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a2), nullptr, m, n, k, stream), cudaSuccess);
      // bf16 rounding of the outputs (2^-8 relative) plus the fp32 sum's order.
      EXPECT_TRUE(torch::allclose(h.to(torch::kFloat32), h_ref, 8e-3, 1e-2)) << m;
      EXPECT_TRUE(torch::allclose(a.to(torch::kFloat32), a_ref, 8e-3, 1e-2)) << m;
      EXPECT_TRUE(torch::allclose(a, a2, 8e-3, 1e-3)) << "with and without the pre-activation output";
      std::cerr << "m=" << m << ": with and without h bitwise equal: " << torch::equal(a, a2) << "\n";
    }
    torch::Tensor x = torch::randn({16, 36}, o), w = torch::randn({64, 36}, o), b = torch::randn({64}, o);
    torch::Tensor a = torch::empty({16, 64}, o);
    EXPECT_EQ(GemmBiasGelu(bits(x), bits(w), bits(b), bits(a), nullptr, 16, 64, 36, stream), cudaErrorInvalidValue)
        << "k not a multiple of 8";
  } else {
    std::cerr << "not sm_90: GemmBiasGelu not tested\n";
  }
  // The real shape, rows that leave parts and a block's batch of loads part-full, a last column chunk
  // of one thread; h with values outside the kernel's gelu' table (zeros, tiny, large).
  struct Shape {
    int64_t rows, cols;
  };
  for (const Shape& sh : {Shape{8192, 8192}, Shape{129, 264}, Shape{3, 264}, Shape{1001, 8192}, Shape{300, 2056},
                          Shape{1, 8}, Shape{8197, 3072}}) {
    const int64_t rows = sh.rows, cols = sh.cols;
    SCOPED_TRACE(testing::Message() << rows << " x " << cols);
    torch::Tensor da = torch::randn({rows, cols}, o) * 1e-2, h = torch::randn({rows, cols}, o) * 2;
    {
      torch::Tensor flat = h.view({-1});
      const int64_t n = flat.numel();
      const std::vector<float> special = {0.f, -0.f, 1e-5f, -3e-6f, 2.4e-4f, 15.9f, -15.9f, 16.f, -16.f,
                                          40.f, -40.f, 300.f, -7e4f, 3e38f};
      for (size_t i = 0; i < special.size() && static_cast<int64_t>(i) * 7 < n; ++i) flat[i * 7].fill_(special[i]);
    }
    torch::Tensor dh = torch::empty_like(h), dh2 = torch::empty_like(h);
    const int64_t parts = GeluBackwardPartials(rows);
    torch::Tensor p = torch::empty({parts, cols}, o.dtype(torch::kFloat32)), p2 = torch::empty_like(p);
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh), p.data_ptr<float>(), rows, cols, stream), cudaSuccess);
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh2), p2.data_ptr<float>(), rows, cols, stream), cudaSuccess);
    EXPECT_TRUE(torch::equal(dh, dh2) && torch::equal(p, p2)) << "deterministic";
    torch::Tensor ref = at::gelu_backward(da.to(torch::kFloat32), h.to(torch::kFloat32));
    EXPECT_TRUE(torch::allclose(dh.to(torch::kFloat32), ref, 8e-3, 1e-6)) << rows;
    EXPECT_TRUE(torch::allclose(p.sum(0), ref.sum(0), 1e-4, 1e-4)) << rows;
    // The same fp32 math as ATen's: its bf16 result, but for the rare rounding where the two builds'
    // erff or expf differ in the last fp32 bit.
    const int64_t differ = dh.ne(ref.to(torch::kBFloat16)).sum().item<int64_t>();
    std::cerr << rows << " x " << cols << ": " << differ << " of " << dh.numel() << " dh differ from ATen's bf16\n";
    EXPECT_LE(differ, dh.numel() / 10000) << rows;
  }
  // Every finite bf16 value of h (da = 1): dh is gelu'(h) rounded, table or not.
  {
    torch::Tensor all = torch::arange(0, 65536, torch::TensorOptions().dtype(torch::kInt32)).to(torch::kInt16);
    torch::Tensor h = all.view(torch::kBFloat16).to(torch::kCUDA).view({256, 256});
    h = torch::where(h.isfinite(), h, torch::zeros_like(h)).contiguous();
    torch::Tensor da = torch::ones_like(h), dh = torch::empty_like(h);
    torch::Tensor p = torch::empty({GeluBackwardPartials(256), 256}, o.dtype(torch::kFloat32));
    ASSERT_EQ(GeluBackwardBias(bits(da), bits(h), bits(dh), p.data_ptr<float>(), 256, 256, stream), cudaSuccess);
    torch::Tensor ref = at::gelu_backward(da.to(torch::kFloat32), h.to(torch::kFloat32)).to(torch::kBFloat16);
    const int64_t differ = dh.ne(ref).sum().item<int64_t>();
    std::cerr << "every bf16 h: " << differ << " of 65536 differ from ATen's\n";
    EXPECT_LE(differ, 16);
    EXPECT_TRUE(torch::allclose(dh.to(torch::kFloat32), ref.to(torch::kFloat32), 8e-3, 1e-30));
  }
  torch::Tensor t = torch::zeros({4, 12}, o);
  float partial[12];
  EXPECT_EQ(GeluBackwardBias(bits(t), bits(t), bits(t), partial, 4, 12, stream), cudaErrorInvalidValue)
      << "cols not a multiple of 8";
}

}  // namespace
}  // namespace stagehand
