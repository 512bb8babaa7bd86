// Llama in LibTorch (see llama_stage.h). LibTorch translation unit; forward() may throw c10::Error,
// which the engine turns into a Status.
#include "models/llama/llama_stage.h"

#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_option.h"
#include "engine/stage.h"
#include "kernels/fused_elementwise_kernels.h"
#include "kernels/fused_kernels.h"
#include "models/llama/llama_description.h"
#include "nn/nn.h"

namespace stagehand {
namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// The rotary tables of a stage, [seq, head_dim] fp32 on the stage's device.
struct Rotary {
  torch::Tensor cos, sin;
};

// Hugging Face's LlamaRotaryEmbedding: inv_freq_i = theta^(-2i/d) for i < d/2, angle = position x
// inv_freq, and both halves of the head dimension use the same angles (cat(freqs, freqs)), which is what
// rotate_half below pairs element j with element j + d/2 for. In double, then fp32: the table is made
// once, so the extra precision costs nothing.
Rotary MakeRotary(const LlamaConfig& c) {
  const int64_t d = c.head_dim();
  auto opts = torch::TensorOptions().dtype(torch::kFloat64);
  torch::Tensor inv_freq = torch::pow(c.rope_theta, -torch::arange(0, d, 2, opts) / static_cast<double>(d));
  torch::Tensor freqs = torch::outer(torch::arange(c.seq, opts), inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(torch::kFloat32), emb.sin().to(torch::kFloat32)};
}

// x [B, heads, S, d]: x cos + rotate_half(x) sin, rotate_half(x) = cat(-x[d/2:], x[:d/2]). The tables
// are fp32; the result goes back to x's dtype (bf16 under autocast), which attention takes anyway.
torch::Tensor ApplyRotary(const torch::Tensor& x, const Rotary& r) {
  const int64_t s = x.size(2), half = x.size(3) / 2;
  const torch::Tensor cos = r.cos.narrow(0, 0, s), sin = r.sin.narrow(0, 0, s);
  const torch::Tensor rotated = torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return (x * cos + rotated * sin).to(x.scalar_type());
}

// Rotary embeddings in one kernel each way (fused_elementwise_kernels.h): x [B, S, heads, d] bf16, the
// projection's output as it lies; the result has the same layout (the caller transposes the view).
// Eager ApplyRotary makes an fp32 x cos, a bf16 rotate_half(x), an fp32 product and sum and a cast, and
// as many passes again in the backward.
class RotaryFunction : public torch::autograd::Function<RotaryFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& cos,
                               const torch::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return Run(x, cos, sin, /*backward=*/false);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    return {Run(grads[0].to(torch::kBFloat16).contiguous(), s[0], s[1], /*backward=*/true), torch::Tensor(),
            torch::Tensor()};
  }
  static torch::Tensor Run(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, bool backward) {
    torch::Tensor y = torch::empty_like(x, torch::MemoryFormat::Contiguous);
    const cudaError_t e =
        RotaryBf16(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), cos.data_ptr<float>(),
                   sin.data_ptr<float>(), reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), x.size(0), x.size(1),
                   x.size(2), x.size(3), backward, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "RotaryBf16: ", cudaGetErrorString(e));
    return y;
  }
};

// x [B, S, heads, d] (the projection's output viewed by heads) -> [B, heads, S, d] with rotary
// embeddings: the fused kernel where it applies (bf16, contiguous, CUDA, 2^31 pairs at most), else ATen.
torch::Tensor RotaryHeads(const torch::Tensor& x, const Rotary& r, bool fused) {
  if (fused && x.is_cuda() && x.scalar_type() == torch::kBFloat16 && x.is_contiguous() &&
      x.numel() / 2 < (int64_t{1} << 31) && r.cos.is_cuda() && r.cos.scalar_type() == torch::kFloat32 &&
      r.cos.is_contiguous() && r.sin.is_contiguous() && r.cos.size(0) >= x.size(1) && r.cos.size(1) == x.size(3)) {
    return RotaryFunction::apply(x, r.cos, r.sin).transpose(1, 2);
  }
  return ApplyRotary(x.transpose(1, 2), r);
}

