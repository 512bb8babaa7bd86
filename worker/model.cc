// The reference GPT cut into pipeline layers, its loss, fused AdamW and the token sources (model.h).
// Status-returning functions make no LibTorch calls that could throw; forward() and Batch() may throw
// c10::Error, which the executor turns into a Status.
#include "worker/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/fused_kernels.h"

namespace stagehand {
namespace {

namespace F = torch::nn::functional;

// ---------------------------------------------------------------------------------------------------
// Layers. Parameters are registered directly (not through torch::nn::Linear or Embedding, whose
// constructors would first fill them from the global generator: wasted seconds at 1.3B parameters).

// The seed of pipeline layer `layer`: parameters depend on (seed, layer) alone, never on the partition.
at::Generator LayerGenerator(uint64_t seed, int layer) {
  return at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(layer));
}

// One pipeline layer: tokens or hidden states in, hidden states or logits out.
class PipelineLayerImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

// A parameter in a compute dtype, cast again only when the parameter changed: its version counter
// moves with every in-place update (the optimizer's step included) and its storage with .to(device).
// Parameters must be changed in place or replaced, not written through .data(), which would bypass
// the version counter. A fresh cast goes into the same buffer, so a captured CUDA graph that reads the
// copy sees it.
class CastCache {
 public:
  const torch::Tensor& Get(const torch::Tensor& param, at::ScalarType dtype) {
    if (!cast_.defined() || version_ != param._version() || source_ != param.data_ptr() ||
        cast_.scalar_type() != dtype) {
      torch::NoGradGuard no_grad;
      if (cast_.defined() && cast_.scalar_type() == dtype && cast_.device() == param.device() &&
          cast_.sizes() == param.sizes()) {
        cast_.copy_(param);
      } else {
        cast_ = param.detach().to(dtype);
      }
      version_ = param._version();
      source_ = param.data_ptr();
    }
    return cast_;
  }

 private:
  torch::Tensor cast_;
  int64_t version_ = -1;
  const void* source_ = nullptr;
};

// weight.grad += dy^T x, in the weight's dtype (fp32) whatever the dtype of dy and x. On CUDA one GEMM
// with bf16 inputs and an fp32 output (beta = 1) does it; elsewhere (CPU tests) a GEMM and an add.
void AccumulateWeightGrad(torch::Tensor& weight, const torch::Tensor& dy, const torch::Tensor& x) {
  torch::Tensor& grad = weight.mutable_grad();
  const at::ScalarType dtype = weight.scalar_type();
  const bool mixed = dy.scalar_type() != dtype;
  if (!grad.defined()) {
    grad = !mixed ? at::mm(dy.t(), x) : dy.is_cuda() ? at::mm(dy.t(), x, dtype) : at::mm(dy.t(), x).to(dtype);
  } else if (!mixed) {
    grad.addmm_(dy.t(), x);
  } else if (dy.is_cuda()) {
    at::addmm_out(grad, grad, dy.t(), x, dtype);
  } else {
    grad.add_(at::mm(dy.t(), x));
  }
}

// y = x W^T + b with x, W and b already in the compute dtype, whose backward adds the weight gradient
// into the fp32 parameter's .grad itself (and so returns none for it).
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // weight, bias: the parameters; x, weight_c, bias_c: in the compute dtype. Without a bias, both bias
  // arguments are nullopt (apply() takes no undefined tensors) and the edges after the weight's shift.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& weight_c, const std::optional<torch::Tensor>& bias_c) {
    ctx->save_for_backward({x, weight_c});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["has_bias"] = bias.has_value();
    return at::linear(x, weight_c, bias_c);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight_c = saved[1];
    torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    const int64_t out = weight_c.size(0), in = weight_c.size(1);
    const torch::Tensor dy = grads[0].to(weight_c.scalar_type()).reshape({-1, out});
    torch::Tensor dx, db;
    if (ctx->needs_input_grad(0)) dx = at::mm(dy, weight_c).view(x.sizes());
    if (ctx->needs_input_grad(1)) AccumulateWeightGrad(weight, dy, x.reshape({-1, in}));
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2)) {
      db = dy.sum(0, /*keepdim=*/false, weight.scalar_type());
    }
    return {dx, torch::Tensor(), db, torch::Tensor(), torch::Tensor()};
  }
};

