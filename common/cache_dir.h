// Where stagehand keeps what it caches between runs (profiles, the library readahead lists).
#ifndef STAGEHAND_COMMON_CACHE_DIR_H_
#define STAGEHAND_COMMON_CACHE_DIR_H_

#include <string>

#include "absl/strings/string_view.h"

namespace stagehand {

// $XDG_CACHE_HOME/stagehand/NAME, else $HOME/.cache/stagehand/NAME (absolute paths only); "" when
// neither is set.
std::string StagehandCacheDir(absl::string_view name);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_CACHE_DIR_H_
