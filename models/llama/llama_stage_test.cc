// Tests of the Llama stages on the CPU with llama-tiny: sizes, partitions, an independent plain-ATen
// forward, causality, gradients, training, input checks, Hugging Face names. The CUDA tests (bf16
// autocast against fp32, the fused RMSNorm kernel against ATen's) skip themselves without a GPU.
#include "models/llama/llama_stage.h"

#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/data.h"
#include "engine/split_backward_check.h"
#include "engine/stage.h"
#include "kernels/fused_elementwise_kernels.h"
#include "kernels/fused_kernels.h"
#include "models/llama/llama_description.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

// Tiny tensors: intra-op threads cost more than they give, and on a loaded 2-core machine OpenMP's
// spinning threads make the tests many times slower.
class OneThread : public ::testing::Environment {
 public:
  void SetUp() override { torch::set_num_threads(1); }
};
::testing::Environment* const kOneThread = ::testing::AddGlobalTestEnvironment(new OneThread);

constexpr uint64_t kSeed = 7;

JobSpec TinyJob() {
  absl::StatusOr<ModelSpec> spec = LlamaDescription().Resolve("llama-tiny", ModelSpec());
  EXPECT_TRUE(spec.ok()) << spec.status();
  JobSpec job;
  job.set_device("cpu");
  *job.mutable_model_spec() = *spec;
  return job;
}

int NumLayers(const JobSpec& job) { return LlamaConfigFromSpec(job.model_spec()).pipeline_layers(); }

std::unique_ptr<Stage> MakeStage(const JobSpec& job, int first, int last) {
  StageOptions o;
  o.job = &job;
  o.first_layer = first;
  o.last_layer = last;
  o.num_layers = NumLayers(job);
  o.seed = kSeed;
  absl::StatusOr<std::unique_ptr<Stage>> stage = MakeLlamaFamily()->MakeStage(o);
  EXPECT_TRUE(stage.ok()) << stage.status();
  return stage.ok() ? std::move(*stage) : nullptr;
}

torch::Tensor Tokens(const ModelSpec& m, int64_t batch, uint64_t seed) {
  return MakeSyntheticCorpus(m.vocab(), m.seq(), seed)->Batch(0, 0, batch).slice(1, 0, m.seq());
}

// Runs stages one after the other, as a pipeline would, without gradients.
torch::Tensor RunStages(const std::vector<std::unique_ptr<Stage>>& stages, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  torch::Tensor x = tokens;
  for (const auto& s : stages) x = s->Forward(x);
  return x;
}

std::map<std::string, torch::Tensor> ByName(Stage& stage) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, p] : stage.NamedParameters()) out[name] = p;
  return out;
}

double MaxRelativeError(const torch::Tensor& got, const torch::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

// ----------------------------------------------------------------------------------------------------
// An independent Llama forward in plain ATen ops, from the parameters by Hugging Face name: explicit
// matmuls, RoPE with rotate_half, keys and values repeated per group, softmax attention with a causal
// mask.

torch::Tensor RefRmsNorm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  return x / torch::sqrt((x * x).mean(-1, true) + eps) * w;
}

// x [B, heads, S, d]; inv_freq_i = theta^(-2i/d); element j pairs with element j + d/2.
torch::Tensor RefRope(const torch::Tensor& x, double theta) {
  const int64_t s = x.size(2), d = x.size(3), half = d / 2;
  std::vector<float> angles(s * half);
  for (int64_t pos = 0; pos < s; ++pos) {
    for (int64_t i = 0; i < half; ++i) angles[pos * half + i] = pos / std::pow(theta, 2.0 * i / d);
  }
  torch::Tensor a = torch::tensor(angles).view({s, half});
  torch::Tensor cos = torch::cat({a.cos(), a.cos()}, -1), sin = torch::cat({a.sin(), a.sin()}, -1);
  torch::Tensor x1 = x.slice(-1, 0, half), x2 = x.slice(-1, half, d);
  return x * cos + torch::cat({-x2, x1}, -1) * sin;
}

