// Command-line parsing over abseil's flag registry, for user-facing binaries. Unlike
// absl::ParseCommandLine it returns an error instead of exiting with status 1, so that bad flags get
// one clear line and exit code 2, and it reports which flags were given (so that a job file's values
// hold unless a flag overrides them).
#ifndef STAGEHAND_COMMON_FLAGS_H_
#define STAGEHAND_COMMON_FLAGS_H_

#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stagehand {

struct ParsedFlags {
  bool help = false;              // --help or -h was given
  std::set<std::string> given;    // names of the flags set on the command line
  bool dashdash = false;          // "--" was given
  std::vector<std::string> rest;  // what followed it (with `allow_rest`)
};

// Flags defined outside abseil's registry (the job's options, read from JobSpec by reflection):
// ParseFlags asks them first, and FlagsHelp lists them with the registry's.
class ExtraFlags {
 public:
  struct Info {
    bool is_bool = false;
    std::string help;
  };
  virtual ~ExtraFlags() = default;
  // The flag named `name` (already normalized to "_"), or nullopt if it is not one of these.
  virtual std::optional<Info> Find(const std::string& name) const = 0;
  // Sets it from the command line's text; INVALID_ARGUMENT "--name=value: ..." when it does not parse.
  virtual absl::Status Set(const std::string& name, absl::string_view value) = 0;
  // Every name, for --help.
  virtual std::vector<std::string> Names() const = 0;
};

// Accepts --name=value, --name value, --bool / --nobool, and "--"; what follows "--" is a program
// and its arguments where `allow_rest` (the launcher's `launcher [flags] -- PROGRAM ARGS`), else
// nothing may follow it. Names are looked up in `extra` (if given) before abseil's registry.
absl::StatusOr<ParsedFlags> ParseFlags(int argc, char** argv, bool allow_rest = false, ExtraFlags* extra = nullptr);

// The usage message followed by every flag defined in a file whose path ends with `file_suffix`.
std::string FlagsHelp(absl::string_view usage, absl::string_view file_suffix);
// The same over the flags of several files (a binary's own and a shared library's), sorted together.
std::string FlagsHelp(absl::string_view usage, const std::vector<std::string>& file_suffixes);

// A topic of --help: its title and the names of its flags (a name the binary does not define is
// skipped, so one table serves several binaries).
struct FlagGroup {
  std::string title;
  std::vector<std::string> flags;
};
// The flags of `file_suffixes` (and `extra`'s) under the groups' titles, in the groups' order, sorted by name within
// each; a group with none of the binary's flags is left out, and a flag in no group comes last,
// under "Other flags", so that none is ever hidden.
std::string FlagsHelp(absl::string_view usage, const std::vector<std::string>& file_suffixes,
                      const std::vector<FlagGroup>& groups, const ExtraFlags* extra = nullptr);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_FLAGS_H_