// silu(gate) up in one kernel each way (fused_elementwise_kernels.h), for bf16 inputs of one shape on
// CUDA; eager runs silu, a product, and three kernels in the backward, and keeps three tensors for it
// where this keeps the two inputs.
class SwiGluFunction : public torch::autograd::Function<SwiGluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& gate,
                               const torch::Tensor& up) {
    ctx->save_for_backward({gate, up});
    torch::Tensor y = torch::empty_like(gate);
    const cudaError_t e = SwiGluForward(reinterpret_cast<const uint16_t*>(gate.data_ptr<at::BFloat16>()),
                                        reinterpret_cast<const uint16_t*>(up.data_ptr<at::BFloat16>()),
                                        reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), gate.numel(),
                                        at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "SwiGluForward: ", cudaGetErrorString(e));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor &gate = s[0], &up = s[1];
    const torch::Tensor dy = grads[0].to(torch::kBFloat16).contiguous();
    torch::Tensor dgate = torch::empty_like(gate), dup = torch::empty_like(up);
    const cudaError_t e = SwiGluBackward(reinterpret_cast<const uint16_t*>(gate.data_ptr<at::BFloat16>()),
                                         reinterpret_cast<const uint16_t*>(up.data_ptr<at::BFloat16>()),
                                         reinterpret_cast<const uint16_t*>(dy.data_ptr<at::BFloat16>()),
                                         reinterpret_cast<uint16_t*>(dgate.data_ptr<at::BFloat16>()),
                                         reinterpret_cast<uint16_t*>(dup.data_ptr<at::BFloat16>()), gate.numel(),
                                         at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "SwiGluBackward: ", cudaGetErrorString(e));
    return {dgate, dup};
  }
};

torch::Tensor SwiGlu(const torch::Tensor& gate, const torch::Tensor& up, bool fused) {
  if (fused && gate.is_cuda() && gate.scalar_type() == torch::kBFloat16 && up.scalar_type() == torch::kBFloat16 &&
      gate.sizes() == up.sizes() && gate.is_contiguous() && up.is_contiguous()) {
    return SwiGluFunction::apply(gate, up);
  }
  return at::silu(gate) * up;
}

