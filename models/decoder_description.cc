// The decoder layout shared by GPT and Llama (see decoder_description.h).
#include "models/decoder_description.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nn/attention_kernels.h"

namespace stagehand {

std::string DecoderDescription::DescribeLayers(const ModelSpec& spec) const {
  return absl::StrCat("the embedding, ", spec.layers(),
                      " blocks of two halves (attention, MLP), the head: ", NumLayers(spec), " pipeline layers");
}

LayerProfile DecoderDescription::Estimate(const ModelSpec& spec, int64_t micro_batch) const {
  const std::array<LayerCost, kDecoderLayerKinds> costs =
      KindCosts(spec, static_cast<double>(micro_batch) * static_cast<double>(spec.seq()));
  LayerProfile p;
  p.set_micro_batch(micro_batch);
  for (int i = 0; i < NumLayers(spec); ++i) *p.add_layers() = costs[LayerKind(spec, i)];
  return p;
}

absl::Status DecoderDescription::CheckCommon(const ModelSpec& spec) {
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab", spec.vocab()},
                         {"hidden", spec.hidden()},
                         {"heads", spec.heads()},
                         {"layers", spec.layers()},
                         {"seq", spec.seq()}}) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("--", name, "=", v, ": must be at least 1"));
  }
  if (!IsAttentionKernel(spec.attention())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--attention=", spec.attention(), ": unknown; use ", AttentionKernelChoices()));
  }
  if (spec.hidden() % spec.heads() != 0) {
    const int64_t lower = spec.hidden() - spec.hidden() % spec.heads();
    return absl::InvalidArgumentError(
        absl::StrCat("--hidden=", spec.hidden(), " is not divisible by --heads=", spec.heads(),
                     "; use --hidden=", lower > 0 ? absl::StrCat(lower, " or ") : "", lower + spec.heads(),
                     ", or a number of heads that divides ", spec.hidden()));
  }
  return absl::OkStatus();
}

absl::Status DecoderDescription::CheckOptions(const ModelSpec& spec, const std::string& family,
                                              const std::vector<std::string>& own) {
  std::vector<std::string> known = {"fused_optimizer", "inference_bf16_weights", "deferred_wgrad"};
  known.insert(known.end(), own.begin(), own.end());
  for (const auto& [name, value] : spec.options()) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(absl::StrCat("--model_option=", name, "=", value, ": ", family,
                                                     " has no such option; it knows ", absl::StrJoin(known, ", ")));
    }
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--model_option=", name, "=", value, ": use ", name, "=true or ", name, "=false"));
    }
  }
  return absl::OkStatus();
}

LayerCost DecoderDescription::Cost(double params, double forward_flops, double activation_bytes) {
  constexpr double kFlopsPerMs = 400e12 / 1e3;
  LayerCost c;
  c.set_forward_ms(forward_flops / kFlopsPerMs);
  c.set_backward_ms(2 * forward_flops / kFlopsPerMs);
  c.set_param_bytes(static_cast<int64_t>(params * 16));  // fp32 parameter, gradient, two AdamW moments
  c.set_activation_bytes(static_cast<int64_t>(activation_bytes));
  return c;
}

}  // namespace stagehand
