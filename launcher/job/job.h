// Turns what the user asked for (flags, an optional job file) and what the machine shows into a
// validated JobSpec, before any process starts. Every refusal says what to change.
#ifndef STAGEHAND_LAUNCHER_JOB_JOB_H_
#define STAGEHAND_LAUNCHER_JOB_JOB_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "launcher/plan/devices.h"
#include "launcher/plan/job_plan.h"  // kCpuWorkerBytes
#include "protos/job.pb.h"

namespace stagehand {

// What the user asked for: a job file (or a JobSpec given whole) with the typed flags over it. Only
// what the user typed is set in `flags` (an unset optional, an empty string), so the job file's value
// (or the default) holds otherwise, and a typed flag wins, bools too (--timing=false over
// `timing: true`).
struct JobRequest {
  std::string job_file;         // protobuf text format JobSpec; "" for none
  std::optional<JobSpec> spec;  // a JobSpec given whole in place of job_file (a server's submission)
  // The job server's: holds a resumed job's settings, once carried from its run (data, export_dir), to
  // what the submitter may name, before anything reads them. Unset: nothing more is checked.
  std::function<absl::Status(const JobSpec&)> check_resumed;
  // The job options the user typed (job_options.h): merged over the job file, field by field.
  JobSpec flags;
  std::optional<int> gpus;    // --gpus
  std::string schedule_file;  // --schedule_file: read into pipeline.schedule_text
  // launcher [flags] -- PROGRAM ARGS: a program job (JobSpec.program); empty: stagehand's worker.
  std::vector<std::string> program;
  bool custom_worker = false;  // --worker_binary given: a model unknown here may be its family's
  // Several hosts (node 0): the workers of the whole job. --gpus and --workers count this host's,
  // which the devices are checked against; the pipeline is sized by this one.
  std::optional<int> world_workers;
};

struct ResolvedJob {
  JobSpec spec;
  std::vector<GpuInfo> gpus;       // the GPUs the workers get, one each (empty for CPU workers)
  std::vector<std::string> notes;  // lines to print before starting ("no GPU visible: ...")
  int host_workers = 0;            // this host's workers (spec.workers() unless world_workers)
};

// The learning rate a preset trains at unless --lr (or the job file's lr) says otherwise: one table
// (launcher/job/job.cc) for every way the preset was chosen. 1e-4 for a preset it does not list.
double PresetLr(const std::string& preset);

// The models stagehand's own worker runs ("allreduce" and the built-in presets), for messages.
const std::vector<std::string>& KnownModels();

// The one validation every source passes before anything is created: the job file read, the flags
// merged onto it, every number ranged, paths resolved against the user's directory (`bazel run`),
// the devices and the machine's cores and memory, the model and the token file checked.
// INVALID_ARGUMENT (exit 2) with one line naming the flag (or job-file field) and what to pass.
absl::StatusOr<ResolvedJob> ResolveJob(const JobRequest& request, const DeviceInventory& inventory);

// Hard caps, documented in --help and the README: beyond them a job is refused, not tried.
inline constexpr int kMaxWorkers = 1024;
inline constexpr int kCpuWorkersPerCore = 8;  // CPU workers beyond this many per core are refused
inline constexpr int64_t kMaxSeq = int64_t{1} << 17;
// The schedule is lowered, checked and simulated before the start, in time that grows with the
// (stage, micro-batch) pairs of a worker's lists (worse than linearly for 1F1B's grouping of crossing
// sends): within these every accepted job starts within about a second of checking.
inline constexpr int kMaxMicroBatches = 1024;
inline constexpr int64_t kMaxPipelinePairs = 4096;  // stages x chunks per worker x micro-batches

// An agent of several hosts: only this host's devices, from --device, --gpus and --workers (the job
// itself comes from node 0). The same checks and messages as ResolveJob's; INVALID_ARGUMENT (exit 2).
absl::StatusOr<ResolvedJob> ResolveHostDevices(const JobRequest& request, const DeviceInventory& inventory);

// A program job (request.program): PROGRAM resolved as a shell would (a path with a slash against the
// user's directory, a bare name on PATH) to an executable regular file, into `spec`'s program (its
// arguments as given) and program_cwd (the user's directory); an agent resolves its own this way.
// --model is refused. INVALID_ARGUMENT with one line.
absl::Status ResolveProgram(const JobRequest& request, JobSpec& spec);

// How long a SIGTERM checkpoint may take when the job does not say (term_checkpoint_timeout_ms).
inline constexpr int64_t kDefaultTermCheckpointMs = 120000;
// A resolved job whose SIGTERM (or SIGHUP) has every rank write a checkpoint before the run stops
// (exit 75): a training job of a model with --checkpoint_every and term_checkpoint_timeout_ms not 0.
bool WritesTermCheckpoints(const JobSpec& job);
// That timeout.
absl::Duration TermCheckpointTimeout(const JobSpec& job);
// The step of the newest complete checkpoint in `run_dir` when it is at or past `step` (a SIGTERM's
// checkpoint-and-stop step), else 0. Node 0 and the agents of several hosts judge the stop by it.
int64_t CheckpointAtOrPast(const std::string& run_dir, int64_t step);

// What `client submit` sends: the job file (relative to the user's directory) with the typed flags
// over it and --schedule_file read into pipeline.schedule_text, nothing resolved or defaulted (the
// server does that, with its devices and its paths; --gpus travels beside it). INVALID_ARGUMENT
// naming the file that cannot be read or parsed.
absl::StatusOr<JobSpec> MergeJobRequest(const JobRequest& request);

// Reads a JobSpec in protobuf text format. INVALID_ARGUMENT naming the file and what is wrong.
absl::StatusOr<JobSpec> ReadJobFile(const std::string& path);

// A program job's PROGRAM ARGS as lines and listings show them: joined by spaces, non-printable bytes
// escaped, clipped to `max_bytes` (ClipInput; a run's own lines keep any path whole, a server's
// listing takes ClipInput's 200); "" for a job of stagehand's worker. A served command comes from a
// token: what it shows is never raw input.
std::string CommandLine(const JobSpec& spec, size_t max_bytes = 16384);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_JOB_H_