// RMSNorm of an fp32 input to a bf16 output in one kernel (fused_kernels.h): what bf16 autocast computes
// for an RMSNorm that feeds a GEMM (the norm in fp32, then the GEMM's cast), without the fp32 output's
// round trip through memory. The backward is in ATen ops on the fp32 input, with the incoming bf16
// gradient upcast as the cast's backward would: with g = dy w, dx = rstd g - x rstd^3 mean(g x) and
// dw = sum over rows of dy x rstd.
class RmsNormToBf16Function : public torch::autograd::Function<RmsNormToBf16Function> {
 public:
  // x: contiguous and 16-byte aligned, weight fp32 aligned (FusedRmsNormApplies checks).
  // With `skip`, x comes back as a second output (see LayerNormToBf16Function in nn/nn.cc).
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, double eps, bool fused_backward,
                                                bool skip) {
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    std::vector<int64_t> stats_shape(x.sizes().begin(), x.sizes().end() - 1);
    stats_shape.push_back(1);
    torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
    torch::Tensor rstd = torch::empty(stats_shape, x.options());
    const cudaError_t e = RmsNormToBf16(x.data_ptr<float>(), weight.data_ptr<float>(),
                                        reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), rstd.data_ptr<float>(),
                                        rows, cols, static_cast<float>(eps), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "RmsNormToBf16: ", cudaGetErrorString(e));
    ctx->save_for_backward({x, weight, rstd});
    ctx->saved_data["fused_backward"] = fused_backward;
    ctx->saved_data["weight"] = weight;  // the parameter, whose .grad the fused backward adds into
    if (skip) return {y, x};
    return {y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &weight = s[1], &rstd = s[2];
    const torch::Tensor skip_grad = grads.size() > 1 ? grads[1] : torch::Tensor();
    if (ctx->saved_data["fused_backward"].toBool()) {
      const torch::Tensor weight_param =
          ctx->needs_input_grad(1) ? ctx->saved_data["weight"].toTensor() : torch::Tensor();
      std::vector<torch::Tensor> fused =
          NormBackwardFromBf16(grads[0], x, weight, torch::Tensor(), rstd, skip_grad, &weight_param);
      if (!fused.empty()) return {fused[0], fused[1], torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    const torch::Tensor dy = grads[0].to(torch::kFloat32);
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      const torch::Tensor g = dy * weight;
      dx = rstd * g - x * rstd.pow(3) * (g * x).mean(-1, /*keepdim=*/true);
    }
    if (ctx->needs_input_grad(1)) dw = (dy * x * rstd).reshape({-1, x.size(-1)}).sum(0);
    if (skip_grad.defined() && dx.defined()) dx = dx + skip_grad;
    return {dx, dw, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

bool FusedRmsNormApplies(const torch::Tensor& x, const torch::Tensor& w) {
  auto aligned = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  return x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && aligned(x) &&
         at::autocast::is_autocast_enabled(at::kCUDA) && at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16 &&
         w.scalar_type() == torch::kFloat32 && w.is_contiguous() && aligned(w) && LayerNormToBf16Supports(x.size(-1));
}

// RMSNorm in fp32 (or wider: the gradient check runs in double) whatever autocast does:
// x rsqrt(mean(x^2) + eps) w, the weight initialised to ones. The output is fp32; the GEMM it feeds
// casts it to bf16 under autocast. With `fused`, under bf16 autocast on CUDA, the bf16 output comes
// from one kernel instead (RmsNormToBf16Function): every RMSNorm here feeds a GEMM.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t hidden, double eps, bool fused, bool fused_backward)
      : eps_(eps), fused_(fused), fused_backward_(fused_backward) {
    weight = register_parameter("weight", torch::ones({hidden}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    if (fused_ && FusedRmsNormApplies(x, weight)) {
      return RmsNormToBf16Function::apply(x, weight, eps_, fused_backward_, false)[0];
    }
    const at::ScalarType dtype = at::promote_types(x.scalar_type(), torch::kFloat32);
    const torch::Tensor xf = x.to(dtype);
    return xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight.to(dtype);
  }
  // {norm(x), x} for a residual block x + f(norm(x)): with `fused_skip` (and the fused forward and
  // backward) x passes through the norm's function, whose fused backward adds the residual stream's
  // gradient to dx in its own pass.
  std::pair<torch::Tensor, torch::Tensor> ForwardWithSkip(const torch::Tensor& x, bool fused_skip) {
    if (!fused_skip || !fused_ || !fused_backward_ || !torch::GradMode::is_enabled() ||
        !FusedRmsNormApplies(x, weight)) {
      return {forward(x), x};
    }
    torch::autograd::variable_list out = RmsNormToBf16Function::apply(x, weight, eps_, fused_backward_, true);
    return {out[0], out[1]};
  }
  torch::Tensor weight;

 private:
  double eps_;
  bool fused_, fused_backward_;
};
TORCH_MODULE(RmsNorm);

// One pipeline layer: tokens or hidden states in, hidden states or logits out.
class PipelineLayerImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary) = 0;
  // This layer's parameters under Hugging Face's names.
  virtual Named NamedParametersHf() = 0;
};

void CheckHidden(const torch::Tensor& x, int64_t hidden, const char* what) {
  TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden && x.is_floating_point(), what, " takes hidden states [B, S, ",
              hidden, "] (floating point), got ", x.sizes(), " ", x.scalar_type());
}

// "model.layers.{b}." for pipeline layer `layer` (2b+1 or 2b+2: block b counted from 0).
std::string BlockPrefix(int layer) { return absl::StrCat("model.layers.", (layer - 1) / 2, "."); }

class EmbeddingImpl : public PipelineLayerImpl {
 public:
  EmbeddingImpl(const LlamaConfig& c, uint64_t seed, const torch::Device& device)
      : fused_grad_(c.fused_embedding_grad) {
    weight_ = register_parameter("weight", torch::empty({c.vocab, c.hidden}, torch::TensorOptions().device(device)));
    at::Generator gen = LayerGenerator(seed, 0, device);
    torch::NoGradGuard no_grad;
    weight_.normal_(0.0, 0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& tokens, const Rotary&) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                "the first stage takes token ids [B, S] int64, got ", tokens.sizes(), " ", tokens.scalar_type());
    // out-of-range ids throw c10::IndexError (a c10::Error)
    return EmbeddingLookup(weight_, tokens, fused_grad_);
  }
  Named NamedParametersHf() override { return {{"model.embed_tokens.weight", weight_}}; }

 private:
  bool fused_grad_;
  torch::Tensor weight_;
};

