// The model families stagehand ships (GPT and Llama), by preset or family name, for the launcher's
// checks and plans. A family of a user's own worker binary is unknown here: the launcher then learns
// its layers from the workers' profiles when they register.
#ifndef STAGEHAND_MODELS_REGISTRY_H_
#define STAGEHAND_MODELS_REGISTRY_H_

#include <string>
#include <vector>

#include "models/model_description.h"

namespace stagehand {

// The family that has `model` as a preset or as its name; null when no built-in one does.
const ModelDescription* FindBuiltinModel(const std::string& model);
// Every built-in preset, family by family ("tiny", "gpt-1.3b", "llama-tiny", "tinyllama-1.1b").
std::vector<std::string> BuiltinPresets();
const std::vector<const ModelDescription*>& BuiltinModels();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_REGISTRY_H_