// LayerNorm of an fp32 input to a bf16 output in one kernel (fused_kernels.h): what bf16 autocast
// computes for a LayerNorm that feeds a GEMM (LayerNorm in fp32, then a cast), without the fp32 output's
// round trip through memory. The backward is ATen's LayerNorm backward on the fp32 input, with the
// incoming bf16 gradient upcast as the cast's backward would.
class LayerNormToBf16Function : public torch::autograd::Function<LayerNormToBf16Function> {
 public:
  // x: contiguous and 16-byte aligned (NormForGemm checks).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, double eps) {
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    std::vector<int64_t> stats_shape(x.sizes().begin(), x.sizes().end() - 1);
    stats_shape.push_back(1);  // the shape at::native_layer_norm gives its mean and rstd
    torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
    torch::Tensor mean = torch::empty(stats_shape, x.options()), rstd = torch::empty(stats_shape, x.options());
    const cudaError_t e = LayerNormToBf16(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                                          reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()),
                                          mean.data_ptr<float>(), rstd.data_ptr<float>(), rows, cols,
                                          static_cast<float>(eps), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "LayerNormToBf16: ", cudaGetErrorString(e));
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &weight = s[1], &bias = s[2], &mean = s[3], &rstd = s[4];
    auto [dx, dweight, dbias] = at::native_layer_norm_backward(
        grads[0].to(torch::kFloat32), x, {x.size(-1)}, mean, rstd, weight, bias,
        {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    return {dx, dweight, dbias, torch::Tensor()};
  }
};

// ln(x) as the input of a GEMM: with `fused` under bf16 autocast on CUDA, fused with the cast to bf16
// that the GEMM would make; otherwise (CPU, fp32, inputs the kernel does not take) the LayerNorm module.
torch::Tensor NormForGemm(torch::nn::LayerNorm& ln, const torch::Tensor& x, bool fused) {
  auto aligned = [](const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; };
  const bool fuse = fused && x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && aligned(x) &&
                    at::autocast::is_autocast_enabled(at::kCUDA) &&
                    at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16 && ln->weight.defined() &&
                    ln->bias.defined() && ln->weight.scalar_type() == torch::kFloat32 && aligned(ln->weight) &&
                    aligned(ln->bias) && LayerNormToBf16Supports(x.size(-1));
  if (!fuse) return ln(x);
  return LayerNormToBf16Function::apply(x, ln->weight, ln->bias, ln->options.eps());
}

// y = x W^T (+ b). The weight is drawn by the owner, in the owner's fixed order.
//
// Under bf16 autocast a plain at::linear casts the fp32 weight to bf16 on every call, once per
// micro-batch, and autograd then upcasts each micro-batch's bf16 weight gradient and adds it to .grad:
// tens of bytes of memory traffic per parameter per micro-batch (gpt-1.3b, 1F1B over 8 micro-batches
// on 2 x H200: 0.3731 s per step with autocast's casts, 0.3412 s without them). Here, as Megatron-LM's gradient-accumulation fusion does, the bf16 copy is made
// once per optimizer step (CastCache) and the backward accumulates dy^T x into the fp32 .grad with one
// GEMM. The forward and dx are what autocast computes; the weight gradient is summed in fp32 instead of
// being rounded to bf16 per micro-batch first. Without autocast (fp32, the CPU tests) the same function
// runs with the parameters themselves.
class DenseImpl : public torch::nn::Module {
 public:
  DenseImpl(int64_t in, int64_t out, bool bias) {
    weight = register_parameter("weight", torch::empty({out, in}));
    if (bias) this->bias = register_parameter("bias", torch::zeros({out}));
  }
  void InitWeight(double std, at::Generator& gen) {
    torch::NoGradGuard no_grad;
    weight.normal_(0.0, std, gen);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const c10::DeviceType device = x.device().type();
    const bool autocast = at::autocast::is_autocast_enabled(device);
    const at::ScalarType dtype = autocast ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
    const torch::Tensor& w = dtype == weight.scalar_type() ? weight : weight_cast_.Get(weight, dtype);
    std::optional<torch::Tensor> b, bias_param;
    if (bias.defined()) {
      b = dtype == bias.scalar_type() ? bias : bias_cast_.Get(bias, dtype);
      bias_param = bias;
    }
    const torch::Tensor xc = x.scalar_type() == dtype ? x : x.to(dtype);
    // at::linear, not F::linear: for [B, S, in] inputs the C++ frontend's F::linear does a matmul and
    // then a separate bias add, where at::linear folds the bias into the GEMM as Python does.
    if (!torch::GradMode::is_enabled() || !(xc.requires_grad() || weight.requires_grad())) {
      return at::linear(xc, w, b);
    }
    return LinearFunction::apply(xc, weight, bias_param, w, b);
  }
  // Brings the cast copies up to date now rather than at the next forward.
  void RefreshCasts(at::ScalarType dtype) {
    weight_cast_.Get(weight, dtype);
    if (bias.defined()) bias_cast_.Get(bias, dtype);
  }

