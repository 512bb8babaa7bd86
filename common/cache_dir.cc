#include "common/cache_dir.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace stagehand {

std::string StagehandCacheDir(absl::string_view name) {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return absl::StrCat(xdg, "/stagehand/", name);
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return absl::StrCat(home, "/.cache/stagehand/", name);
  return "";
}

}  // namespace stagehand
