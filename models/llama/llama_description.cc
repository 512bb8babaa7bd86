// Llama's description (see llama_description.h).
#include "models/llama/llama_description.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "models/decoder_description.h"

namespace stagehand {
namespace {

ModelSpec Preset(const std::string& name) {
  ModelSpec p;
  p.set_family("llama");
  p.set_preset(name);
  if (name == "llama-tiny") {
    p.set_vocab(256);
    p.set_hidden(64);
    p.set_heads(4);
    p.set_kv_heads(2);
    p.set_ffn_hidden(176);
    p.set_layers(4);
    p.set_seq(32);
    p.set_fp32(true);
  } else {  // tinyllama-1.1b
    p.set_vocab(32000);
    p.set_hidden(2048);
    p.set_heads(32);
    p.set_kv_heads(4);
    p.set_ffn_hidden(5632);
    p.set_layers(22);
    p.set_seq(1024);
  }
  p.set_attention("cudnn");
  p.set_rope_theta(10000);
  p.set_norm_eps(1e-5);
  return p;
}

class Llama final : public DecoderDescription {
 public:
  std::string family() const override { return "llama"; }
  std::vector<std::string> presets() const override { return {"llama-tiny", "tinyllama-1.1b"}; }

  absl::StatusOr<ModelSpec> Resolve(const std::string& preset, const ModelSpec& o) const override {
    const std::string name = preset.empty() || preset == "llama" ? "tinyllama-1.1b" : preset;
    if (name != "llama-tiny" && name != "tinyllama-1.1b") {
      return absl::InvalidArgumentError(
          absl::StrCat("--model=", preset, ": not a Llama preset; known: ", absl::StrJoin(presets(), ", ")));
    }
    ModelSpec out = Preset(name);
    if (o.vocab()) out.set_vocab(o.vocab());
    if (o.hidden()) out.set_hidden(o.hidden());
    if (o.heads()) out.set_heads(o.heads());
    if (o.kv_heads()) out.set_kv_heads(o.kv_heads());
    if (o.ffn_hidden()) out.set_ffn_hidden(o.ffn_hidden());
    if (o.layers()) out.set_layers(o.layers());
    if (o.seq()) out.set_seq(o.seq());
    if (o.fp32()) out.set_fp32(true);
    if (!o.attention().empty()) out.set_attention(o.attention());
    if (o.has_fused_layernorm()) out.set_fused_layernorm(o.fused_layernorm());
    if (o.rope_theta() > 0) out.set_rope_theta(o.rope_theta());
    if (o.norm_eps() > 0) out.set_norm_eps(o.norm_eps());
    *out.mutable_options() = o.options();
    if (absl::Status s = CheckCommon(out); !s.ok()) return s;
    if (out.kv_heads() < 1 || out.heads() % out.kv_heads() != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--kv_heads=", out.kv_heads(),
                                                     " must divide --heads=", out.heads(),
                                                     " (grouped-query attention shares each key/value "
                                                     "head among heads / kv_heads query heads)"));
    }
    if ((out.hidden() / out.heads()) % 2 != 0) {
      return absl::InvalidArgumentError(absl::StrCat("rotary embeddings need an even head size; hidden / heads = ",
                                                     out.hidden() / out.heads(), ": change --hidden or --heads"));
    }
    if (out.ffn_hidden() < 1) return absl::InvalidArgumentError("--ffn_hidden must be at least 1");
    if (absl::Status s = CheckOptions(
            out, "llama",
            {"fused_norm_backward", "fused_cross_entropy", "fused_rotary", "fused_swiglu", "fused_residual_gemm",
             "cutlass_residual_gemm", "fused_residual_grad", "fused_embedding_grad"});
        !s.ok()) {
      return s;
    }
    return out;
  }

  double FlopsPerStep(const ModelSpec& m, int64_t sequences, bool inference) const override {
    const double gb = static_cast<double>(sequences), s = m.seq(), l = m.layers(), h = m.hidden(), v = m.vocab();
    const double training = 6 * gb * s * (l * BlockMatmulParams(m) + v * h) + 6 * l * gb * s * s * h;
    return inference ? training / 3 : training;
  }

  int64_t ParameterCount(const ModelSpec& m) const override {
    const int64_t h = m.hidden();
    // Embedding and head (untied); per block the matmuls and two RMSNorm weights; the final RMSNorm.
    return 2 * m.vocab() * h + m.layers() * (static_cast<int64_t>(BlockMatmulParams(m)) + 2 * h) + h;
  }

 protected:
  std::array<LayerCost, kDecoderLayerKinds> KindCosts(const ModelSpec& m, double tokens) const override {
    const double h = m.hidden(), v = m.vocab(), s = m.seq(), f = m.ffn_hidden();
    const double kv = static_cast<double>(m.kv_heads()) * (h / m.heads());
    std::array<LayerCost, kDecoderLayerKinds> c;
    c[static_cast<int>(DecoderLayerKind::kEmbedding)] = Cost(v * h, tokens * h * 10, tokens * h * 4);
    // q, k, v, o and causal attention; the RMSNorm and rotary embedding's intermediates.
    c[static_cast<int>(DecoderLayerKind::kAttention)] =
        Cost(2 * h * h + 2 * h * kv + h, tokens * (4 * h * h + 4 * h * kv + 2 * s * h), tokens * (12 * h + 8 * kv));
    // gate, up, down; the SwiGLU product's intermediates.
    c[static_cast<int>(DecoderLayerKind::kMlp)] = Cost(3 * h * f + h, tokens * 6 * h * f, tokens * (6 * h + 10 * f));
    c[static_cast<int>(DecoderLayerKind::kHead)] = Cost(v * h + h, tokens * 2 * v * h, tokens * v * 10);
    return c;
  }

 private:
  static double BlockMatmulParams(const ModelSpec& m) {
    const double h = m.hidden(), f = m.ffn_hidden();
    const double kv = static_cast<double>(m.kv_heads()) * (h / m.heads());
    return 2 * h * h + 2 * h * kv + 3 * h * f;
  }
};

}  // namespace

const ModelDescription& LlamaDescription() {
  static const Llama* llama = new Llama;
  return *llama;
}

}  // namespace stagehand