torch::Tensor RefAttention(const torch::Tensor& n, std::map<std::string, torch::Tensor>& p, const std::string& pre,
                           const ModelSpec& m) {
  const int64_t b = n.size(0), s = n.size(1), d = m.hidden() / m.heads(), group = m.heads() / m.kv_heads();
  auto split = [&](const torch::Tensor& y, int64_t h) { return y.view({b, s, h, d}).permute({0, 2, 1, 3}); };
  torch::Tensor q = RefRope(split(torch::matmul(n, p[pre + "self_attn.q_proj.weight"].t()), m.heads()), m.rope_theta());
  torch::Tensor k =
      RefRope(split(torch::matmul(n, p[pre + "self_attn.k_proj.weight"].t()), m.kv_heads()), m.rope_theta());
  torch::Tensor v = split(torch::matmul(n, p[pre + "self_attn.v_proj.weight"].t()), m.kv_heads());
  k = k.repeat_interleave(group, 1);  // query head j reads key/value head j / group
  v = v.repeat_interleave(group, 1);
  torch::Tensor scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d));
  torch::Tensor future = torch::ones({s, s}, torch::kBool).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  torch::Tensor att = torch::matmul(torch::softmax(scores, -1), v).permute({0, 2, 1, 3}).reshape({b, s, m.hidden()});
  return torch::matmul(att, p[pre + "self_attn.o_proj.weight"].t());
}

torch::Tensor ReferenceLogits(std::map<std::string, torch::Tensor> p, const ModelSpec& m, const torch::Tensor& tokens) {
  torch::NoGradGuard no_grad;
  const double eps = m.norm_eps();
  torch::Tensor x = p["model.embed_tokens.weight"]
                        .index_select(0, tokens.reshape({-1}))
                        .view({tokens.size(0), tokens.size(1), m.hidden()});
  for (int64_t i = 0; i < m.layers(); ++i) {
    const std::string pre = absl::StrCat("model.layers.", i, ".");
    x = x + RefAttention(RefRmsNorm(x, p[pre + "input_layernorm.weight"], eps), p, pre, m);
    torch::Tensor n = RefRmsNorm(x, p[pre + "post_attention_layernorm.weight"], eps);
    torch::Tensor gate = torch::matmul(n, p[pre + "mlp.gate_proj.weight"].t());
    torch::Tensor up = torch::matmul(n, p[pre + "mlp.up_proj.weight"].t());
    x = x + torch::matmul(gate * torch::sigmoid(gate) * up, p[pre + "mlp.down_proj.weight"].t());
  }
  return torch::matmul(RefRmsNorm(x, p["model.norm.weight"], eps), p["lm_head.weight"].t());
}

// ----------------------------------------------------------------------------------------------------

TEST(LlamaStage, ParameterCount_Tiny_MatchesDescription) {
  const JobSpec job = TinyJob();
  std::unique_ptr<Stage> whole = MakeStage(job, 0, NumLayers(job));
  int64_t n = 0;
  for (const torch::Tensor& p : whole->Parameters()) n += p.numel();
  EXPECT_EQ(n, LlamaDescription().ParameterCount(job.model_spec()));
  LlamaStage module(LlamaConfigFromSpec(job.model_spec()), 0, NumLayers(job), kSeed);
  int64_t m = 0;
  for (const torch::Tensor& p : module->parameters()) m += p.numel();
  EXPECT_EQ(m, n);
}

