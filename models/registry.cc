// The built-in model families (see registry.h).
#include "models/registry.h"

#include <algorithm>

#include "models/gpt/gpt_description.h"
#include "models/llama/llama_description.h"

namespace stagehand {

const std::vector<const ModelDescription*>& BuiltinModels() {
  static const auto* models = new std::vector<const ModelDescription*>{&GptDescription(), &LlamaDescription()};
  return *models;
}

const ModelDescription* FindBuiltinModel(const std::string& model) {
  for (const ModelDescription* d : BuiltinModels()) {
    const std::vector<std::string> presets = d->presets();
    if (d->family() == model || std::find(presets.begin(), presets.end(), model) != presets.end()) return d;
  }
  return nullptr;
}

std::vector<std::string> BuiltinPresets() {
  std::vector<std::string> out;
  for (const ModelDescription* d : BuiltinModels()) {
    for (const std::string& p : d->presets()) out.push_back(p);
  }
  return out;
}

}  // namespace stagehand
