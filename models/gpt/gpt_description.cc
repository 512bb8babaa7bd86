// The GPT's description (see gpt_description.h).
#include "models/gpt/gpt_description.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/decoder_description.h"

namespace stagehand {
namespace {

ModelSpec Preset(const std::string& name) {
  ModelSpec p;
  p.set_family("gpt");
  p.set_preset(name);
  if (name == "tiny") {
    p.set_vocab(256);
    p.set_hidden(64);
    p.set_heads(4);
    p.set_layers(4);
    p.set_seq(32);
    p.set_fp32(true);
  } else {  // gpt-1.3b: ../shared/targets.md
    p.set_vocab(32768);
    p.set_hidden(2048);
    p.set_heads(16);
    p.set_layers(24);
    p.set_seq(1024);
  }
  p.set_attention("cudnn");
  p.set_norm_eps(1e-5);
  return p;
}

class Gpt final : public DecoderDescription {
 public:
  std::string family() const override { return "gpt"; }
  std::vector<std::string> presets() const override { return {"tiny", "gpt-1.3b"}; }

  absl::StatusOr<ModelSpec> Resolve(const std::string& preset, const ModelSpec& o) const override {
    const std::string name = preset.empty() || preset == "gpt" ? "gpt-1.3b" : preset;
    if (name != "tiny" && name != "gpt-1.3b") {
      return absl::InvalidArgumentError(
          absl::StrCat("--model=", preset, ": not a GPT preset; known: ", absl::StrJoin(presets(), ", ")));
    }
    if (o.has_kv_heads() || o.has_ffn_hidden() || o.has_rope_theta()) {
      return absl::InvalidArgumentError(
          "--kv_heads, --ffn_hidden and rope_theta are Llama's sizes; the GPT has full multi-head attention, "
          "a 4 x hidden MLP and no rotary embedding: drop them or pass a llama model");
    }
    ModelSpec out = Preset(name);
    if (o.vocab()) out.set_vocab(o.vocab());
    if (o.hidden()) out.set_hidden(o.hidden());
    if (o.heads()) out.set_heads(o.heads());
    if (o.layers()) out.set_layers(o.layers());
    if (o.seq()) out.set_seq(o.seq());
    if (o.fp32()) out.set_fp32(true);
    if (!o.attention().empty()) out.set_attention(o.attention());
    if (o.has_fused_layernorm()) out.set_fused_layernorm(o.fused_layernorm());
    if (o.norm_eps() > 0) out.set_norm_eps(o.norm_eps());
    *out.mutable_options() = o.options();
    if (absl::Status s = CheckCommon(out); !s.ok()) return s;
    if (absl::Status s = CheckOptions(out, "gpt",
                                      {"fused_qkv_grad", "fused_norm_backward", "fused_cross_entropy",
                                       "fused_residual_grad", "fused_gelu", "fused_gelu_gemm", "fused_residual_gemm",
                                       "cutlass_residual_gemm", "fused_bias_grad", "fused_embedding_grad"});
        !s.ok()) {
      return s;
    }
    return out;
  }

  double FlopsPerStep(const ModelSpec& m, int64_t sequences, bool inference) const override {
    const double gb = static_cast<double>(sequences), s = m.seq(), l = m.layers(), h = m.hidden(), v = m.vocab();
    const double training = 6 * gb * s * (12 * l * h * h + v * h) + 6 * l * gb * s * s * h;
    // Forward only is one of training's three passes (forward, gradients of inputs, of weights).
    return inference ? training / 3 : training;
  }

  int64_t ParameterCount(const ModelSpec& m) const override {
    const int64_t h = m.hidden();
    // Embedding and head (untied), per block qkv, proj, fc1, fc2 with biases and two LayerNorms, ln_f.
    return 2 * m.vocab() * h + m.layers() * (12 * h * h + 13 * h) + 2 * h;
  }

 protected:
  std::array<LayerCost, kDecoderLayerKinds> KindCosts(const ModelSpec& m, double tokens) const override {
    const double h = m.hidden(), v = m.vocab(), s = m.seq();
    std::array<LayerCost, kDecoderLayerKinds> c;
    // The embedding is a gather: little time, but its gradient is a dense V x H scatter.
    c[static_cast<int>(DecoderLayerKind::kEmbedding)] = Cost(v * h, tokens * h * 10, tokens * h * 4);
    // A block's attention half (ln1, qkv, proj; matmuls + causal attention) and MLP half (ln2, fc1, fc2).
    c[static_cast<int>(DecoderLayerKind::kAttention)] =
        Cost(4 * h * h + 6 * h, tokens * (8 * h * h + 2 * s * h), tokens * h * 16);
    c[static_cast<int>(DecoderLayerKind::kMlp)] = Cost(8 * h * h + 7 * h, tokens * 16 * h * h, tokens * h * 24);
    // The head: vocabulary projection and the loss; logits in bf16 plus the fp32 loss and its gradient.
    c[static_cast<int>(DecoderLayerKind::kHead)] = Cost(v * h + 2 * h, tokens * 2 * v * h, tokens * v * 10);
    return c;
  }
};

}  // namespace

const ModelDescription& GptDescription() {
  static const Gpt* gpt = new Gpt;
  return *gpt;
}

}  // namespace stagehand
