// The pipeline layers of a decoder (GPT and Llama alike), in one place for the models, the estimates
// and the profile: layer 0 is the token embedding, layers 2b-1 and 2b the attention and MLP halves of
// block b = 1..L (so that a partition can cut a block in two), layer 2L+1 the head. No LibTorch and no
// protobuf.
#ifndef STAGEHAND_MODELS_DECODER_LAYERS_H_
#define STAGEHAND_MODELS_DECODER_LAYERS_H_

#include <cstdint>

namespace stagehand {

enum class DecoderLayerKind { kEmbedding, kAttention, kMlp, kHead };
constexpr int kDecoderLayerKinds = 4;

constexpr int64_t DecoderPipelineLayers(int64_t blocks) { return 2 * blocks + 2; }

// The kind of pipeline layer `layer` (0 <= layer < DecoderPipelineLayers(blocks)).
constexpr DecoderLayerKind DecoderLayerKindOf(int64_t layer, int64_t blocks) {
  return layer == 0                                   ? DecoderLayerKind::kEmbedding
         : layer == DecoderPipelineLayers(blocks) - 1 ? DecoderLayerKind::kHead
         : layer % 2 == 1                             ? DecoderLayerKind::kAttention
                                                      : DecoderLayerKind::kMlp;
}

constexpr const char* DecoderLayerKindName(DecoderLayerKind kind) {
  switch (kind) {
    case DecoderLayerKind::kEmbedding:
      return "embedding";
    case DecoderLayerKind::kAttention:
      return "attention";
    case DecoderLayerKind::kMlp:
      return "MLP";
    case DecoderLayerKind::kHead:
      return "head";
  }
  return "?";
}

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_DECODER_LAYERS_H_
