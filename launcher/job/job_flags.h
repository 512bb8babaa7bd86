// The flags that shape a job (--gpus, --model, --steps, ...), shared by the launcher and the client
// (`client submit` takes the launcher's own job flags through the same code). The job's options are
// JobSpec's annotated fields (job_options.h), so a flag is named, described, grouped and ranged in
// protos/job.proto alone; --gpus, --job and --schedule_file, which are not JobSpec fields, are
// defined here.
#ifndef STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_
#define STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_

#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "launcher/job/job.h"

namespace stagehand {

// The source file that defines the job flags not in JobSpec, for FlagsHelp.
inline constexpr char kJobFlagsFile[] = "launcher/job/job_flags.cc";

// JobSpec's options as flags for ParseFlags: what the user typed lands in typed() (only those set).
class JobFlags : public ExtraFlags {
 public:
  std::optional<Info> Find(const std::string& name) const override;
  absl::Status Set(const std::string& name, absl::string_view value) override;
  std::vector<std::string> Names() const override;

  const JobSpec& typed() const { return typed_; }

 private:
  JobSpec typed_;
};

// What the user typed, as a JobRequest (only the flags given are set; see JobRequest).
JobRequest JobRequestFromFlags(const ParsedFlags& parsed, const JobFlags& job_flags);

// --help's topics, as torchrun and Megatron group theirs: the job, the model, pipeline and
// parallelism, the training loop, checkpoints and weights, failure detection, GPUs, outputs (the
// job's options by their `group`); then, for the launcher, several hosts and serve; for the client
// (`client`: true), its own flags first.
std::vector<FlagGroup> HelpGroups(bool client);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_
