// The flags that shape a job (--gpus, --model, --steps, ...), shared by the launcher and the client
// (`client submit` takes the launcher's own job flags): defined once here, read into a JobRequest.
#ifndef STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_
#define STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_

#include "common/flags.h"
#include "launcher/job/job.h"

namespace stagehand {

// The source file that defines the job flags, for FlagsHelp.
inline constexpr char kJobFlagsFile[] = "launcher/job/job_flags.cc";

// What the user typed, as a JobRequest (only the flags given are set; see JobRequest).
JobRequest JobRequestFromFlags(const ParsedFlags& parsed);

// --help's topics, as torchrun and Megatron group theirs: the job, the model, pipeline and
// parallelism, the training loop, checkpoints and weights, failure detection, GPUs, outputs; then,
// for the launcher, several hosts and serve; for the client (`client`: true), its own flags first.
std::vector<FlagGroup> HelpGroups(bool client);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_JOB_FLAGS_H_
