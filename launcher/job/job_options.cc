// The job's options by reflection (job_options.h).
#include "launcher/job/job_options.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/message.h"

namespace stagehand {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

bool IsInteger(const FieldDescriptor* f) {
  return f->cpp_type() == FieldDescriptor::CPPTYPE_INT32 || f->cpp_type() == FieldDescriptor::CPPTYPE_INT64;
}

void Collect(const google::protobuf::Descriptor* d, std::vector<const FieldDescriptor*>& prefix,
             std::string path_prefix, std::vector<JobOption>& out) {
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    prefix.push_back(f);
    if (f->options().HasExtension(flag)) {
      JobOption o;
      o.option = &f->options().GetExtension(flag);
      o.flag = o.option->no_flag() ? "" : (o.option->name().empty() ? f->name() : o.option->name());
      o.path = path_prefix + f->name();
      o.fields = prefix;
      out.push_back(std::move(o));
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE && !f->is_repeated()) {
      Collect(f->message_type(), prefix, path_prefix + f->name() + ".", out);
    }
    prefix.pop_back();
  }
}

// The message that holds the option's field, created on the way down.
Message* MutableHolder(const JobOption& o, JobSpec& spec) {
  Message* m = &spec;
  for (size_t i = 0; i + 1 < o.fields.size(); ++i) m = m->GetReflection()->MutableMessage(m, o.fields[i]);
  return m;
}

// The message that holds the option's field, or nullptr where a message on the way is unset.
const Message* Holder(const JobOption& o, const JobSpec& spec) {
  const Message* m = &spec;
  for (size_t i = 0; i + 1 < o.fields.size(); ++i) {
    if (!m->GetReflection()->HasField(*m, o.fields[i])) return nullptr;
    m = &m->GetReflection()->GetMessage(*m, o.fields[i]);
  }
  return m;
}

std::string Number(double v, bool integer) { return integer ? absl::StrCat(static_cast<int64_t>(v)) : absl::StrCat(v); }

}  // namespace

std::string JobOptionRange(const JobOption& o) {
  const FlagOption& range = *o.option;
  if (!range.has_min() && !range.has_max()) return "";
  const bool integer = IsInteger(o.field());
  std::string interval;
  if (range.has_min()) interval = absl::StrCat(Number(range.min(), integer), range.min_exclusive() ? " < " : " <= ");
  absl::StrAppend(&interval, integer ? "N" : "X");
  if (range.has_max()) {
    absl::StrAppend(&interval, range.max_exclusive() ? " < " : " <= ", Number(range.max(), integer));
  }
  return interval;
}

bool JobOption::is_bool() const { return field()->cpp_type() == FieldDescriptor::CPPTYPE_BOOL; }

const std::vector<JobOption>& JobOptions() {
  static const std::vector<JobOption>* options = [] {
    auto* out = new std::vector<JobOption>;
    std::vector<const FieldDescriptor*> prefix;
    Collect(JobSpec::descriptor(), prefix, "", *out);
    return out;
  }();
  return *options;
}

const JobOption* FindJobFlag(absl::string_view name) {
  std::string normalized(name);
  std::replace(normalized.begin(), normalized.end(), '-', '_');
  for (const JobOption& o : JobOptions()) {
    if (!o.flag.empty() && o.flag == normalized) return &o;
  }
  return nullptr;
}

namespace {
absl::Status ParseInto(const JobOption& o, const std::string& given, absl::string_view value, Message* m,
                       const Reflection* r);
}  // namespace

absl::Status SetJobOption(const JobOption& o, absl::string_view value, JobSpec& spec) {
  const std::string given = absl::StrCat("--", o.flag, "=", value);
  // Nothing is created in `spec` before the value parsed: a refused flag leaves it as it was.
  JobSpec parsed;
  Message* m = MutableHolder(o, parsed);
  const Reflection* r = m->GetReflection();
  if (absl::Status s = ParseInto(o, given, value, m, r); !s.ok()) return s;
  spec.MergeFrom(parsed);
  return absl::OkStatus();
}

