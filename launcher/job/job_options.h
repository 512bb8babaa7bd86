// The job's options, read from JobSpec by protobuf reflection: every field that carries the (flag)
// option of protos/flag.proto is a flag of the launcher and of `client submit`, named after the
// field (or the option's name), with its --help text, topic and range stated once, in
// protos/job.proto. Adding an option is one annotated field and the code that uses it.
#ifndef STAGEHAND_LAUNCHER_JOB_JOB_OPTIONS_H_
#define STAGEHAND_LAUNCHER_JOB_JOB_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "protos/flag.pb.h"
#include "protos/job.pb.h"

namespace stagehand {

struct JobOption {
  std::string flag;  // the flag's name ("" for a job-file field only)
  std::string path;  // the field in a job file: "model_spec.layers"
  // From JobSpec down to the field: a field of a message JobSpec holds has two.
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  const FlagOption* option = nullptr;

  const google::protobuf::FieldDescriptor* field() const { return fields.back(); }
  bool is_bool() const;
};

// Every annotated field of JobSpec and of the messages it holds, in declaration order.
const std::vector<JobOption>& JobOptions();

// The flag named `name` ("-" and "_" alike), or nullptr.
const JobOption* FindJobFlag(absl::string_view name);

// Parses `value` as the flag's type into `spec` (a map field takes KEY=VALUE[,KEY=VALUE...] and adds
// them). INVALID_ARGUMENT "--flag=value: ..." naming what to pass; reals must be finite. Ranges are
// checked later, on the merged job (CheckJobOptionRanges).
absl::Status SetJobOption(const JobOption& option, absl::string_view value, JobSpec& spec);

// The option's range as a message states it ("1 <= N <= 131072", "0 < X <= 10"); "" for none.
std::string JobOptionRange(const JobOption& option);

// Whether `spec` sets the option's field (a map: has an entry).
bool HasJobOption(const JobOption& option, const JobSpec& spec);

// Every ranged field of the merged job `spec` in its range. A field the user typed as a flag (set in
// `typed`) is named as the flag ("--seq=0: out of range; pass --seq=N with 1 <= N <= 131072"),
// one from the job file as its field ("--job=F: model_spec.seq: 0 is out of range; write
// model_spec.seq: N with 1 <= N <= 131072 (or pass --seq=N)"). N for integers, X for reals.
absl::Status CheckJobOptionRanges(const JobSpec& spec, const JobSpec& typed, const std::string& job_file);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_JOB_OPTIONS_H_