// x + o(attention(rope(q(n)), rope(k(n)), v(n))), n = RMSNorm(x), causal, grouped-query.
class AttentionImpl : public PipelineLayerImpl {
 public:
  AttentionImpl(const LlamaConfig& c, int layer, uint64_t seed, const torch::Device& device)
      : layer_(layer),
        hidden_(c.hidden),
        heads_(c.heads),
        kv_heads_(c.kv_heads),
        head_dim_(c.head_dim()),
        seq_(c.seq),
        fused_rotary_(c.fused_rotary),
        fused_residual_grad_(c.fused_residual_grad),
        residual_gemm_(ResidualGemmOf(c.fused_residual_gemm, c.cutlass_residual_gemm)) {
    norm_ = register_module("input_layernorm", RmsNorm(c.hidden, c.norm_eps, c.fused_rmsnorm, c.fused_norm_backward));
    q_ = register_module("q_proj", Dense(c.hidden, c.heads * head_dim_, false, device));
    k_ = register_module("k_proj", Dense(c.hidden, c.kv_heads * head_dim_, false, device));
    v_ = register_module("v_proj", Dense(c.hidden, c.kv_heads * head_dim_, false, device));
    o_ = register_module("o_proj", Dense(c.heads * head_dim_, c.hidden, false, device));
    at::Generator gen = LayerGenerator(seed, layer_, device);
    for (Dense* d : {&q_, &k_, &v_, &o_}) (*d)->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rotary) override {
    CheckHidden(x, hidden_, "an attention layer");
    const int64_t b = x.size(0), s = x.size(1);
    TORCH_CHECK(s <= seq_, "sequences of at most ", seq_, " tokens (the rotary tables' length), got ", s);
    auto [n, skip] = norm_->ForwardWithSkip(x, fused_residual_grad_);
    auto heads = [&](Dense& proj, int64_t count) { return proj(n).view({b, s, count, head_dim_}); };
    const torch::Tensor q = RotaryHeads(heads(q_, heads_), rotary, fused_rotary_);
    const torch::Tensor k = RotaryHeads(heads(k_, kv_heads_), rotary, fused_rotary_);
    const torch::Tensor v = heads(v_, kv_heads_).transpose(1, 2);
    // enable_gqa: query head j reads key/value head j / (heads / kv_heads), as Hugging Face's repeat_kv,
    // without materialising the repeated keys and values where the kernel takes them as they are.
    const torch::Tensor att = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true,
                                                               /*scale=*/std::nullopt, /*enable_gqa=*/true);
    // Under autocast the branch comes out bf16; adding it to the fp32 stream keeps the stream fp32.
    return o_->ForwardResidual(att.transpose(1, 2).reshape({b, s, heads_ * head_dim_}), skip, residual_gemm_);
  }
  Named NamedParametersHf() override {
    const std::string p = BlockPrefix(layer_);
    return {{p + "input_layernorm.weight", norm_->weight},
            {p + "self_attn.q_proj.weight", q_->weight},
            {p + "self_attn.k_proj.weight", k_->weight},
            {p + "self_attn.v_proj.weight", v_->weight},
            {p + "self_attn.o_proj.weight", o_->weight}};
  }

 private:
  int layer_;
  int64_t hidden_, heads_, kv_heads_, head_dim_, seq_;
  bool fused_rotary_, fused_residual_grad_;
  ResidualGemm residual_gemm_;
  RmsNorm norm_{nullptr};
  Dense q_{nullptr}, k_{nullptr}, v_{nullptr}, o_{nullptr};
};

// x + down(silu(gate(n)) * up(n)), n = RMSNorm(x).
class MlpImpl : public PipelineLayerImpl {
 public:
  MlpImpl(const LlamaConfig& c, int layer, uint64_t seed, const torch::Device& device)
      : layer_(layer),
        hidden_(c.hidden),
        fused_swiglu_(c.fused_swiglu),
        fused_residual_grad_(c.fused_residual_grad),
        residual_gemm_(ResidualGemmOf(c.fused_residual_gemm, c.cutlass_residual_gemm)) {
    norm_ = register_module("post_attention_layernorm",
                            RmsNorm(c.hidden, c.norm_eps, c.fused_rmsnorm, c.fused_norm_backward));
    gate_ = register_module("gate_proj", Dense(c.hidden, c.ffn_hidden, false, device));
    up_ = register_module("up_proj", Dense(c.hidden, c.ffn_hidden, false, device));
    down_ = register_module("down_proj", Dense(c.ffn_hidden, c.hidden, false, device));
    at::Generator gen = LayerGenerator(seed, layer_, device);
    for (Dense* d : {&gate_, &up_, &down_}) (*d)->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x, const Rotary&) override {
    CheckHidden(x, hidden_, "an MLP layer");
    auto [n, skip] = norm_->ForwardWithSkip(x, fused_residual_grad_);
    return down_->ForwardResidual(SwiGlu(gate_(n), up_(n), fused_swiglu_), skip, residual_gemm_);
  }
  Named NamedParametersHf() override {
    const std::string p = BlockPrefix(layer_);
    return {{p + "post_attention_layernorm.weight", norm_->weight},
            {p + "mlp.gate_proj.weight", gate_->weight},
            {p + "mlp.up_proj.weight", up_->weight},
            {p + "mlp.down_proj.weight", down_->weight}};
  }

