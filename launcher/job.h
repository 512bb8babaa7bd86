// Turns what the user asked for (flags, an optional job file) and what the machine shows into a
// validated JobSpec, before any process starts. Every refusal says what to change.
#ifndef STAGEHAND_LAUNCHER_JOB_H_
#define STAGEHAND_LAUNCHER_JOB_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "launcher/devices.h"
#include "protos/job.pb.h"

namespace stagehand {

// The launcher's flags that shape the job; unset optionals leave the job file's (or the default) value.
struct JobRequest {
  std::string job_file;           // protobuf text format JobSpec; "" for none
  std::optional<int> gpus;        // --gpus
  std::string device;             // --device: "", "auto", "cuda", "cpu"
  std::optional<int> workers;     // --workers (CPU workers; with cuda it must equal the GPU count)
  std::optional<int64_t> steps;
  std::string model;
  std::optional<int64_t> tensor_elements;
  std::optional<int64_t> seed;
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
  std::optional<int64_t> global_batch;
  std::string partition;
  std::optional<int64_t> vocab, hidden, heads, kv_heads, ffn_hidden, layers, seq;
  std::vector<std::pair<std::string, std::string>> model_options;  // --model_option=KEY=VALUE
  bool fp32 = false;
  std::string attention;
  bool unfused_layernorm = false;
  std::string data;
  std::optional<double> lr;
  bool inference = false;
  bool save_params = false;
  bool no_timing = false;
  bool no_cuda_graphs = false;
};

struct ResolvedJob {
  JobSpec spec;
  std::vector<GpuInfo> gpus;       // the GPUs the workers get, one each (empty for CPU workers)
  std::vector<std::string> notes;  // lines to print before starting ("no GPU visible: ...")
};

// The models stagehand's own worker runs ("allreduce" and the built-in presets), for messages.
const std::vector<std::string>& KnownModels();

absl::StatusOr<ResolvedJob> ResolveJob(const JobRequest& request, const DeviceInventory& inventory);

// Reads a JobSpec in protobuf text format. INVALID_ARGUMENT naming the file and what is wrong.
absl::StatusOr<JobSpec> ReadJobFile(const std::string& path);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_H_