TEST(LlamaStage, NamedParameters_WholeModel_AreHuggingFaceNames) {
  const JobSpec job = TinyJob();
  const ModelSpec& m = job.model_spec();
  std::unique_ptr<Stage> whole = MakeStage(job, 0, NumLayers(job));
  const int64_t h = m.hidden(), kv = m.kv_heads() * (m.hidden() / m.heads()), f = m.ffn_hidden();
  std::vector<std::pair<std::string, std::vector<int64_t>>> want = {{"model.embed_tokens.weight", {m.vocab(), h}}};
  for (int64_t i = 0; i < m.layers(); ++i) {
    const std::string pre = absl::StrCat("model.layers.", i, ".");
    want.push_back({pre + "input_layernorm.weight", {h}});
    want.push_back({pre + "self_attn.q_proj.weight", {h, h}});
    want.push_back({pre + "self_attn.k_proj.weight", {kv, h}});
    want.push_back({pre + "self_attn.v_proj.weight", {kv, h}});
    want.push_back({pre + "self_attn.o_proj.weight", {h, h}});
    want.push_back({pre + "post_attention_layernorm.weight", {h}});
    want.push_back({pre + "mlp.gate_proj.weight", {f, h}});
    want.push_back({pre + "mlp.up_proj.weight", {f, h}});
    want.push_back({pre + "mlp.down_proj.weight", {h, f}});
  }
  want.push_back({"model.norm.weight", {h}});
  want.push_back({"lm_head.weight", {m.vocab(), h}});
  const auto got = whole->NamedParameters();
  ASSERT_EQ(got.size(), want.size());
  const std::vector<torch::Tensor> params = whole->Parameters();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.sizes().vec(), want[i].second) << want[i].first;
    EXPECT_TRUE(got[i].second.is_same(params[i])) << "Parameters() and NamedParameters() differ at " << i;
  }
}

TEST(LlamaStage, NamedParameters_MiddleStage_CountBlocksFromZero) {
  const JobSpec job = TinyJob();
  std::unique_ptr<Stage> middle = MakeStage(job, 3, 6);  // block 1's halves, block 2's attention half
  std::vector<std::string> names;
  for (const auto& [name, p] : middle->NamedParameters()) names.push_back(name);
  const std::vector<std::string> want = {
      "model.layers.1.input_layernorm.weight",  "model.layers.1.self_attn.q_proj.weight",
      "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
      "model.layers.1.self_attn.o_proj.weight", "model.layers.1.post_attention_layernorm.weight",
      "model.layers.1.mlp.gate_proj.weight",    "model.layers.1.mlp.up_proj.weight",
      "model.layers.1.mlp.down_proj.weight",    "model.layers.2.input_layernorm.weight",
      "model.layers.2.self_attn.q_proj.weight", "model.layers.2.self_attn.k_proj.weight",
      "model.layers.2.self_attn.v_proj.weight", "model.layers.2.self_attn.o_proj.weight"};
  EXPECT_EQ(names, want);
}

TEST(LlamaStage, Forward_AnySplit_MatchesWholeModel) {
  const JobSpec job = TinyJob();
  const int n = NumLayers(job);
  const torch::Tensor tokens = Tokens(job.model_spec(), 2, 1);
  std::vector<std::unique_ptr<Stage>> one;
  one.push_back(MakeStage(job, 0, n));
  const torch::Tensor want = RunStages(one, tokens);
  std::map<std::string, torch::Tensor> whole_params = ByName(*one[0]);
  std::vector<std::vector<int>> cuts;
  for (int k = 1; k < n; ++k) cuts.push_back({0, k, n});
  cuts.push_back({0, 1, n - 1, n});
  cuts.push_back({0, 4, 7, n});
  cuts.push_back({0, 2, 3, n});
  for (const auto& cut : cuts) {
    std::vector<std::unique_ptr<Stage>> stages;
    for (size_t i = 0; i + 1 < cut.size(); ++i) {
      stages.push_back(MakeStage(job, cut[i], cut[i + 1]));
      ASSERT_EQ(stages.back()->Output(2).sizes,
                (std::vector<int64_t>{2, job.model_spec().seq(),
                                      i + 2 == cut.size() ? job.model_spec().vocab() : job.model_spec().hidden()}));
      for (auto& [name, p] : stages.back()->NamedParameters()) {
        EXPECT_TRUE(torch::equal(p, whole_params.at(name))) << name << " differs with cut at " << cut[1];
      }
    }
    const torch::Tensor got = RunStages(stages, tokens);
    EXPECT_TRUE(torch::allclose(got, want, 1e-6, 1e-6))
        << "cut at " << cut[1] << ": max difference " << (got - want).abs().max().item<double>();
  }
}