  torch::Tensor weight, bias;

 private:
  CastCache weight_cast_, bias_cast_;
};
TORCH_MODULE(Dense);

class EmbeddingImpl : public PipelineLayerImpl {
 public:
  EmbeddingImpl(const GptConfig& c, uint64_t seed) {
    weight_ = register_parameter("weight", torch::empty({c.vocab, c.hidden}));
    at::Generator gen = LayerGenerator(seed, 0);
    torch::NoGradGuard no_grad;
    weight_.normal_(0.0, 0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                "the first stage takes token ids [B, S] int64, got ", tokens.sizes(), " ", tokens.scalar_type());
    return torch::embedding(weight_, tokens);
  }

 private:
  torch::Tensor weight_;
};

// A transformer block is two pipeline layers, so that a partition can cut between its halves: the
// attention half (x + proj(attention(ln1(x)))) and the MLP half (x + fc2(gelu(fc1(ln2(x))))). A whole
// block of gpt-1.3b is 0.82 ms of forward and backward per sequence on an H200 (attention 0.3, MLP 0.5),
// too coarse to balance two stages when the head alone is 1.1 ms.
class AttentionImpl : public PipelineLayerImpl {
 public:
  AttentionImpl(const GptConfig& c, int layer, uint64_t seed)
      : hidden_(c.hidden), heads_(c.heads), fused_layernorm_(c.fused_layernorm) {
    ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    qkv_ = register_module("qkv", Dense(c.hidden, 3 * c.hidden, true));
    proj_ = register_module("proj", Dense(c.hidden, c.hidden, true));
    at::Generator gen = LayerGenerator(seed, layer);
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
    auto qkv = qkv_(NormForGemm(ln1_, x, fused_layernorm_)).view({b, s, 3, heads_, hidden_ / heads_}).permute({2, 0, 3, 1, 4}).unbind(0);
    auto att = at::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], {}, 0.0, /*is_causal=*/true);
    // Under autocast the branch comes out bf16; adding it to the fp32 stream keeps it fp32.
    return x + proj_(att.transpose(1, 2).reshape({b, s, hidden_}));
  }

 private:
  int64_t hidden_, heads_;
  bool fused_layernorm_;
  torch::nn::LayerNorm ln1_{nullptr};
  Dense qkv_{nullptr}, proj_{nullptr};
};

class MlpImpl : public PipelineLayerImpl {
 public:
  MlpImpl(const GptConfig& c, int layer, uint64_t seed) : hidden_(c.hidden), fused_layernorm_(c.fused_layernorm) {
    ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    fc1_ = register_module("fc1", Dense(c.hidden, 4 * c.hidden, true));
    fc2_ = register_module("fc2", Dense(4 * c.hidden, c.hidden, true));
    at::Generator gen = LayerGenerator(seed, layer);
    fc1_->InitWeight(0.02, gen);
    fc2_->InitWeight(0.02 / std::sqrt(2.0 * c.layers), gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "an MLP layer takes hidden states [B, S, ", hidden_, "], got ",
                x.sizes());
    return x + fc2_(at::gelu(fc1_(NormForGemm(ln2_, x, fused_layernorm_))));  // exact (erf) GELU, as torch's default
  }

 private:
  int64_t hidden_;
  bool fused_layernorm_;
  torch::nn::LayerNorm ln2_{nullptr};
  Dense fc1_{nullptr}, fc2_{nullptr};
};

class HeadImpl : public PipelineLayerImpl {
 public:
  HeadImpl(const GptConfig& c, uint64_t seed) : hidden_(c.hidden), fused_layernorm_(c.fused_layernorm) {
    ln_f_ = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
    lm_head_ = register_module("lm_head", Dense(c.hidden, c.vocab, false));
    at::Generator gen = LayerGenerator(seed, c.pipeline_layers() - 1);
    lm_head_->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "the head takes hidden states [B, S, ", hidden_, "], got ",
                x.sizes());
    return lm_head_(NormForGemm(ln_f_, x, fused_layernorm_));
  }

 private:
  int64_t hidden_;
  bool fused_layernorm_;
  torch::nn::LayerNorm ln_f_{nullptr};
  Dense lm_head_{nullptr};
};

