// The worker's registry of model families (see model_family.h).
#include "models/model_family.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

std::vector<std::unique_ptr<ModelFamily>>& Families() {
  static auto* families = new std::vector<std::unique_ptr<ModelFamily>>;
  return *families;
}

bool Names(const ModelFamily& f, const std::string& model) {
  const std::vector<std::string> presets = f.description().presets();
  return f.description().family() == model || std::find(presets.begin(), presets.end(), model) != presets.end();
}

}  // namespace

absl::Status RegisterModelFamily(std::unique_ptr<ModelFamily> family) {
  std::vector<std::string> names = family->description().presets();
  names.push_back(family->description().family());
  for (const std::string& n : names) {
    if (const ModelFamily* other = FindModelFamily(n); other != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat("model name \"", n, "\" of family ", family->description().family(),
                                                   " is already taken by family ", other->description().family()));
    }
  }
  Families().push_back(std::move(family));
  return absl::OkStatus();
}

const ModelFamily* FindModelFamily(const std::string& model) {
  for (const auto& f : Families()) {
    if (Names(*f, model)) return f.get();
  }
  return nullptr;
}

std::vector<std::string> RegisteredFamilies() {
  std::vector<std::string> out;
  for (const auto& f : Families()) out.push_back(f->description().family());
  return out;
}

}  // namespace stagehand