TEST(LlamaStage, Forward_Fp32_MatchesPlainAtenReference) {
  const JobSpec job = TinyJob();
  std::unique_ptr<Stage> whole = MakeStage(job, 0, NumLayers(job));
  // The norms' weights start at one and would hide a swapped name: give every parameter its own values.
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, p] : whole->NamedParameters()) {
      if (name.find("norm") != std::string::npos) p.uniform_(0.5, 1.5);
    }
  }
  const torch::Tensor tokens = Tokens(job.model_spec(), 3, 2);
  torch::Tensor got;
  {
    torch::NoGradGuard no_grad;
    got = whole->Forward(tokens);
  }
  const torch::Tensor want = ReferenceLogits(ByName(*whole), job.model_spec(), tokens);
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_LT(MaxRelativeError(got, want), 1e-5);
}

TEST(LlamaStage, Forward_ChangedFutureTokens_LeaveEarlierLogits) {
  const JobSpec job = TinyJob();
  std::vector<std::unique_ptr<Stage>> whole;
  whole.push_back(MakeStage(job, 0, NumLayers(job)));
  const int64_t s = job.model_spec().seq(), p = s / 2;
  const torch::Tensor tokens = Tokens(job.model_spec(), 2, 3);
  torch::Tensor changed = tokens.clone();
  changed.slice(1, p, s).add_(1).remainder_(job.model_spec().vocab());
  const torch::Tensor a = RunStages(whole, tokens), b = RunStages(whole, changed);
  EXPECT_TRUE(torch::allclose(a.slice(1, 0, p), b.slice(1, 0, p), 1e-6, 1e-6));
  EXPECT_GT((a.slice(1, p, s) - b.slice(1, p, s)).abs().max().item<double>(), 1e-3);
}

// d(sum(logits * w))/d(param) by autograd against central differences, in double.
TEST(LlamaStage, Backward_Double_MatchesFiniteDifferences) {
  const JobSpec job = TinyJob();
  LlamaConfig c = LlamaConfigFromSpec(job.model_spec());
  c.seq = 8;  // shorter sequences: the check runs two forwards per element
  LlamaStage module(c, 0, c.pipeline_layers(), kSeed);
  module->to(torch::kDouble);
  std::map<std::string, torch::Tensor> p;
  for (auto& [name, t] : module->NamedParametersHf()) p[name] = t;
  const torch::Tensor tokens = Tokens(job.model_spec(), 2, 4).slice(1, 0, c.seq);
  const torch::Tensor w = torch::randn({2, c.seq, c.vocab}, torch::kDouble);
  auto objective = [&] { return (module->forward(tokens) * w).sum(); };
  objective().backward();
  const std::vector<std::string> checked = {"model.embed_tokens.weight",
                                            "model.layers.0.input_layernorm.weight",
                                            "model.layers.0.self_attn.q_proj.weight",
                                            "model.layers.0.self_attn.k_proj.weight",
                                            "model.layers.1.self_attn.v_proj.weight",
                                            "model.layers.1.self_attn.o_proj.weight",
                                            "model.layers.2.mlp.gate_proj.weight",
                                            "model.layers.3.mlp.down_proj.weight",
                                            "model.norm.weight",
                                            "lm_head.weight"};
  torch::NoGradGuard no_grad;
  for (const std::string& name : checked) {
    torch::Tensor flat = p.at(name).view({-1});
    const torch::Tensor grad = p.at(name).grad().view({-1});
    ASSERT_TRUE(grad.defined()) << name;
    const int64_t element = (tokens[0][0].item<int64_t>() * c.hidden + 5) % flat.numel();  // a used embedding row
    for (int64_t e : {element, flat.numel() - 1}) {
      const double h = 1e-6, old = flat[e].item<double>();
      flat[e].fill_(old + h);
      const double up = objective().item<double>();
      flat[e].fill_(old - h);
      const double down = objective().item<double>();
      flat[e].fill_(old);
      const double numeric = (up - down) / (2 * h), analytic = grad[e].item<double>();
      EXPECT_NEAR(analytic, numeric, 1e-6 + 1e-5 * std::abs(numeric)) << name << "[" << e << "]";
    }
  }
}