std::shared_ptr<PipelineLayerImpl> MakeLayer(const GptConfig& config, int layer, uint64_t seed) {
  switch (GptLayerKindOf(layer, config.layers)) {
    case GptLayerKind::kEmbedding: return std::make_shared<EmbeddingImpl>(config, seed);
    case GptLayerKind::kAttention: return std::make_shared<AttentionImpl>(config, layer, seed);
    case GptLayerKind::kMlp: return std::make_shared<MlpImpl>(config, layer, seed);
    case GptLayerKind::kHead: return std::make_shared<HeadImpl>(config, seed);
  }
  return nullptr;
}

// bf16 autocast on CUDA for one forward, restoring what was there before. Like Python's
// torch.autocast, the cache of cast weights is dropped when the outermost region ends: a cached bf16
// copy would go stale once the optimizer updates the fp32 weight in place.
class CudaBf16Autocast {
 public:
  CudaBf16Autocast()
      : was_enabled_(at::autocast::is_autocast_enabled(at::kCUDA)),
        old_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)) {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CudaBf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, old_dtype_);
  }
  CudaBf16Autocast(const CudaBf16Autocast&) = delete;
  CudaBf16Autocast& operator=(const CudaBf16Autocast&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType old_dtype_;
};

// ---------------------------------------------------------------------------------------------------
// Randomness for the token sources: splitmix64, cheap enough to draw one number per token.

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix64(state_++ * 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, n); the modulo bias is below 2^-40 for the n used here.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// One stream per batch row, from (seed, step, index, row): independent of how batches are split up.
SplitMix64 RowRng(uint64_t seed, int64_t step, int64_t index, int64_t row) {
  uint64_t h = Mix64(seed ^ 0x5eed5eed5eed5eedULL);
  h = Mix64(h ^ static_cast<uint64_t>(step));
  h = Mix64(h ^ static_cast<uint64_t>(index));
  return SplitMix64(Mix64(h ^ static_cast<uint64_t>(row)));
}

// Each sequence starts at a random token; the next token is succ[previous] with probability 9/10,
// else uniform. The best achievable loss is about 0.9 nats at vocab 256 (against ln 256 = 5.55).
class SyntheticCorpus : public TokenSource {
 public:
  SyntheticCorpus(const GptConfig& config, uint64_t seed) : seq_(config.seq), seed_(seed), succ_(config.vocab) {
    // A random permutation (Fisher-Yates): every token has a successor and is some token's successor.
    std::iota(succ_.begin(), succ_.end(), int64_t{0});
    SplitMix64 rng(Mix64(seed ^ 0x5ccc5ccc5ccc5cccULL));
    for (size_t i = succ_.size(); i > 1; --i) std::swap(succ_[i - 1], succ_[rng.Below(i)]);
  }
  torch::Tensor Batch(int64_t step, int64_t index, int64_t batch) const override {
    TORCH_CHECK(batch >= 0, "batch must be >= 0, got ", batch);
    auto out = torch::empty({batch, seq_ + 1}, torch::kLong);
    int64_t* p = out.data_ptr<int64_t>();
    const uint64_t vocab = succ_.size();
    for (int64_t row = 0; row < batch; ++row) {
      SplitMix64 rng = RowRng(seed_, step, index, row);
      int64_t token = rng.Below(vocab);
      *p++ = token;
      for (int64_t t = 0; t < seq_; ++t) {
        token = rng.Below(10) != 0 ? succ_[token] : static_cast<int64_t>(rng.Below(vocab));
        *p++ = token;
      }
    }
    return out;
  }

 private:
  int64_t seq_;
  uint64_t seed_;
  std::vector<int64_t> succ_;
};

// A read-only mapping of a file of uint16 tokens (little-endian, as nanoGPT's prepare.py writes them
// with numpy on x86), unmapped when the source goes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read as little-endian uint16");

