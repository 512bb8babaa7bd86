// The Llama architecture as the launcher sees it: RMSNorm, rotary embeddings, a SwiGLU MLP,
// grouped-query attention, no biases, untied embedding and head. Presets "llama-tiny" (CPU tests) and
// "tinyllama-1.1b" (TinyLlama-1.1B's published sizes, ../shared/targets.md). The same pipeline layers
// as the GPT (models/decoder_layers.h).
#ifndef STAGEHAND_MODELS_LLAMA_LLAMA_DESCRIPTION_H_
#define STAGEHAND_MODELS_LLAMA_LLAMA_DESCRIPTION_H_

#include "models/model_description.h"

namespace stagehand {

const ModelDescription& LlamaDescription();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_LLAMA_LLAMA_DESCRIPTION_H_