TEST(LlamaStage, Train_SyntheticCorpus_LossFallsWellBelowUniform) {
  const JobSpec job = TinyJob();
  const ModelSpec& m = job.model_spec();
  std::unique_ptr<Stage> stage = MakeStage(job, 0, NumLayers(job));
  stage->SetTraining(true);
  FusedAdamW adam(stage->Parameters(), /*lr=*/1e-2);
  std::unique_ptr<TokenSource> corpus = MakeSyntheticCorpus(m.vocab(), m.seq(), 11);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const torch::Tensor batch = corpus->Batch(step, 0, 8);
    const torch::Tensor loss = stage->Loss(stage->Forward(batch.slice(1, 0, m.seq())), batch.slice(1, 1, m.seq() + 1));
    stage->Backward(loss, torch::Tensor());
    adam.Step();
    adam.ZeroGrad();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  const double uniform = std::log(static_cast<double>(m.vocab()));
  EXPECT_NEAR(first, uniform, 0.3);
  EXPECT_LT(last, 0.5 * uniform) << "first loss " << first;
}

TEST(LlamaStage, Forward_WrongInput_ThrowsC10Error) {
  const JobSpec job = TinyJob();
  const ModelSpec& m = job.model_spec();
  const int n = NumLayers(job);
  std::unique_ptr<Stage> first = MakeStage(job, 0, 2), rest = MakeStage(job, 2, n);
  const torch::Tensor hidden = torch::zeros({2, m.seq(), m.hidden()});
  EXPECT_THROW(first->Forward(hidden), c10::Error);                      // hidden states for tokens
  EXPECT_THROW(first->Forward(Tokens(m, 2, 1).view({-1})), c10::Error);  // [B * S] tokens
  EXPECT_THROW(first->Forward(torch::full({2, m.seq()}, m.vocab(), torch::kLong)), c10::Error);  // id >= vocab
  EXPECT_THROW(rest->Forward(torch::zeros({2, m.seq(), m.hidden() + 1})), c10::Error);           // wrong width
  EXPECT_THROW(rest->Forward(Tokens(m, 2, 1)), c10::Error);  // tokens for hidden states
  std::unique_ptr<Stage> attention = MakeStage(job, 1, 2);
  EXPECT_THROW(attention->Forward(torch::zeros({2, m.seq() + 1, m.hidden()})), c10::Error);  // past the tables
}

// The family's stages defer their linear layers' weight GEMMs from I to W: after I those weights'
// gradients are untouched, and I + W is the whole backward to the bit (deferred_wgrad=false too).
TEST(LlamaFamily, SplitBackward_DeferredWeightGradients_IPlusWIsTheWholeBackwardExactly) {
  const int n = NumLayers(TinyJob());
  const ModelSpec m = TinyJob().model_spec();
  auto linear_weight = [](const std::string& name) {
    return absl::EndsWith(name, "_proj.weight") || absl::EndsWith(name, "lm_head.weight");
  };
  torch::manual_seed(3);
  const torch::Tensor hidden = torch::randn({2, m.seq(), m.hidden()});
  const torch::Tensor grad_out = torch::randn({2, m.seq(), m.hidden()});
  const torch::Tensor tokens = torch::randint(m.vocab(), {2, m.seq()}, torch::kInt64);
  const torch::Tensor targets = torch::randint(m.vocab(), {2, m.seq()}, torch::kInt64);
  for (const bool defer : {true, false}) {
    JobSpec job = TinyJob();
    if (!defer) (*job.mutable_model_spec()->mutable_options())["deferred_wgrad"] = "false";
    for (auto [first, last] : std::vector<std::pair<int, int>>{{0, 3}, {1, n - 1}, {2, n}}) {
      SCOPED_TRACE(absl::StrCat(defer ? "deferred" : "defaults", " [", first, ", ", last, ")"));
      auto make = [&, first = first, last = last]() { return MakeStage(job, first, last); };
      ExpectSplitBackwardIsTheWholeBackward(
          make, first == 0 ? tokens : hidden, last == n ? torch::Tensor() : grad_out,
          [&](const torch::Tensor& logits) { return LanguageModelLoss(logits, targets); }, linear_weight);
    }
  }
}