namespace {

absl::Status ParseInto(const JobOption& o, const std::string& given, absl::string_view value, Message* m,
                       const Reflection* r) {
  const FieldDescriptor* f = o.field();
  if (f->is_map()) {
    // map<string, string>: KEY=VALUE[,KEY=VALUE...], each added (a later one wins for its key).
    for (absl::string_view kv : absl::StrSplit(value, ',', absl::SkipEmpty())) {
      const size_t eq = kv.find('=');
      if (eq == 0) return Invalid(absl::StrCat(given, ": expected KEY=VALUE pairs like --", o.flag, "=name=value"));
      Message* entry = r->AddMessage(m, f);
      const google::protobuf::Descriptor* d = entry->GetDescriptor();
      entry->GetReflection()->SetString(entry, d->FindFieldByName("key"), std::string(kv.substr(0, eq)));
      entry->GetReflection()->SetString(entry, d->FindFieldByName("value"),
                                        eq == absl::string_view::npos ? "" : std::string(kv.substr(eq + 1)));
    }
    return absl::OkStatus();
  }
  switch (f->cpp_type()) {
    case FieldDescriptor::CPPTYPE_BOOL: {
      const std::string v = absl::AsciiStrToLower(value);
      if (v == "true" || v == "1" || v == "yes" || v == "t" || v == "y") {
        r->SetBool(m, f, true);
      } else if (v == "false" || v == "0" || v == "no" || v == "f" || v == "n") {
        r->SetBool(m, f, false);
      } else {
        return Invalid(absl::StrCat(given, ": not a bool; pass --", o.flag, "=true or --", o.flag, "=false"));
      }
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT32: {
      int32_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) {
        return Invalid(absl::StrCat(given, ": not a 32-bit integer; pass a whole number like --", o.flag, "=4"));
      }
      r->SetInt32(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = 0;
      if (!absl::SimpleAtoi(value, &v)) {
        return Invalid(absl::StrCat(given, ": not an integer; pass a whole number like --", o.flag, "=4"));
      }
      r->SetInt64(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_DOUBLE: {
      double v = 0;
      if (!absl::SimpleAtod(value, &v)) {
        return Invalid(absl::StrCat(given, ": not a number; pass a number like --", o.flag, "=1.5"));
      }
      // nan and inf parse, and would pass a range check written as "v < lo || v > hi".
      if (!std::isfinite(v)) {
        return Invalid(absl::StrCat(given, ": not a finite number; pass a number like --", o.flag, "=1.5"));
      }
      r->SetDouble(m, f, v);
      return absl::OkStatus();
    }
    case FieldDescriptor::CPPTYPE_STRING:
      r->SetString(m, f, std::string(value));
      return absl::OkStatus();
    default:
      return Invalid(absl::StrCat(given, ": this field's type cannot be a flag"));
  }
}

}  // namespace

bool HasJobOption(const JobOption& o, const JobSpec& spec) {
  const Message* m = Holder(o, spec);
  if (m == nullptr) return false;
  if (o.field()->is_repeated()) return m->GetReflection()->FieldSize(*m, o.field()) > 0;
  return m->GetReflection()->HasField(*m, o.field());
}

absl::Status CheckJobOptionRanges(const JobSpec& spec, const JobSpec& typed, const std::string& job_file) {
  for (const JobOption& o : JobOptions()) {
    const FlagOption& range = *o.option;
    if (!range.has_min() && !range.has_max()) continue;
    if (!HasJobOption(o, spec)) continue;
    const Message& m = *Holder(o, spec);
    const Reflection* r = m.GetReflection();
    const FieldDescriptor* f = o.field();
    const bool integer = IsInteger(f);
    double v = 0;
    int64_t iv = 0;
    if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT32) {
      iv = r->GetInt32(m, f);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_INT64) {
      iv = r->GetInt64(m, f);
    } else if (f->cpp_type() == FieldDescriptor::CPPTYPE_DOUBLE) {
      v = r->GetDouble(m, f);
    } else {
      continue;
    }
    bool ok;
    if (integer) {
      ok = (!range.has_min() || (range.min_exclusive() ? iv > range.min() : iv >= range.min())) &&
           (!range.has_max() || (range.max_exclusive() ? iv < range.max() : iv <= range.max()));
    } else {
      ok = std::isfinite(v) && (!range.has_min() || (range.min_exclusive() ? v > range.min() : v >= range.min())) &&
           (!range.has_max() || (range.max_exclusive() ? v < range.max() : v <= range.max()));
    }
    if (ok) continue;
    const char* symbol = integer ? "N" : "X";
    const std::string interval = JobOptionRange(o);
    const std::string value = integer ? absl::StrCat(iv) : absl::StrCat(v);
    if (!o.flag.empty() && HasJobOption(o, typed)) {
      return Invalid(
          absl::StrCat("--", o.flag, "=", value, ": out of range; pass --", o.flag, "=", symbol, " with ", interval));
    }
    return Invalid(absl::StrCat("--job=", job_file, ": ", o.path, ": ", value, " is out of range; write ", o.path, ": ",
                                symbol, " with ", interval,
                                o.flag.empty() ? "" : absl::StrCat(" (or pass --", o.flag, "=", symbol, ")")));
  }
  return absl::OkStatus();
}

}  // namespace stagehand
