// The GPT's pipeline layers, in one place for the model, the job checks, the analytic estimate, the
// profile and the launcher: layer 0 is the token embedding, layers 2b-1 and 2b the attention and MLP
// halves of block b = 1..L (so that a partition can cut a block in two), layer 2L+1 the head. No
// LibTorch and no protobuf: the launcher and the worker's LibTorch code both include it. Also the names
// of the attention kernels a job may ask for, which the job check and the model both need.
#ifndef STAGEHAND_WORKER_GPT_LAYERS_H_
#define STAGEHAND_WORKER_GPT_LAYERS_H_

#include <cstdint>
#include <string>

namespace stagehand {

enum class GptLayerKind { kEmbedding, kAttention, kMlp, kHead };
constexpr int kGptLayerKinds = 4;

constexpr int64_t GptPipelineLayers(int64_t blocks) { return 2 * blocks + 2; }

// The kind of pipeline layer `layer` (0 <= layer < GptPipelineLayers(blocks)).
constexpr GptLayerKind GptLayerKindOf(int64_t layer, int64_t blocks) {
  return layer == 0                               ? GptLayerKind::kEmbedding
         : layer == GptPipelineLayers(blocks) - 1 ? GptLayerKind::kHead
         : layer % 2 == 1                         ? GptLayerKind::kAttention
                                                  : GptLayerKind::kMlp;
}

constexpr const char* GptLayerKindName(GptLayerKind kind) {
  switch (kind) {
    case GptLayerKind::kEmbedding: return "embedding";
    case GptLayerKind::kAttention: return "attention";
    case GptLayerKind::kMlp: return "MLP";
    case GptLayerKind::kHead: return "head";
  }
  return "?";
}

// The attention kernels a job may name (GptSpec.attention; model.h's SelectAttentionKernel).
inline constexpr const char* kAttentionKernels[] = {"cudnn", "flash", "torch"};

inline bool IsAttentionKernel(const std::string& name) {
  for (const char* k : kAttentionKernels) {
    if (name == k) return true;
  }
  return false;
}

// "cudnn, flash or torch", for messages that say what to pass instead.
inline std::string AttentionKernelChoices() {
  std::string s;
  constexpr size_t n = sizeof(kAttentionKernels) / sizeof(kAttentionKernels[0]);
  for (size_t i = 0; i < n; ++i) s += std::string(i == 0 ? "" : i + 1 == n ? " or " : ", ") + kAttentionKernels[i];
  return s;
}

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_GPT_LAYERS_H_
