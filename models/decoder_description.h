// What GPT and Llama share as descriptions: the decoder's pipeline layers (embedding, block halves,
// head), the common size checks and the way an estimate is laid out over the layers. A family fills in
// its presets, its own checks, per-kind costs and FLOPs.
#ifndef STAGEHAND_MODELS_DECODER_DESCRIPTION_H_
#define STAGEHAND_MODELS_DECODER_DESCRIPTION_H_

#include <array>
#include <string>
#include <vector>

#include "models/decoder_layers.h"
#include "models/model_description.h"

namespace stagehand {

class DecoderDescription : public ModelDescription {
 public:
  int NumLayers(const ModelSpec& spec) const override { return DecoderPipelineLayers(spec.layers()); }
  int NumLayerKinds() const override { return kDecoderLayerKinds; }
  int LayerKind(const ModelSpec& spec, int layer) const override {
    return static_cast<int>(DecoderLayerKindOf(layer, spec.layers()));
  }
  std::string LayerKindName(int kind) const override {
    return DecoderLayerKindName(static_cast<DecoderLayerKind>(kind));
  }
  std::string DescribeLayers(const ModelSpec& spec) const override;
  LayerProfile Estimate(const ModelSpec& spec, int64_t micro_batch) const override;

 protected:
  // Costs of one layer of each kind (indexed by DecoderLayerKind) at `tokens` tokens per micro-batch.
  virtual std::array<LayerCost, kDecoderLayerKinds> KindCosts(const ModelSpec& spec, double tokens) const = 0;
  // Checks every family needs (positive sizes, a known attention kernel, hidden divisible by heads).
  static absl::Status CheckCommon(const ModelSpec& spec);
  // --model_option: each name one of the engine's (fused_optimizer, inference_bf16_weights,
  // deferred_wgrad) or the family's `own` (its fused paths), each value true or false (the worker reads
  // anything but "false" as on, so a typo or an "off" would otherwise pass silently).
  static absl::Status CheckOptions(const ModelSpec& spec, const std::string& family,
                                   const std::vector<std::string>& own);
  // A layer's cost from its parameters, forward FLOPs and bytes kept for the backward, at an assumed
  // H100/H200-class bf16 rate (only ratios matter): backward twice the forward, parameter memory with
  // gradient and two AdamW moments.
  static LayerCost Cost(double params, double forward_flops, double activation_bytes);
};

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_DECODER_DESCRIPTION_H_
