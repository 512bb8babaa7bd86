// Model options (see model_options.h).
#include "nn/model_options.h"

namespace stagehand {

bool ModelOptionOn(const ModelSpec& spec, const std::string& name) {
  auto option = spec.options().find(name);
  return option == spec.options().end() || option->second != "false";
}

}  // namespace stagehand
