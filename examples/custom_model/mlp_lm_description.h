// The description of "mlp-lm", an example of a user's own model family (docs/custom_model.md): its
// preset, checks, pipeline layers, estimates and FLOPs. No LibTorch, as every description.
#ifndef STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_DESCRIPTION_H_
#define STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_DESCRIPTION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "models/model_description.h"

namespace stagehand::examples {

// Pipeline layers: the embedding (vocab x hidden), spec.layers() residual MLP blocks
// (x + W2 gelu(W1 x), W1 of hidden x width), the head (a linear map to the vocabulary).
enum MlpLmLayerKind { kMlpLmEmbedding = 0, kMlpLmBlock = 1, kMlpLmHead = 2 };

const ModelDescription& MlpLmDescription();

// The MLP's inner width: hidden x the option "width_multiplier" (--model_option=width_multiplier=N,
// default 4). INVALID_ARGUMENT when the option is not a positive integer.
absl::StatusOr<int64_t> MlpLmWidth(const ModelSpec& spec);

}  // namespace stagehand::examples

#endif  // STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_DESCRIPTION_H_