 private:
  int layer_;
  int64_t hidden_;
  bool fused_swiglu_, fused_residual_grad_;
  ResidualGemm residual_gemm_;
  RmsNorm norm_{nullptr};
  Dense gate_{nullptr}, up_{nullptr}, down_{nullptr};
};

class HeadImpl : public PipelineLayerImpl {
 public:
  HeadImpl(const LlamaConfig& c, uint64_t seed, const torch::Device& device) : hidden_(c.hidden) {
    norm_ = register_module("norm", RmsNorm(c.hidden, c.norm_eps, c.fused_rmsnorm, c.fused_norm_backward));
    lm_head_ = register_module("lm_head", Dense(c.hidden, c.vocab, false, device));
    at::Generator gen = LayerGenerator(seed, c.pipeline_layers() - 1, device);
    lm_head_->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x, const Rotary&) override {
    CheckHidden(x, hidden_, "the head");
    return lm_head_(norm_(x));
  }
  Named NamedParametersHf() override {
    return {{"model.norm.weight", norm_->weight}, {"lm_head.weight", lm_head_->weight}};
  }

 private:
  int64_t hidden_;
  RmsNorm norm_{nullptr};
  Dense lm_head_{nullptr};
};

std::shared_ptr<PipelineLayerImpl> MakeLayer(const LlamaConfig& config, int layer, uint64_t seed,
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

// LlamaStage behind the engine's interface.
class LlamaPipelineStage final : public Stage {
 public:
  LlamaPipelineStage(const LlamaConfig& config, const StageOptions& o)
      : config_(config),
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
  std::vector<torch::Tensor> Parameters() override {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : module_->NamedParametersHf()) out.push_back(p);
    return out;
  }
  Named NamedParameters() override { return module_->NamedParametersHf(); }
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
  LlamaConfig config_;
  LlamaStage module_;
  bool defer_wgrad_;
  DeferredSplitBackward split_;
};

// Sizes the layers cannot be built with: Resolve rejects them, but a stage may be asked for with a
// spec that did not go through it.
absl::Status CheckBuildable(const LlamaConfig& c) {
  if (c.vocab < 1 || c.hidden < 1 || c.heads < 1 || c.kv_heads < 1 || c.ffn_hidden < 1 || c.layers < 1 || c.seq < 1 ||
      c.rope_theta <= 0 || c.norm_eps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a Llama needs positive sizes, rope_theta and norm_eps; got vocab ", c.vocab, ", hidden ", c.hidden, ", heads ",
        c.heads, ", kv_heads ", c.kv_heads, ", ffn_hidden ", c.ffn_hidden, ", layers ", c.layers, ", seq ", c.seq,
        ", rope_theta ", c.rope_theta, ", norm_eps ", c.norm_eps, ": resolve the spec with LlamaDescription()"));
  }
  if (c.hidden % c.heads != 0 || c.heads % c.kv_heads != 0 || c.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("heads (", c.heads, ") must divide hidden (", c.hidden,
                                                   ") into an even head size, and kv_heads (", c.kv_heads,
                                                   ") must divide heads"));
  }
  return absl::OkStatus();
}