class TokenFile : public TokenSource {
 public:
  TokenFile(const uint16_t* tokens, size_t count, size_t mapped_bytes, int64_t seq, uint64_t seed)
      : tokens_(tokens), count_(count), mapped_bytes_(mapped_bytes), seq_(seq), seed_(seed) {}
  ~TokenFile() override { munmap(const_cast<uint16_t*>(tokens_), mapped_bytes_); }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  torch::Tensor Batch(int64_t step, int64_t index, int64_t batch) const override {
    TORCH_CHECK(batch >= 0, "batch must be >= 0, got ", batch);
    auto out = torch::empty({batch, seq_ + 1}, torch::kLong);
    int64_t* p = out.data_ptr<int64_t>();
    const uint64_t offsets = count_ - seq_;  // windows of seq+1 tokens start at 0 .. count - seq - 1
    for (int64_t row = 0; row < batch; ++row) {
      const uint16_t* window = tokens_ + RowRng(seed_, step, index, row).Below(offsets);
      for (int64_t t = 0; t <= seq_; ++t) *p++ = window[t];
    }
    return out;
  }

 private:
  const uint16_t* tokens_;
  size_t count_, mapped_bytes_;
  int64_t seq_;
  uint64_t seed_;
};

// Only the first tokens are checked against the vocabulary: reading a whole multi-GB file at startup
// would cost seconds, and a file written for another tokenizer shows itself in its first megabytes.
constexpr size_t kTokensChecked = size_t{4} << 20;  // 8 MiB

absl::Status CheckTokens(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab) {
  const size_t n = std::min(count, kTokensChecked);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": token ", tokens[i], " at position ", i,
                                                     " is not below the vocabulary size ", vocab,
                                                     "; use a file made with the model's tokenizer or a larger vocab"));
    }
  }
  return absl::OkStatus();
}

absl::Status Positive(const char* name, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("model ", name, " must be positive, got ", value));
}

}  // namespace

// -----------------------------------------------------------------------------------------------------

absl::StatusOr<GptConfig> GptPreset(const std::string& name) {
  GptConfig config;  // the defaults are the reference sizes
  if (name == "gpt-1.3b") return config;
  if (name == "tiny") {
    config.vocab = 256;
    config.hidden = 64;
    config.heads = 4;
    config.layers = 4;
    config.seq = 32;
    config.bf16_autocast = false;
    return config;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model preset '", name, "'; the known presets are tiny and gpt-1.3b"));
}

absl::Status ValidateConfig(const GptConfig& c) {
  for (const auto& [name, value] : {std::pair<const char*, int64_t>{"vocab", c.vocab},
                                    {"hidden", c.hidden},
                                    {"heads", c.heads},
                                    {"layers", c.layers},
                                    {"seq", c.seq}}) {
    if (absl::Status s = Positive(name, value); !s.ok()) return s;
  }
  if (c.hidden % c.heads != 0) {
    const int64_t lower = c.hidden - c.hidden % c.heads;
    return absl::InvalidArgumentError(absl::StrCat(
        "model hidden size ", c.hidden, " is not divisible by the number of heads ", c.heads, "; use hidden ",
        lower > 0 ? absl::StrCat(lower, " or ") : "", lower + c.heads, ", or a number of heads that divides ",
        c.hidden));
  }
  return absl::OkStatus();
}

GptStageImpl::GptStageImpl(const GptConfig& config, int first, int last, uint64_t seed)
    : config_(config), first_(first), last_(last) {
  TORCH_CHECK(0 <= first && first < last && last <= config.pipeline_layers(),
              "a stage holds layers [first, last) of 0..", config.pipeline_layers(), ", got [", first, ", ", last, ")");
  // Each layer draws from its own generator, so layers can be built on several threads with the same
  // result: the 1.3B model's normal draws are serial within a tensor and take seconds.
  std::vector<std::shared_ptr<PipelineLayerImpl>> built(last - first);
  at::parallel_for(first, last, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) built[i - first] = MakeLayer(config, i, seed);
  });
  layers_ = register_module("layers", torch::nn::ModuleList());
  for (auto& layer : built) layers_->push_back(std::move(layer));
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
  for (const auto& module : modules(/*include_self=*/false)) {
    auto* dense = dynamic_cast<DenseImpl*>(module.get());
    if (dense != nullptr && dense->weight.is_cuda()) dense->RefreshCasts(at::kBFloat16);
  }
}

