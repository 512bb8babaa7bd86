// The GPT in LibTorch (see gpt_stage.h). LibTorch translation unit; forward() may throw c10::Error,
// which the engine turns into a Status.
#include "models/gpt/gpt_stage.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_option.h"
#include "engine/stage.h"
#include "models/gpt/gpt_description.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

// q, k, v [B, NH, S, H/NH] as strided views of the qkv projection's output [B, S, 3H] (what the view,
// permute and unbind give), with a backward that writes the three gradients into one [B, S, 3H] tensor,
// one strided copy each. Autograd's own backward stacks them into a new [3, B, NH, S, H/NH] tensor
// (unbind) and then copies that again into [B, S, 3H] (the view of the permute): two passes over the
// gradient where one does (ncu, gpt-1.3b on an H200: 0.34 ms per attention layer and micro-batch of 8,
// CatArrayBatchedCopy 0.19 ms and a strided copy 0.15 ms). Same values: copies only.
class SplitHeadsFunction : public torch::autograd::Function<SplitHeadsFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& qkv,
                                                int64_t heads) {
    const int64_t b = qkv.size(0), s = qkv.size(1), d = qkv.size(2) / 3 / heads;
    ctx->saved_data["b"] = b;
    ctx->saved_data["s"] = s;
    ctx->saved_data["heads"] = heads;
    ctx->saved_data["d"] = d;
    std::vector<torch::Tensor> parts = qkv.view({b, s, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
    return {parts[0], parts[1], parts[2]};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t b = ctx->saved_data["b"].toInt(), s = ctx->saved_data["s"].toInt();
    const int64_t heads = ctx->saved_data["heads"].toInt(), d = ctx->saved_data["d"].toInt();
    torch::Tensor any;
    for (const auto& g : grads) any = g.defined() ? g : any;
    torch::Tensor dqkv = torch::empty({b, s, 3, heads, d}, any.options());
    for (int i = 0; i < 3; ++i) {
      torch::Tensor slot = dqkv.select(2, i);  // [B, S, NH, D]
      if (grads[i].defined()) {
        slot.copy_(grads[i].transpose(1, 2));
      } else {
        slot.zero_();
      }
    }
    return {dqkv.view({b, s, 3 * heads * d}), torch::Tensor()};
  }
};

// One pipeline layer: tokens or hidden states in, hidden states or logits out.
class PipelineLayerImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

class EmbeddingImpl : public PipelineLayerImpl {
 public:
  EmbeddingImpl(const GptConfig& c, uint64_t seed, const torch::Device& device) : fused_grad_(c.fused_embedding_grad) {
    weight_ = register_parameter("weight", torch::empty({c.vocab, c.hidden}, torch::TensorOptions().device(device)));
    at::Generator gen = LayerGenerator(seed, 0, device);
    torch::NoGradGuard no_grad;
    weight_.normal_(0.0, 0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                "the first stage takes token ids [B, S] int64, got ", tokens.sizes(), " ", tokens.scalar_type());
    return EmbeddingLookup(weight_, tokens, fused_grad_);
  }

 private:
  bool fused_grad_;
  torch::Tensor weight_;
};

// A transformer block is two pipeline layers, so that a partition can cut between its halves: the
// attention half (x + proj(attention(ln1(x)))) and the MLP half (x + fc2(gelu(fc1(ln2(x))))). A whole
// block of gpt-1.3b is 0.82 ms of forward and backward per sequence on an H200 (attention 0.3, MLP 0.5),
// too coarse to balance two stages when the head alone is 1.1 ms.
class AttentionImpl : public PipelineLayerImpl {
 public:
  AttentionImpl(const GptConfig& c, int layer, uint64_t seed, const torch::Device& device)
      : hidden_(c.hidden),
        heads_(c.heads),
        fused_layernorm_(c.fused_layernorm),
        fused_norm_backward_(c.fused_norm_backward),
        fused_qkv_grad_(c.fused_qkv_grad),
        fused_residual_grad_(c.fused_residual_grad),
        residual_gemm_(ResidualGemmOf(c.fused_residual_gemm, c.cutlass_residual_gemm)),
        fused_bias_grad_(c.fused_bias_grad) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    qkv_ = register_module("qkv", Dense(c.hidden, 3 * c.hidden, true, device));
    proj_ = register_module("proj", Dense(c.hidden, c.hidden, true, device));
    at::Generator gen = LayerGenerator(seed, layer, device);
    qkv_->InitWeight(0.02, gen);
    // GPT-2: the projections into the residual stream are scaled down by sqrt(2 L).
    proj_->InitWeight(0.02 / std::sqrt(2.0 * c.layers), gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "an attention layer takes hidden states [B, S, ", hidden_,
                "], got ", x.sizes());
    const int64_t b = x.size(0), s = x.size(1);
    // [B, S, 3H] -> [3, B, NH, S, H/NH]: q, k, v as nanoGPT splits them.
    // unbind, not three selects: select's backward would zero-fill a full-size gradient for each of q, k, v
    // and add them up (about 10% of a gpt-1.3b step on an H200).
    auto [normed, skip] = NormForGemmWithSkip(ln1_, x, fused_layernorm_, fused_norm_backward_, fused_residual_grad_);
    const std::vector<torch::Tensor> qkv = SplitHeads(normed);
    auto att = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, /*is_causal=*/true);
    // The fp32 stream plus the branch, in one GEMM (or, unfused, autocast's bf16 branch added to it).
    return proj_->ForwardResidual(att.transpose(1, 2).reshape({b, s, hidden_}), skip, residual_gemm_);
  }

 private:
  // q, k, v [B, NH, S, D] from the normed input: with fused_bias_grad (and fused_qkv_grad) one function
  // whose backward assembles their gradients and the bias's in one pass (DenseImpl::ForwardHeads).
  std::vector<torch::Tensor> SplitHeads(const torch::Tensor& normed) {
    if (fused_qkv_grad_ && fused_bias_grad_) return qkv_->ForwardHeads(normed, heads_);
    const int64_t b = normed.size(0), s = normed.size(1);
    const torch::Tensor projected = qkv_(normed);
    if (fused_qkv_grad_ && torch::GradMode::is_enabled() && projected.requires_grad()) {
      return SplitHeadsFunction::apply(projected, heads_);
    }
    return projected.view({b, s, 3, heads_, hidden_ / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
  }

  int64_t hidden_, heads_;
  bool fused_layernorm_, fused_norm_backward_, fused_qkv_grad_, fused_residual_grad_;
  ResidualGemm residual_gemm_;
  bool fused_bias_grad_;
  torch::nn::LayerNorm ln1_{nullptr};
  Dense qkv_{nullptr}, proj_{nullptr};
};

class MlpImpl : public PipelineLayerImpl {
 public:
  MlpImpl(const GptConfig& c, int layer, uint64_t seed, const torch::Device& device)
      : hidden_(c.hidden),
        fused_layernorm_(c.fused_layernorm),
        fused_norm_backward_(c.fused_norm_backward),
        fused_residual_grad_(c.fused_residual_grad),
        residual_gemm_(ResidualGemmOf(c.fused_residual_gemm, c.cutlass_residual_gemm)),
        fused_gelu_(c.fused_gelu),
        fused_gelu_gemm_(c.fused_gelu_gemm) {
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    fc1_ = register_module("fc1", Dense(c.hidden, 4 * c.hidden, true, device));
    fc2_ = register_module("fc2", Dense(4 * c.hidden, c.hidden, true, device));
    at::Generator gen = LayerGenerator(seed, layer, device);
    fc1_->InitWeight(0.02, gen);
    fc2_->InitWeight(0.02 / std::sqrt(2.0 * c.layers), gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "an MLP layer takes hidden states [B, S, ", hidden_, "], got ",
                x.sizes());
    auto [normed, skip] = NormForGemmWithSkip(ln2_, x, fused_layernorm_, fused_norm_backward_, fused_residual_grad_);
    // exact (erf) GELU, as torch's default
    return fc2_->ForwardResidual(fc1_->ForwardGelu(normed, fused_gelu_, fused_gelu_gemm_), skip, residual_gemm_);
  }

 private:
  int64_t hidden_;
  bool fused_layernorm_, fused_norm_backward_;
  bool fused_residual_grad_;
  ResidualGemm residual_gemm_;
  bool fused_gelu_, fused_gelu_gemm_;
  torch::nn::LayerNorm ln2_{nullptr};
  Dense fc1_{nullptr}, fc2_{nullptr};
};

class HeadImpl : public PipelineLayerImpl {
 public:
  HeadImpl(const GptConfig& c, uint64_t seed, const torch::Device& device)
      : hidden_(c.hidden), fused_layernorm_(c.fused_layernorm), fused_norm_backward_(c.fused_norm_backward) {
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    lm_head_ = register_module("lm_head", Dense(c.hidden, c.vocab, false, device));
    at::Generator gen = LayerGenerator(seed, c.pipeline_layers() - 1, device);
    lm_head_->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "the head takes hidden states [B, S, ", hidden_, "], got ",
                x.sizes());
    return lm_head_(NormForGemm(ln_f_, x, fused_layernorm_, fused_norm_backward_));
  }

 private:
  int64_t hidden_;
  bool fused_layernorm_, fused_norm_backward_;
  torch::nn::LayerNorm ln_f_{nullptr};
  Dense lm_head_{nullptr};
};

