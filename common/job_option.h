// A bool job option's value with its default read from protos/job.proto: the field's value where the
// job sets it, else true for a field declared `default_true` (protos/flag.proto), else false. The
// default is stated once, beside the field, not at every place that reads it:
//   BoolOption(job, JobSpec::kTimingFieldNumber)
#ifndef STAGEHAND_COMMON_JOB_OPTION_H_
#define STAGEHAND_COMMON_JOB_OPTION_H_

#include "google/protobuf/message.h"

namespace stagehand {

// `message` is a JobSpec or a message it holds (ModelSpec, ...); `field_number` one of its bool fields.
bool BoolOption(const google::protobuf::Message& message, int field_number);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_JOB_OPTION_H_