class LlamaFamily final : public ModelFamily {
 public:
  const ModelDescription& description() const override { return LlamaDescription(); }
  absl::Status Prepare(const JobSpec& job) const override {
    return job.device() == "cuda" ? SelectAttentionKernel(job.model_spec().attention()) : absl::OkStatus();
  }
  std::vector<AttentionCall> AttentionCalls(const JobSpec& job) const override {
    const LlamaConfig c = LlamaConfigFromSpec(job.model_spec());
    // q, k, v: [B, S, N, D] transposed (RotaryHeads' output, and v's view), grouped-query.
    return {AttentionCall{c.heads, c.kv_heads, c.head_dim(), c.seq, /*causal=*/true, /*packed_qkv=*/false}};
  }
  absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageOptions& o) const override {
    if (o.job == nullptr) return absl::InvalidArgumentError("StageOptions.job is null: pass the resolved job");
    const LlamaConfig config = LlamaConfigFromSpec(o.job->model_spec());
    if (absl::Status s = CheckBuildable(config); !s.ok()) return s;
    if (o.first_layer < 0 || o.first_layer >= o.last_layer || o.last_layer > config.pipeline_layers() ||
        o.num_layers != config.pipeline_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a Llama stage holds layers [first, last) of 0..", config.pipeline_layers(), " (num_layers ",
                       config.pipeline_layers(), "), got [", o.first_layer, ", ", o.last_layer, ") of ", o.num_layers));
    }
    // No exception crosses the family's API: allocation or device errors while building become INTERNAL.
    try {
      return std::unique_ptr<Stage>(std::make_unique<LlamaPipelineStage>(config, o));
    } catch (const c10::Error& e) {
      return absl::InternalError(absl::StrCat("building Llama layers [", o.first_layer, ", ", o.last_layer, ") on ",
                                              o.device.str(), ": ", e.what_without_backtrace()));
    }
  }
};

}  // namespace

LlamaConfig LlamaConfigFromSpec(const ModelSpec& m) {
  LlamaConfig c;
  c.vocab = m.vocab();
  c.hidden = m.hidden();
  c.heads = m.heads();
  c.kv_heads = m.kv_heads();
  c.ffn_hidden = m.ffn_hidden();
  c.layers = m.layers();
  c.seq = m.seq();
  c.rope_theta = m.rope_theta();
  c.norm_eps = m.norm_eps();
  c.bf16_autocast = !m.fp32();
  c.fused_rmsnorm = BoolOption(m, ModelSpec::kFusedLayernormFieldNumber);
  auto on = [&](const char* name) { return ModelOptionOn(m, name); };
  c.fused_norm_backward = on("fused_norm_backward");
  c.fused_cross_entropy = on("fused_cross_entropy");
  c.fused_rotary = on("fused_rotary");
  c.fused_swiglu = on("fused_swiglu");
  c.fused_residual_gemm = on("fused_residual_gemm");
  c.cutlass_residual_gemm = on("cutlass_residual_gemm");
  c.fused_residual_grad = on("fused_residual_grad");
  c.fused_embedding_grad = on("fused_embedding_grad");
  return c;
}

LlamaStageImpl::LlamaStageImpl(const LlamaConfig& config, int first, int last, uint64_t seed,
                               const torch::Device& init_device)
    : config_(config), first_(first), last_(last) {
  TORCH_CHECK(0 <= first && first < last && last <= config.pipeline_layers(),
              "a stage holds layers [first, last) of 0..", config.pipeline_layers(), ", got [", first, ", ", last, ")");
  // Each layer draws from its own generator, so the layers can be built on several threads with the
  // same result. On a GPU the draws take milliseconds: built in order on this thread.
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
  // Buffers, so that .to(device) moves them; made once here rather than per forward.
  Rotary r = MakeRotary(config);
  rope_cos_ = register_buffer("rope_cos", r.cos);
  rope_sin_ = register_buffer("rope_sin", r.sin);
}

torch::Tensor LlamaStageImpl::forward(const torch::Tensor& input) {
  std::optional<CudaBf16Autocast> autocast;
  if (config_.bf16_autocast && input.is_cuda()) autocast.emplace();
  const Rotary rotary{rope_cos_, rope_sin_};
  torch::Tensor x = input;
  for (size_t i = 0; i < layers_->size(); ++i) x = layers_->ptr<PipelineLayerImpl>(i)->forward(x, rotary);
  // Stages exchange fp32 hidden states; logits stay as autocast made them (the loss upcasts).
  return has_head() ? x : x.to(torch::kFloat32);
}

std::vector<std::pair<std::string, torch::Tensor>> LlamaStageImpl::NamedParametersHf() {
  Named out;
  for (size_t i = 0; i < layers_->size(); ++i) {
    for (auto& item : layers_->ptr<PipelineLayerImpl>(i)->NamedParametersHf()) out.push_back(std::move(item));
  }
  return out;
}

void LlamaStageImpl::RefreshCasts() {
  if (!config_.bf16_autocast) return;
  RefreshDenseCasts(*this, at::kBFloat16);
}

std::unique_ptr<ModelFamily> MakeLlamaFamily() { return std::make_unique<LlamaFamily>(); }

}  // namespace stagehand