absl::Status SelectAttentionKernel(const std::string& kernel) {
  using B = at::SDPBackend;
  using Order = std::array<B, at::num_sdp_backends>;
  // LibTorch's own order, as it stood before any choice here.
  static const Order initial = at::globalContext().sDPPriorityOrder();
  Order order;
  if (kernel == "cudnn" || kernel.empty()) {
    // For gpt-1.3b's shapes on an H200 (bf16, 16 heads of 128, causal, 1024 tokens), cuDNN's forward
    // takes 50 us per 4 sequences where FlashAttention-2 takes 93 (bench/probes/block_parts.py).
    order = {B::cudnn_attention, B::flash_attention, B::efficient_attention, B::math, B::overrideable};
  } else if (kernel == "flash") {
    order = {B::flash_attention, B::efficient_attention, B::math, B::cudnn_attention, B::overrideable};
  } else if (kernel == "torch") {
    order = initial;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("attention kernel ", kernel, ": unknown; use ", AttentionKernelChoices()));
  }
  std::vector<int64_t> v;
  for (B b : order) v.push_back(static_cast<int64_t>(b));
  at::globalContext().setSDPPriorityOrder(v);
  return absl::OkStatus();
}

torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // (log_softmax's half_to_float would skip the fp32 copy of the logits, but torch 2.11's CUDA kernel
  // takes it for fp16 only: "conversion is supported for Half type only" for bf16.)
  return F::cross_entropy(logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
                          targets.to(logits.device()).reshape({-1}));
}

// -----------------------------------------------------------------------------------------------------

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, double lr, double beta1, double beta2, double eps,
                       double weight_decay)
    : params_(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  steps_.resize(params_.size());
}

void FusedAdamW::Step() {
  torch::NoGradGuard no_grad;
  // One fused call per (device, dtype): the kernel wants every list on one device, in one dtype.
  struct Group {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
  };
  std::map<std::tuple<int, int, int>, Group> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    if (!steps_[i].defined()) {  // state is created on first use, where the parameter lives then
      exp_avg_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      exp_avg_sq_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      steps_[i] = torch::zeros({}, p.options().dtype(torch::kFloat32));
    }
    Group& g = groups[{static_cast<int>(p.device().type()), p.device().index(), static_cast<int>(p.scalar_type())}];
    g.params.push_back(p);
    g.grads.push_back(p.grad());
    g.exp_avgs.push_back(exp_avg_[i]);
    g.exp_avg_sqs.push_back(exp_avg_sq_[i]);
    g.steps.push_back(steps_[i]);
  }
  for (auto& [key, g] : groups) {
    at::_foreach_add_(g.steps, 1);  // the kernel reads the step count; as torch.optim, we advance it
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, lr_, beta1_,
                      beta2_, weight_decay_, eps_, /*amsgrad=*/false, /*maximize=*/false);
    // The fused kernel writes the parameters without moving their version counters (torch 2.11); move
    // them, so that anything keyed on them (the linear layers' bf16 copies) sees the update.
    for (const torch::Tensor& p : g.params) torch::autograd::impl::bump_version(p);
  }
}

void FusedAdamW::ZeroGrad(bool set_to_none) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> defined;
  for (torch::Tensor& p : params_) {
    torch::Tensor& g = p.mutable_grad();
    if (set_to_none) {
      g.reset();
    } else if (g.defined()) {
      defined.push_back(g);
    } else {
      g = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    }
  }
  if (!defined.empty()) at::_foreach_zero_(defined);  // one launch (per chunk) for all of them
}

// -----------------------------------------------------------------------------------------------------

std::unique_ptr<TokenSource> MakeSyntheticCorpus(const GptConfig& config, uint64_t seed) {
  return std::make_unique<SyntheticCorpus>(config, seed);
}

absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path, const GptConfig& config,
                                                           uint64_t seed) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open token file ", path, ": ", std::strerror(errno),
                                                   "; pass a file of uint16 tokens (nanoGPT's train.bin layout)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is not a regular file"));
  }
  const size_t bytes = st.st_size, count = bytes / 2;
  if (bytes % 2 != 0 || count < static_cast<size_t>(config.seq) + 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " has ", bytes, " bytes", bytes % 2 != 0 ? ", an odd number (truncated?)" : "",
        "; it must hold whole uint16 tokens, at least seq + 1 = ", config.seq + 1, " of them"));
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot map token file ", path, ": ", std::strerror(mmap_errno)));
  }
  const auto* tokens = static_cast<const uint16_t*>(mapped);
  if (absl::Status s = CheckTokens(path, tokens, count, config.vocab); !s.ok()) {
    munmap(mapped, bytes);
    return s;
  }
  return std::unique_ptr<TokenSource>(std::make_unique<TokenFile>(tokens, count, bytes, config.seq, seed));
}

}  // namespace stagehand
