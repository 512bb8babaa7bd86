// Command-line parsing over abseil's flag registry (see flags.h).
#include "common/flags.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

absl::Status Unknown(absl::string_view name) {
  return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, "; see --help"));
}

}  // namespace

absl::StatusOr<ParsedFlags> ParseFlags(int argc, char** argv, bool allow_rest, ExtraFlags* extra) {
  ParsedFlags out;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      out.dashdash = true;
      if (i + 1 < argc && !allow_rest) {
        return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", argv[i + 1], "'"));
      }
      for (++i; i < argc; ++i) out.rest.emplace_back(argv[i]);
      break;
    }
    if (arg == "-h" || arg == "--help" || arg == "-help" || arg == "--helpfull") {
      out.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "-"))
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'; flags look like --name=value"));
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    absl::string_view name = arg, value;
    bool has_value = false;
    if (size_t eq = arg.find('='); eq != arg.npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      has_value = true;
    }
    // --micro-batches and --micro_batches are the same flag.
    std::string normalized(name);
    std::replace(normalized.begin(), normalized.end(), '-', '_');
    name = normalized;
    if (extra != nullptr) {
      std::optional<ExtraFlags::Info> info = extra->Find(normalized);
      if (!info && !has_value && absl::StartsWith(normalized, "no")) {
        info = extra->Find(normalized.substr(2));
        if (info && info->is_bool) {
          normalized = normalized.substr(2);
          value = "false";
          has_value = true;
        } else {
          info.reset();
        }
      }
      if (info) {
        if (!has_value) {
          if (info->is_bool) {
            value = "true";
          } else if (i + 1 < argc) {
            value = argv[++i];
          } else {
            return absl::InvalidArgumentError(absl::StrCat("--", normalized, " needs a value"));
          }
        }
        if (absl::Status s = extra->Set(normalized, value); !s.ok()) return s;
        out.given.insert(normalized);
        continue;
      }
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag == nullptr || !flag->IsOfType<bool>()) return Unknown(name);
      normalized = std::string(name.substr(2));
      name = normalized;
      value = "false";
      has_value = true;
    }
    if (flag == nullptr || flag->IsRetired()) return Unknown(name);
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    // Every real-valued flag is a finite number: nan and inf parse, and would pass any range check
    // written as "v < lo || v > hi", so they are refused here, once for every binary.
    if (flag->IsOfType<double>() || flag->IsOfType<float>()) {
      double v = 0;
      if (absl::SimpleAtod(value, &v) && !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, "=", value, ": not a finite number; pass a number like --", name, "=1.5"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, ": ", error));
    }
    out.given.insert(std::string(name));
  }
  return out;
}

std::string FlagsHelp(absl::string_view usage, absl::string_view file_suffix) {
  return FlagsHelp(usage, std::vector<std::string>{std::string(file_suffix)});
}

namespace {

std::vector<absl::CommandLineFlag*> FlagsOf(const std::vector<std::string>& file_suffixes) {
  std::vector<absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    for (const std::string& suffix : file_suffixes) {
      if (absl::EndsWith(flag->Filename(), suffix)) {
        flags.push_back(flag);
        break;
      }
    }
  }
  std::sort(flags.begin(), flags.end(), [](auto* a, auto* b) { return a->Name() < b->Name(); });
  return flags;
}

// One flag of --help, from abseil's registry or from ExtraFlags.
struct HelpEntry {
  std::string name;
  std::string help;
  std::string default_value;
  bool has_default = false;  // abseil's flags print theirs unless the help states it
};

std::vector<HelpEntry> Entries(const std::vector<absl::CommandLineFlag*>& flags, const ExtraFlags* extra) {
  std::vector<HelpEntry> out;
  for (absl::CommandLineFlag* f : flags) {
    HelpEntry e;
    e.name = std::string(f->Name());
    e.help = f->Help();
    e.default_value = f->DefaultValue();
    e.has_default = true;
    out.push_back(std::move(e));
  }
  if (extra != nullptr) {
    for (const std::string& name : extra->Names()) {
      HelpEntry e;
      e.name = name;
      e.help = extra->Find(name)->help;
      out.push_back(std::move(e));
    }
  }
  std::sort(out.begin(), out.end(), [](const HelpEntry& a, const HelpEntry& b) { return a.name < b.name; });
  return out;
}

void AppendFlag(const HelpEntry& f, std::string& out) {
  absl::StrAppend(&out, "  --", f.name, " (", f.help, ")\n");
  // A help text that states its default says what an unset flag means; the flag's own value is
  // then a sentinel (-1, ""), which printed beside it would contradict it.
  if (!f.has_default || absl::StrContains(f.help, "default")) return;
  absl::StrAppend(&out, "      default: ", f.default_value.empty() ? "\"\"" : f.default_value, "\n");
}

}  // namespace

std::string FlagsHelp(absl::string_view usage, const std::vector<std::string>& file_suffixes) {
  std::string out = absl::StrCat(usage, "\n\nFlags:\n");
  for (const HelpEntry& f : Entries(FlagsOf(file_suffixes), nullptr)) AppendFlag(f, out);
  return out;
}

std::string FlagsHelp(absl::string_view usage, const std::vector<std::string>& file_suffixes,
                      const std::vector<FlagGroup>& groups, const ExtraFlags* extra) {
  const std::vector<HelpEntry> flags = Entries(FlagsOf(file_suffixes), extra);
  std::set<std::string, std::less<>> shown;
  std::string out(usage);
  for (const FlagGroup& g : groups) {
    std::string section;
    for (const HelpEntry& f : flags) {
      if (std::find(g.flags.begin(), g.flags.end(), f.name) == g.flags.end() || shown.count(f.name)) continue;
      shown.insert(f.name);
      AppendFlag(f, section);
    }
    if (!section.empty()) absl::StrAppend(&out, "\n\n", g.title, ":\n", section);
  }
  std::string rest;
  for (const HelpEntry& f : flags) {
    if (!shown.count(f.name)) AppendFlag(f, rest);
  }
  if (!rest.empty()) absl::StrAppend(&out, "\n\nOther flags:\n", rest);
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out + "\n";
}

}  // namespace stagehand
