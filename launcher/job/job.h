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

// The launcher's flags that shape the job: one overlay on the job file. Only what the user typed is
// set (an unset optional, an empty string), so the job file's value (or the default) holds otherwise,
// and a typed flag wins, bools too (--timing=false over `timing: true`).
struct JobRequest {
  std::string job_file;           // protobuf text format JobSpec; "" for none
  std::optional<JobSpec> spec;    // a JobSpec given whole in place of job_file (a server's submission)
  // The job server's: holds a resumed job's settings, once carried from its run (data, export_dir), to
  // what the submitter may name, before anything reads them. Unset: nothing more is checked.
  std::function<absl::Status(const JobSpec&)> check_resumed;
  std::optional<int> gpus;        // --gpus
  std::string device;             // --device: "" (not given), "auto", "cuda", "cpu"
  std::optional<int> workers;     // --workers (CPU workers; with cuda it must equal the GPU count)
  std::optional<int64_t> steps;
  std::string model;
  std::optional<int64_t> tensor_elements;
  std::optional<int64_t> seed;
  // launcher [flags] -- PROGRAM ARGS: a program job (JobSpec.program); empty: stagehand's worker.
  std::vector<std::string> program;
  std::optional<int64_t> heartbeat_timeout_ms;
  std::optional<int64_t> progress_timeout_ms;
  std::optional<int64_t> register_timeout_ms;
  std::optional<int64_t> nccl_init_timeout_ms;
  std::optional<int64_t> grace_ms;
  // Models (--model=tiny, gpt-1.3b, llama-tiny, tinyllama-1.1b, or a family of --worker_binary's).
  bool custom_worker = false;     // --worker_binary given: a model unknown here may be its family's
  std::optional<int> pipeline_stages;
  std::string schedule;
  std::string schedule_file;      // read into pipeline.schedule_text
  std::optional<int> micro_batches;
  std::optional<int> stage_chunks;  // model chunks per worker (interleaved-1f1b, zb-v)
  std::optional<int64_t> global_batch;
  std::string partition;
  std::optional<int64_t> vocab, hidden, heads, kv_heads, ffn_hidden, layers, seq;
  std::vector<std::pair<std::string, std::string>> model_options;  // --model_option=KEY=VALUE
  std::optional<bool> fp32;
  std::string attention;
  std::optional<bool> fused_layernorm;
  std::string data;
  std::optional<double> lr;
  std::optional<bool> inference;
  std::optional<bool> save_params;
  std::optional<bool> timing;
  std::optional<bool> cuda_graphs;
  std::optional<bool> telemetry;  // --telemetry: GPU workers sample clocks, power, throttling
  std::string health;             // --health: off, warn, strict ("" not given)
  // Several hosts (node 0): the workers of the whole job. --gpus and --workers count this host's,
  // which the devices are checked against; the pipeline is sized by this one.
  std::optional<int> world_workers;
  std::optional<int64_t> checkpoint_every;  // --checkpoint_every
  std::optional<int> keep_checkpoints;
  std::string resume;                       // --resume=RUN_DIR (or one checkpoint's directory)
  std::string export_dir;                   // --export_dir=DIR: the weights at the end of the run
  std::string init_from;                    // --init_from=DIR: start from exported weights
  std::optional<int> max_restarts;
  std::optional<int64_t> warmup_steps, lr_decay_steps;
  std::optional<double> min_lr, weight_decay, grad_clip;
  std::optional<bool> init_on_device;
  std::optional<bool> prebuild_attention;  // --prebuild_attention: cuDNN's attention kernels ahead of step 0
  std::optional<bool> profile_cache;
  std::optional<bool> profile_single_stage;
  std::optional<bool> partition_clocks;  // --partition_clocks: the partition weighs GPU clocks
  std::optional<bool> prefetch_libraries;  // --prefetch_libraries: library readahead at start-up
  // Data parallelism and the layout (launcher/plan/layout.h).
  std::optional<int> data_parallel;
  std::optional<bool> shard_optimizer;
  std::string layout;             // "manual" or "auto"
  std::string layout_profiles;    // --layout=auto: recorded LayerProfile files, comma-separated
  std::optional<double> bucket_mb;
  std::optional<double> replica_gbps;
  // Evaluation on a held-out split of the token file, and the SIGTERM checkpoint's wait.
  std::optional<double> val_fraction;
  std::optional<int64_t> eval_every;
  std::optional<int> eval_batches;
  std::optional<int64_t> term_checkpoint_timeout_ms;
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
inline constexpr int kCpuWorkersPerCore = 8;              // CPU workers beyond this many per core are refused
inline constexpr int64_t kMaxSeq = int64_t{1} << 17;
// The schedule is lowered, checked and simulated before the start, in time that grows with the
// (stage, micro-batch) pairs of a worker's lists (worse than linearly for 1F1B's grouping of crossing
// sends): within these every accepted job starts within about a second of checking.
inline constexpr int kMaxMicroBatches = 1024;
inline constexpr int64_t kMaxPipelinePairs = 4096;  // stages x chunks per worker x micro-batches

// An agent of several hosts: only this host's devices, from --device, --gpus and --workers (the job
// itself comes from node 0). The same checks and messages as ResolveJob's; INVALID_ARGUMENT (exit 2).
absl::StatusOr<ResolvedJob> ResolveHostDevices(const JobRequest& request, const DeviceInventory& inventory);

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

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_JOB_H_
