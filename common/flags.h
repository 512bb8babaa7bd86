// Command-line parsing over abseil's flag registry, for user-facing binaries. Unlike
// absl::ParseCommandLine it returns an error instead of exiting with status 1, so that bad flags get
// one clear line and exit code 2, and it reports which flags were given (so that a job file's values
// hold unless a flag overrides them).
#ifndef STAGEHAND_COMMON_FLAGS_H_
#define STAGEHAND_COMMON_FLAGS_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagehand {

struct ParsedFlags {
  bool help = false;               // --help or -h was given
  std::set<std::string> given;     // names of the flags set on the command line
};

// Accepts --name=value, --name value, --bool / --nobool, and "--" (nothing may follow it).
absl::StatusOr<ParsedFlags> ParseFlags(int argc, char** argv);

// The usage message followed by every flag defined in a file whose path ends with `file_suffix`.
std::string FlagsHelp(absl::string_view usage, absl::string_view file_suffix);
// The same over the flags of several files (a binary's own and a shared library's), sorted together.
std::string FlagsHelp(absl::string_view usage, const std::vector<std::string>& file_suffixes);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_FLAGS_H_