std::shared_ptr<PipelineLayerImpl> MakeLayer(const GptConfig& config, int layer, uint64_t seed,
                                             const torch::Device& device) {
  switch (DecoderLayerKindOf(layer, config.layers)) {
    case DecoderLayerKind::kEmbedding:
      return std::make_shared<EmbeddingImpl>(config, seed, device);
    case DecoderLayerKind::kAttention:
      return std::make_shared<AttentionImpl>(config, layer, seed, device);
    case DecoderLayerKind::kMlp:
      return std::make_shared<MlpImpl>(config, layer, seed, device);
    case DecoderLayerKind::kHead:
      return std::make_shared<HeadImpl>(config, seed, device);
  }
  return nullptr;
}

// GptStage behind the engine's interface.
class GptPipelineStage final : public Stage {
 public:
  GptPipelineStage(const GptConfig& config, const StageOptions& o)
      : config_(config),
        first_layer_(o.first_layer),
        module_(config, o.first_layer, o.last_layer, o.seed, o.init_device()),
        defer_wgrad_(DefersWeightGradients(*o.job)) {
    module_->to(o.device);
    if (o.job != nullptr && LowersDenseWeights(*o.job, o.device, config.bf16_autocast)) {
      LowerDenseWeights(*module_, at::kBFloat16);
    }
  }
  TensorSpec Input(int64_t batch) const override {
    if (module_->has_embedding()) return {{batch, config_.seq}, torch::kInt64};
    return {{batch, config_.seq, config_.hidden}, torch::kFloat32};
  }
  TensorSpec Output(int64_t batch) const override {
    if (module_->has_head()) return {{batch, config_.seq, config_.vocab}, torch::kFloat32};
    return {{batch, config_.seq, config_.hidden}, torch::kFloat32};
  }
  torch::Tensor Forward(const torch::Tensor& input) override { return module_->forward(input); }
  torch::Tensor Loss(const torch::Tensor& output, const torch::Tensor& targets) override {
    return config_.fused_cross_entropy ? FusedLanguageModelLoss(output, targets) : LanguageModelLoss(output, targets);
  }
  std::vector<torch::Tensor> Parameters() override { return module_->parameters(); }
  // "layers.<pipeline layer>.<name>": the module's list counts from the stage's first layer, the
  // names count from the model's, so that checkpoints match them across partitions.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : module_->named_parameters()) {
      const std::string& key = item.key();  // "layers.<i>.<rest>"
      const size_t dot = key.find('.', 7);
      const int local = std::stoi(key.substr(7, dot - 7));
      out.emplace_back(absl::StrCat("layers.", first_layer_ + local, key.substr(dot)), item.value());
    }
    return out;
  }
  void SetTraining(bool training) override { module_->train(training); }
  void PrepareForGraphs() override { module_->RefreshCasts(); }

  // Zero-bubble's I and W: the linear layers' weight GEMMs deferred to W (nn.h), unless turned off.
  torch::Tensor BackwardInput(const torch::Tensor& input, const torch::Tensor& output,
                              const torch::Tensor& grad_output) override {
    return defer_wgrad_ ? split_.BackwardInput(input, output, grad_output)
                        : Stage::BackwardInput(input, output, grad_output);
  }
  void BackwardWeight(const torch::Tensor& output, const torch::Tensor& grad_output) override {
    if (!defer_wgrad_ || !split_.BackwardWeight(output)) Stage::BackwardWeight(output, grad_output);
  }

 private:
  GptConfig config_;
  int first_layer_;
  GptStage module_;
  bool defer_wgrad_;
  DeferredSplitBackward split_;
};

