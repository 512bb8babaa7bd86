// The reference GPT (../shared/targets.md) as the launcher sees it: presets "tiny" (CPU tests) and
// "gpt-1.3b", size checks, the pipeline layers (models/decoder_layers.h), analytic costs and FLOPs.
#ifndef STAGEHAND_MODELS_GPT_GPT_DESCRIPTION_H_
#define STAGEHAND_MODELS_GPT_GPT_DESCRIPTION_H_

#include "models/model_description.h"

namespace stagehand {

const ModelDescription& GptDescription();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_GPT_GPT_DESCRIPTION_H_