TEST(LlamaFamily, MakeStage_BadLayerRange_IsInvalidArgument) {
  const JobSpec job = TinyJob();
  const int n = NumLayers(job);
  for (auto [first, last] : std::vector<std::pair<int, int>>{{-1, 2}, {3, 3}, {4, 2}, {0, n + 1}}) {
    StageOptions o;
    o.job = &job;
    o.first_layer = first;
    o.last_layer = last;
    o.num_layers = n;
    EXPECT_EQ(MakeLlamaFamily()->MakeStage(o).status().code(), absl::StatusCode::kInvalidArgument)
        << "[" << first << ", " << last << ")";
  }
  JobSpec odd = job;
  odd.mutable_model_spec()->set_kv_heads(3);  // does not divide 4 heads
  StageOptions o;
  o.job = &odd;
  o.last_layer = o.num_layers = n;
  EXPECT_EQ(MakeLlamaFamily()->MakeStage(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LlamaFamily, Description_IsLlamas) { EXPECT_EQ(MakeLlamaFamily()->description().family(), "llama"); }

// bf16 autocast on the GPU against the same parameters in fp32: the values a bf16 GEMM rounds to.
TEST(LlamaStageCuda, Forward_Bf16Autocast_CloseToFp32) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  JobSpec job = TinyJob();
  job.set_device("cuda");
  LlamaConfig c = LlamaConfigFromSpec(job.model_spec());
  c.bf16_autocast = true;
  LlamaStage bf16(c, 0, c.pipeline_layers(), kSeed);
  c.bf16_autocast = false;
  LlamaStage fp32(c, 0, c.pipeline_layers(), kSeed);
  bf16->to(torch::kCUDA);
  fp32->to(torch::kCUDA);
  const torch::Tensor tokens = Tokens(job.model_spec(), 4, 5).to(torch::kCUDA);
  torch::NoGradGuard no_grad;
  const torch::Tensor a = bf16->forward(tokens), b = fp32->forward(tokens);
  EXPECT_EQ(a.scalar_type(), torch::kBFloat16);
  EXPECT_LT(MaxRelativeError(a.to(torch::kFloat32), b), 2e-2);
}

// The kernel alone against the fp32 formula and a cast: the same bf16 values up to the rounding of the
// fp32 sums (a bf16 ulp in rare elements).
TEST(LlamaStageCuda, RmsNormToBf16_MatchesAtenThenCast) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t cols : {128, 2048, 4096}) {
    const torch::Tensor x = torch::randn({37, cols}, torch::kCUDA) * 3;
    const torch::Tensor w = torch::rand({cols}, torch::kCUDA) + 0.5;
    torch::Tensor y = torch::empty({37, cols}, x.options().dtype(torch::kBFloat16));
    torch::Tensor rstd = torch::empty({37}, x.options());
    ASSERT_EQ(
        RmsNormToBf16(x.data_ptr<float>(), w.data_ptr<float>(), reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()),
                      rstd.data_ptr<float>(), 37, cols, 1e-5f, at::cuda::getCurrentCUDAStream()),
        cudaSuccess);
    const torch::Tensor want_rstd = torch::rsqrt(x.pow(2).mean(-1) + 1e-5);
    const torch::Tensor want = (x * want_rstd.unsqueeze(-1) * w).to(torch::kBFloat16);
    EXPECT_TRUE(torch::allclose(rstd, want_rstd, 1e-5, 1e-6)) << cols;
    const double ulps =
        ((y.to(torch::kFloat32) - want.to(torch::kFloat32)).abs() / want.to(torch::kFloat32).abs().clamp_min(1e-30))
            .max()
            .item<double>() /
        (1.0 / 128);
    EXPECT_LE(ulps, 1.0) << cols;
  }
  EXPECT_EQ(RmsNormToBf16(nullptr, nullptr, nullptr, nullptr, 1, 100, 1e-5f, nullptr), cudaErrorInvalidValue);
}

