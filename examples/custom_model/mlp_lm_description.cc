// The description of "mlp-lm" (see mlp_lm_description.h).
#include "examples/custom_model/mlp_lm_description.h"

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagehand::examples {
namespace {

constexpr char kFamily[] = "mlp-lm";
constexpr char kTiny[] = "mlp-lm-tiny";
constexpr char kWidthOption[] = "width_multiplier";
constexpr int64_t kDefaultWidthMultiplier = 4;

ModelSpec Tiny() {
  ModelSpec p;
  p.set_family(kFamily);
  p.set_preset(kTiny);
  p.set_vocab(256);
  p.set_hidden(64);
  p.set_layers(4);
  p.set_seq(32);
  p.set_fp32(true);
  return p;
}

// Sizes other families read mean nothing here: refuse them rather than ignore them silently.
absl::Status CheckUnused(const ModelSpec& o) {
  if (o.has_heads() || o.has_kv_heads() || o.has_ffn_hidden() || o.has_rope_theta() || !o.attention().empty() ||
      o.has_fused_layernorm()) {
    return absl::InvalidArgumentError(
        "--heads, --kv_heads, --ffn_hidden, --rope_theta, --attention and --fused_layernorm are for attention "
        "models; mlp-lm has no attention: drop them (its MLP width is --model_option=width_multiplier=N)");
  }
  for (const auto& [key, value] : o.options()) {
    if (key != kWidthOption) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_option=", key, "=", value, ": mlp-lm has no such option; it knows ", kWidthOption));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSizes(const ModelSpec& m) {
  for (auto [name, v, least] : {std::tuple<const char*, int64_t, int64_t>{"vocab", m.vocab(), 2},
                                {"hidden", m.hidden(), 1},
                                {"layers", m.layers(), 1},
                                {"seq", m.seq(), 1}}) {
    if (v < least) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", v, ": mlp-lm needs at least ", least));
    }
  }
  return MlpLmWidth(m).status();
}

// A layer's cost from its parameters, forward FLOPs and bytes kept for the backward, at an assumed rate
// (only ratios matter to the planner): backward twice the forward; fp32 parameter, gradient and two
// AdamW moments.
LayerCost Cost(double params, double forward_flops, double activation_bytes) {
  constexpr double kFlopsPerMs = 400e12 / 1e3;
  LayerCost c;
  c.set_forward_ms(forward_flops / kFlopsPerMs);
  c.set_backward_ms(2 * forward_flops / kFlopsPerMs);
  c.set_param_bytes(static_cast<int64_t>(params * 16));
  c.set_activation_bytes(static_cast<int64_t>(activation_bytes));
  return c;
}

class MlpLm final : public ModelDescription {
 public:
  std::string family() const override { return kFamily; }
  std::vector<std::string> presets() const override { return {kTiny}; }

  absl::StatusOr<ModelSpec> Resolve(const std::string& preset, const ModelSpec& o) const override {
    if (!preset.empty() && preset != kFamily && preset != kTiny) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model=", preset, ": not an mlp-lm preset; use ", kTiny, " (or ", kFamily, ")"));
    }
    if (absl::Status s = CheckUnused(o); !s.ok()) return s;
    ModelSpec out = Tiny();
    if (o.vocab()) out.set_vocab(o.vocab());
    if (o.hidden()) out.set_hidden(o.hidden());
    if (o.layers()) out.set_layers(o.layers());
    if (o.seq()) out.set_seq(o.seq());
    if (o.fp32()) out.set_fp32(true);
    if (o.norm_eps() > 0) out.set_norm_eps(o.norm_eps());
    *out.mutable_options() = o.options();
    if (absl::Status s = CheckSizes(out); !s.ok()) return s;
    return out;
  }

  int NumLayers(const ModelSpec& spec) const override { return Sizes(spec).layers() + 2; }
  int NumLayerKinds() const override { return 3; }
  int LayerKind(const ModelSpec& spec, int layer) const override {
    if (layer == 0) return kMlpLmEmbedding;
    return layer == NumLayers(spec) - 1 ? kMlpLmHead : kMlpLmBlock;
  }
  std::string LayerKindName(int kind) const override {
    return kind == kMlpLmEmbedding ? "embedding" : kind == kMlpLmBlock ? "block" : "head";
  }
  std::string DescribeLayers(const ModelSpec& spec) const override {
    return absl::StrCat("the embedding, ", Sizes(spec).layers(), " residual MLP blocks, the head: ", NumLayers(spec),
                        " pipeline layers");
  }

  LayerProfile Estimate(const ModelSpec& spec, int64_t micro_batch) const override {
    const ModelSpec m = Sizes(spec);
    const double t = static_cast<double>(micro_batch) * m.seq(), h = m.hidden(), v = m.vocab(), w = Width(m);
    // The embedding is a gather (its gradient a scatter); a block is two matmuls, keeping its input,
    // W1 x and gelu(W1 x); the head is one matmul, keeping the logits and the loss's fp32 softmax.
    const LayerCost kinds[] = {Cost(v * h, t * h, t * 8), Cost(2 * h * w + w + h, 4 * t * h * w, t * (4 * h + 8 * w)),
                               Cost(v * h, 2 * t * v * h, t * (4 * h + 8 * v))};
    LayerProfile p;
    p.set_micro_batch(micro_batch);
    for (int i = 0; i < NumLayers(m); ++i) *p.add_layers() = kinds[LayerKind(m, i)];
    return p;
  }

  double FlopsPerStep(const ModelSpec& spec, int64_t sequences, bool inference) const override {
    const ModelSpec m = Sizes(spec);
    const double tokens = static_cast<double>(sequences) * m.seq(), h = m.hidden(), v = m.vocab(), w = Width(m);
    // Matmuls only: 2 FLOPs per multiply-add forward, twice that backward (inputs' and weights' gradients).
    const double forward = 2 * tokens * (m.layers() * 2 * h * w + v * h);
    return inference ? forward : 3 * forward;
  }

  int64_t ParameterCount(const ModelSpec& spec) const override {
    const ModelSpec m = Sizes(spec);
    const int64_t h = m.hidden(), w = Width(m);
    // Embedding and head (untied, the head without bias); per block W1, W2 and their biases.
    return 2 * m.vocab() * h + m.layers() * (2 * h * w + w + h);
  }

 private:
  // The launcher resolves only the built-in families today, so a worker may be handed the job's sizes
  // as given, zeros unset: fill them from the preset, so that every method sees the model MakeStage builds.
  static ModelSpec Sizes(const ModelSpec& spec) {
    absl::StatusOr<ModelSpec> m = MlpLmDescription().Resolve("", spec);
    return m.ok() ? *std::move(m) : spec;
  }
  static int64_t Width(const ModelSpec& m) {
    absl::StatusOr<int64_t> w = MlpLmWidth(m);
    return w.ok() ? *w : kDefaultWidthMultiplier * m.hidden();
  }
};

}  // namespace

const ModelDescription& MlpLmDescription() {
  static const MlpLm* d = new MlpLm;
  return *d;
}

absl::StatusOr<int64_t> MlpLmWidth(const ModelSpec& spec) {
  auto it = spec.options().find(kWidthOption);
  if (it == spec.options().end()) return kDefaultWidthMultiplier * spec.hidden();
  int64_t k = 0;
  if (!absl::SimpleAtoi(it->second, &k) || k < 1 || k > 64) {
    return absl::InvalidArgumentError(absl::StrCat("--model_option=", kWidthOption, "=", it->second,
                                                   ": expected a whole number from 1 to 64 (the default is ",
                                                   kDefaultWidthMultiplier, ")"));
  }
  return k * spec.hidden();
}

}  // namespace stagehand::examples