class GptFamily final : public ModelFamily {
 public:
  const ModelDescription& description() const override { return GptDescription(); }
  absl::Status Prepare(const JobSpec& job) const override {
    return job.device() == "cuda" ? SelectAttentionKernel(job.model_spec().attention()) : absl::OkStatus();
  }
  std::vector<AttentionCall> AttentionCalls(const JobSpec& job) const override {
    const GptConfig c = GptConfigFromSpec(job.model_spec());
    // q, k, v: views of the qkv projection's [B, S, 3, NH, D] (AttentionImpl::SplitHeads).
    return {AttentionCall{c.heads, c.heads, c.hidden / c.heads, c.seq, /*causal=*/true, /*packed_qkv=*/true}};
  }
  absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageOptions& o) const override {
    const GptConfig config = GptConfigFromSpec(o.job->model_spec());
    if (o.first_layer < 0 || o.first_layer >= o.last_layer || o.last_layer > config.pipeline_layers()) {
      return absl::InvalidArgumentError(absl::StrCat("a GPT stage holds layers [first, last) of 0..",
                                                     config.pipeline_layers(), ", got [", o.first_layer, ", ",
                                                     o.last_layer, ")"));
    }
    return std::unique_ptr<Stage>(std::make_unique<GptPipelineStage>(config, o));
  }
};

}  // namespace

