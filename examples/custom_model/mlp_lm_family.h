// "mlp-lm" as a worker runs it: its description (mlp_lm_description.h) and the LibTorch stage that
// holds a range of its pipeline layers. Written against stagehand's public worker headers only.
#ifndef STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_FAMILY_H_
#define STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_FAMILY_H_

#include <memory>

#include "models/model_family.h"

namespace stagehand::examples {

// The family to pass to RegisterModelFamily before WorkerMain.
std::unique_ptr<ModelFamily> MakeMlpLmFamily();

}  // namespace stagehand::examples

#endif  // STAGEHAND_EXAMPLES_CUSTOM_MODEL_MLP_LM_FAMILY_H_