// The whole model with the fused RMSNorm against the ATen path of fused_layernorm: false, forward and
// backward, at sizes the kernel takes (hidden 128).
TEST(LlamaStageCuda, FusedRmsNorm_MatchesUnfusedForwardAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LlamaConfig c = LlamaConfigFromSpec(TinyJob().model_spec());
  c.hidden = 128;
  c.ffn_hidden = 352;
  c.layers = 2;
  c.bf16_autocast = true;
  c.fused_rmsnorm = true;
  LlamaStage fused(c, 0, c.pipeline_layers(), kSeed);
  c.fused_rmsnorm = false;
  LlamaStage unfused(c, 0, c.pipeline_layers(), kSeed);
  fused->to(torch::kCUDA);
  unfused->to(torch::kCUDA);
  const torch::Tensor batch = MakeSyntheticCorpus(c.vocab, c.seq, 3)->Batch(0, 0, 4).to(torch::kCUDA);
  const torch::Tensor in = batch.slice(1, 0, c.seq), targets = batch.slice(1, 1, c.seq + 1);
  const torch::Tensor a = fused->forward(in), b = unfused->forward(in);
  EXPECT_LT(MaxRelativeError(a.to(torch::kFloat32), b.to(torch::kFloat32)), 2e-2);
  LanguageModelLoss(a, targets).backward();
  LanguageModelLoss(b, targets).backward();
  const auto pa = fused->NamedParametersHf(), pb = unfused->NamedParametersHf();
  for (size_t i = 0; i < pa.size(); ++i) {
    const torch::Tensor ga = pa[i].second.grad(), gb = pb[i].second.grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << pa[i].first;
    EXPECT_LT(((ga - gb).norm() / gb.norm()).item<double>(), 3e-2) << pa[i].first;
  }
}

// The rotary kernel against Hugging Face's formula in fp32 (x cos + rotate_half(x) sin), forward and,
// through autograd on the fp32 formula, backward: within a bf16 rounding (relative 1e-2 of the norm).
TEST(LlamaStageCuda, RotaryKernel_MatchesFormulaForwardAndBackward) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t b = 2, s = 37, heads = 3, d = 64, half = d / 2;
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor angles = torch::rand({s, half}, f32) * 10;
  const torch::Tensor cos = torch::cat({angles.cos(), angles.cos()}, -1).contiguous();
  const torch::Tensor sin = torch::cat({angles.sin(), angles.sin()}, -1).contiguous();
  const torch::Tensor x = torch::randn({b, s, heads, d}, f32).to(torch::kBFloat16);
  const torch::Tensor dy = torch::randn({b, s, heads, d}, f32).to(torch::kBFloat16);
  torch::Tensor xr = x.to(torch::kFloat32).requires_grad_(true);
  const torch::Tensor c4 = cos.view({1, s, 1, d}), s4 = sin.view({1, s, 1, d});
  const torch::Tensor rotated = torch::cat({-xr.narrow(-1, half, half), xr.narrow(-1, 0, half)}, -1);
  const torch::Tensor want = xr * c4 + rotated * s4;
  want.backward(dy.to(torch::kFloat32));
  auto rel = [](const torch::Tensor& a, const torch::Tensor& r) {
    return ((a.to(torch::kFloat32) - r).norm() / r.norm()).item<double>();
  };
  for (bool backward : {false, true}) {
    SCOPED_TRACE(backward);
    torch::Tensor y = torch::full({b, s, heads, d}, std::nan(""), f32.dtype(torch::kBFloat16));
    const torch::Tensor& in = backward ? dy : x;
    ASSERT_EQ(RotaryBf16(reinterpret_cast<const uint16_t*>(in.data_ptr<at::BFloat16>()), cos.data_ptr<float>(),
                         sin.data_ptr<float>(), reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), b, s, heads, d,
                         backward, at::cuda::getCurrentCUDAStream()),
              cudaSuccess);
    EXPECT_TRUE(y.isfinite().all().item<bool>());
    EXPECT_LT(rel(y, backward ? xr.grad() : want.detach()), 1e-2);
  }
  EXPECT_EQ(RotaryBf16(nullptr, nullptr, nullptr, nullptr, 1, 1, 1, 3, false, nullptr), cudaErrorInvalidValue);
}