GptConfig GptConfigFromSpec(const ModelSpec& g) {
  GptConfig c;
  c.vocab = g.vocab();
  c.hidden = g.hidden();
  c.heads = g.heads();
  c.layers = g.layers();
  c.seq = g.seq();
  c.bf16_autocast = !g.fp32();
  c.fused_layernorm = BoolOption(g, ModelSpec::kFusedLayernormFieldNumber);
  auto on = [&](const char* name) { return ModelOptionOn(g, name); };
  c.fused_qkv_grad = on("fused_qkv_grad");
  c.fused_norm_backward = on("fused_norm_backward");
  c.fused_cross_entropy = on("fused_cross_entropy");
  c.fused_residual_grad = on("fused_residual_grad");
  c.fused_gelu = on("fused_gelu");
  c.fused_gelu_gemm = on("fused_gelu_gemm");
  c.fused_residual_gemm = on("fused_residual_gemm");
  c.cutlass_residual_gemm = on("cutlass_residual_gemm");
  c.fused_bias_grad = on("fused_bias_grad");
  c.fused_embedding_grad = on("fused_embedding_grad");
  return c;
}

GptStageImpl::GptStageImpl(const GptConfig& config, int first, int last, uint64_t seed,
                           const torch::Device& init_device)
    : config_(config), first_(first), last_(last) {
  TORCH_CHECK(0 <= first && first < last && last <= config.pipeline_layers(),
              "a stage holds layers [first, last) of 0..", config.pipeline_layers(), ", got [", first, ", ", last, ")");
  // Each layer draws from its own generator, so layers can be built on several threads with the same
  // result: the 1.3B model's normal draws are serial within a tensor and take seconds.
  // On a GPU the draws take milliseconds: built in order on this thread.
  std::vector<std::shared_ptr<PipelineLayerImpl>> built(last - first);
  if (init_device.is_cuda()) {
    for (int i = first; i < last; ++i) built[i - first] = MakeLayer(config, i, seed, init_device);
  } else {
    at::parallel_for(first, last, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) built[i - first] = MakeLayer(config, i, seed, init_device);
    });
  }
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (auto& layer : built) layers_->push_back(std::move(layer));
  SetDenseFusedBiasGrad(*this, config.fused_bias_grad);
}

torch::Tensor GptStageImpl::forward(const torch::Tensor& input) {
  std::optional<CudaBf16Autocast> autocast;
  if (config_.bf16_autocast && input.is_cuda()) autocast.emplace();
  torch::Tensor x = input;
  for (size_t i = 0; i < layers_->size(); ++i) x = layers_->ptr<PipelineLayerImpl>(i)->forward(x);
  // Stages exchange fp32 hidden states; logits stay as autocast made them (the loss upcasts).
  return has_head() ? x : x.to(torch::kFloat32);
}

void GptStageImpl::RefreshCasts() {
  if (!config_.bf16_autocast) return;
  RefreshDenseCasts(*this, at::kBFloat16);
}

std::unique_ptr<ModelFamily> MakeGptFamily() { return std::make_unique<GptFamily>(); }

}  // namespace stagehand