// The SwiGLU kernels against silu(g) u in fp32 and its autograd gradients: within a bf16 rounding.
TEST(LlamaStageCuda, SwiGluKernels_MatchFp32Autograd) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto f32 = torch::TensorOptions().device(torch::kCUDA);
  for (int64_t n : {1001, 4096 * 3}) {  // one at a time, and pairs
    SCOPED_TRACE(n);
    const torch::Tensor g = (torch::randn({n}, f32) * 3).to(torch::kBFloat16),
                        u = torch::randn({n}, f32).to(torch::kBFloat16);
    const torch::Tensor dy = torch::randn({n}, f32).to(torch::kBFloat16);
    torch::Tensor gr = g.to(torch::kFloat32).requires_grad_(true), ur = u.to(torch::kFloat32).requires_grad_(true);
    const torch::Tensor want = at::silu(gr) * ur;
    want.backward(dy.to(torch::kFloat32));
    torch::Tensor y = torch::full({n}, std::nan(""), f32.dtype(torch::kBFloat16)), dg = torch::empty_like(y),
                  du = torch::empty_like(y);
    auto p = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
    ASSERT_EQ(SwiGluForward(p(g), p(u), p(y), n, at::cuda::getCurrentCUDAStream()), cudaSuccess);
    ASSERT_EQ(SwiGluBackward(p(g), p(u), p(dy), p(dg), p(du), n, at::cuda::getCurrentCUDAStream()), cudaSuccess);
    auto rel = [](const torch::Tensor& a, const torch::Tensor& r) {
      return ((a.to(torch::kFloat32) - r).norm() / r.norm()).item<double>();
    };
    EXPECT_LT(rel(y, want.detach()), 1e-2);
    EXPECT_LT(rel(dg, gr.grad()), 1e-2);
    EXPECT_LT(rel(du, ur.grad()), 1e-2);
  }
}

// The whole model with the fused rotary, SwiGLU, norm backward and loss against all four off:
// logits and every gradient within bf16 tolerance.
TEST(LlamaStageCuda, FusedElementwise_MatchesUnfusedForwardAndGradients) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  LlamaConfig c = LlamaConfigFromSpec(TinyJob().model_spec());
  c.hidden = 128;
  c.ffn_hidden = 352;
  c.layers = 2;
  c.bf16_autocast = true;
  LlamaStage fused(c, 0, c.pipeline_layers(), kSeed);
  c.fused_rotary = c.fused_swiglu = c.fused_norm_backward = c.fused_cross_entropy = false;
  LlamaStage unfused(c, 0, c.pipeline_layers(), kSeed);
  fused->to(torch::kCUDA);
  unfused->to(torch::kCUDA);
  const torch::Tensor batch = MakeSyntheticCorpus(c.vocab, c.seq, 3)->Batch(0, 0, 4).to(torch::kCUDA);
  const torch::Tensor in = batch.slice(1, 0, c.seq), targets = batch.slice(1, 1, c.seq + 1);
  const torch::Tensor a = fused->forward(in), b = unfused->forward(in);
  EXPECT_LT(MaxRelativeError(a.to(torch::kFloat32), b.to(torch::kFloat32)), 2e-2);
  FusedLanguageModelLoss(a, targets).backward();
  LanguageModelLoss(b, targets).backward();
  const auto pa = fused->NamedParametersHf(), pb = unfused->NamedParametersHf();
  for (size_t i = 0; i < pa.size(); ++i) {
    const torch::Tensor ga = pa[i].second.grad(), gb = pb[i].second.grad();
    ASSERT_TRUE(ga.defined() && gb.defined()) << pa[i].first;
    EXPECT_LT(((ga - gb).norm() / gb.norm()).item<double>(), 3e-2) << pa[i].first;
  }
}

// The model options that turn the fused mechanisms off: unset is on, "false" is off.
TEST(LlamaConfig, ModelOptions_FalseTurnsFusedMechanismsOff) {
  ModelSpec spec = TinyJob().model_spec();
  const LlamaConfig on = LlamaConfigFromSpec(spec);
  EXPECT_TRUE(on.fused_rotary && on.fused_swiglu && on.fused_norm_backward && on.fused_cross_entropy);
  for (const char* name : {"fused_rotary", "fused_swiglu", "fused_norm_backward", "fused_cross_entropy"}) {
    (*spec.mutable_options())[name] = "false";
  }
  const LlamaConfig off = LlamaConfigFromSpec(spec);
  EXPECT_FALSE(off.fused_rotary || off.fused_swiglu || off.fused_norm_backward || off.fused_cross_entropy);
}

}  // namespace
}  // namespace stagehand
