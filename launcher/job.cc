// Job resolution and validation: flags over the job file over defaults, checked against the devices.
#include "launcher/job.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/text_format.h"
#include "models/registry.h"
#include "schedule/schedule.h"

namespace stagehand {
namespace {

constexpr int kDefaultCpuWorkers = 2;

void ApplyDefaults(JobSpec& spec) {
  if (spec.steps() == 0) spec.set_steps(10);
  if (spec.tensor_elements() == 0) spec.set_tensor_elements(1 << 20);
  Timeouts& t = *spec.mutable_timeouts();
  if (t.register_ms() == 0) t.set_register_ms(60000);
  if (t.heartbeat_interval_ms() == 0) t.set_heartbeat_interval_ms(100);
  if (t.heartbeat_timeout_ms() == 0) t.set_heartbeat_timeout_ms(10000);
  if (t.progress_timeout_ms() == 0) t.set_progress_timeout_ms(300000);
  if (t.nccl_init_ms() == 0) t.set_nccl_init_ms(60000);
  if (t.grace_ms() == 0) t.set_grace_ms(3000);
}

absl::Status Positive(const char* flag, int64_t v) {
  if (v >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", v, ": must be at least 1"));
}

void ApplyRequest(const JobRequest& r, JobSpec& spec) {
  if (r.steps) spec.set_steps(*r.steps);
  if (!r.model.empty()) spec.set_model(r.model);
  if (r.tensor_elements) spec.set_tensor_elements(*r.tensor_elements);
  if (r.seed) spec.set_seed(*r.seed);
  Timeouts& t = *spec.mutable_timeouts();
  if (r.heartbeat_timeout_ms) t.set_heartbeat_timeout_ms(*r.heartbeat_timeout_ms);
  if (r.progress_timeout_ms) t.set_progress_timeout_ms(*r.progress_timeout_ms);
  if (r.register_timeout_ms) t.set_register_ms(*r.register_timeout_ms);
  if (r.nccl_init_timeout_ms) t.set_nccl_init_ms(*r.nccl_init_timeout_ms);
  if (r.grace_ms) t.set_grace_ms(*r.grace_ms);
  ModelSpec& g = *spec.mutable_model_spec();
  if (r.vocab) g.set_vocab(*r.vocab);
  if (r.hidden) g.set_hidden(*r.hidden);
  if (r.heads) g.set_heads(*r.heads);
  if (r.kv_heads) g.set_kv_heads(*r.kv_heads);
  if (r.ffn_hidden) g.set_ffn_hidden(*r.ffn_hidden);
  if (r.layers) g.set_layers(*r.layers);
  for (const auto& [k, v] : r.model_options) (*g.mutable_options())[k] = v;
  if (r.seq) g.set_seq(*r.seq);
  if (r.fp32) g.set_fp32(true);
  if (!r.attention.empty()) g.set_attention(r.attention);
  if (r.unfused_layernorm) g.set_unfused_layernorm(true);
  PipelineSpec& p = *spec.mutable_pipeline();
  if (r.pipeline_stages) p.set_stages(*r.pipeline_stages);
  if (!r.schedule.empty()) p.set_schedule(r.schedule);
  if (r.micro_batches) p.set_micro_batches(*r.micro_batches);
  if (r.global_batch) p.set_global_batch(*r.global_batch);
  if (!r.partition.empty()) p.set_partition(r.partition);
  if (r.inference) p.set_inference(true);
  if (!r.data.empty()) spec.set_data(r.data);
  if (r.lr) spec.set_lr(*r.lr);
  if (r.save_params) spec.set_save_params(true);
  if (r.no_timing) spec.set_no_timing(true);
  if (r.no_cuda_graphs) spec.set_no_cuda_graphs(true);
}

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// The pipeline's counts, checked: they do not depend on the model. (The schedule is checked by the
// schedule library, and the partition and the memory with the model's description: launcher/job_plan.h.)
absl::Status ValidatePipeline(const JobSpec& job) {
  const PipelineSpec& p = job.pipeline();
  if (p.stages() < 1) return Invalid("--pipeline_stages must be at least 1");
  if (p.stages() != job.workers()) {
    return Invalid(absl::StrCat("--pipeline_stages=", p.stages(), " with ", job.workers(),
                                " workers: each worker runs one stage (no data parallelism yet); make them equal"));
  }
  if (p.micro_batches() < 1) return Invalid("--micro_batches must be at least 1");
  if (p.global_batch() < 1 || p.global_batch() % p.micro_batches() != 0) {
    return Invalid(absl::StrCat("--global_batch=", p.global_batch(), " does not split into ", p.micro_batches(),
                                " equal micro-batches; pass a multiple of --micro_batches"));
  }
  return absl::OkStatus();
}

// Fills the model's sizes (its family's preset under the job's overrides) and the pipeline's defaults
// once the worker count is known, and validates them. A model no built-in family knows is a family of
// the user's worker binary: its sizes are its own to check, when its workers start.
absl::Status ResolveModel(JobSpec& spec, bool custom_worker) {
  if (const ModelDescription* d = FindBuiltinModel(spec.model()); d != nullptr) {
    absl::StatusOr<ModelSpec> m = d->Resolve(spec.model(), spec.model_spec());
    if (!m.ok()) return m.status();
    *spec.mutable_model_spec() = *std::move(m);
  } else if (!custom_worker) {
    return Invalid(absl::StrCat("--model=", spec.model(), ": unknown model; known: ", absl::StrJoin(KnownModels(), ", "),
                                "; a model family of your own runs with --worker_binary=YOUR_WORKER "
                                "(docs/custom_model.md)"));
  }  // else: its worker binary's family resolves the sizes (worker/pipeline.cc)
  PipelineSpec& p = *spec.mutable_pipeline();
  if (p.stages() == 0) p.set_stages(spec.workers());
  if (const ModelDescription* d = FindBuiltinModel(spec.model()); d != nullptr) {
    const int layers = d->NumLayers(spec.model_spec());
    if (p.stages() > layers) {
      return Invalid(absl::StrCat(p.stages(), " stages but the model has only ", layers, " pipeline layers (",
                                  d->DescribeLayers(spec.model_spec()), "); use at most ", layers,
                                  " stages or more --layers"));
    }
  }
  if (p.schedule().empty()) p.set_schedule("1f1b");
  if (p.micro_batches() == 0) p.set_micro_batches(std::max(8, p.stages()));
  if (p.global_batch() == 0) p.set_global_batch(std::max<int64_t>(32, p.micro_batches()));
  if (p.partition().empty()) p.set_partition("auto");
  if (spec.lr() == 0) spec.set_lr(1e-4);
  return ValidatePipeline(spec);
}

// A schedule file says how many micro-batches it runs: that is the job's count, unless the flags ask
// for another, which cannot work.
absl::Status TakeMicroBatchesFromSchedule(const JobRequest& r, JobSpec& spec) {
  absl::StatusOr<Schedule> parsed = ParseSchedule(spec.pipeline().schedule_text(), "file", 1);
  if (!parsed.ok()) {
    return Invalid(absl::StrCat("--schedule_file=", r.schedule_file, ": ", parsed.status().message()));
  }
  int m = 0;
  for (const std::vector<Action>& rank : parsed->ranks) {
    for (const Action& a : rank) m = std::max(m, a.microbatch + 1);
  }
  if (r.micro_batches && *r.micro_batches != m) {
    return Invalid(absl::StrCat("--schedule_file=", r.schedule_file, " runs ", m, " micro-batches but --micro_batches=",
                                *r.micro_batches, "; drop --micro_batches or pass ", m));
  }
  spec.mutable_pipeline()->set_micro_batches(m);
  return absl::OkStatus();
}

// The job of a bare `launcher`: a model that visibly learns, sized to what the devices show. On CPU
// workers the tiny GPT, whose loss falls from ln 256 = 5.5 to about 1 within seconds; on GPUs the
// reference gpt-1.3b for long enough to show what they give. Flags the user set are kept.
void ChooseDefaultModel(const JobRequest& r, ResolvedJob& out) {
  const bool cpu = out.spec.device() == DEVICE_KIND_CPU;
  out.spec.set_model(cpu ? "tiny" : "gpt-1.3b");
  if (r.job_file.empty() && !r.steps) out.spec.set_steps(cpu ? 200 : 30);
  if (r.job_file.empty() && !r.lr) out.spec.set_lr(cpu ? 3e-3 : 1e-4);
  out.notes.push_back(absl::StrCat("no --model given: training ", out.spec.model(), " for ", out.spec.steps(),
                                   " steps (--model=allreduce runs the checked collective instead)"));
}

absl::Status ValidateCounts(const JobRequest& r, const JobSpec& spec) {
  if (r.gpus) {
    if (absl::Status s = Positive("gpus", *r.gpus); !s.ok()) return s;
  }
  if (r.workers) {
    if (absl::Status s = Positive("workers", *r.workers); !s.ok()) return s;
  }
  if (absl::Status s = Positive("steps", spec.steps()); !s.ok()) return s;
  if (absl::Status s = Positive("tensor_elements", spec.tensor_elements()); !s.ok()) return s;
  const Timeouts& t = spec.timeouts();
  for (auto [name, v] : {std::pair<const char*, int64_t>{"heartbeat_timeout", t.heartbeat_timeout_ms()},
                         {"progress_timeout", t.progress_timeout_ms()}, {"register_timeout", t.register_ms()},
                         {"nccl_init_timeout", t.nccl_init_ms()}, {"grace_period", t.grace_ms()}}) {
    if (v < 1) return absl::InvalidArgumentError(absl::StrCat("--", name, ": must be a positive duration"));
  }
  if (t.heartbeat_timeout_ms() < 2 * t.heartbeat_interval_ms()) {
    return absl::InvalidArgumentError(absl::StrCat("--heartbeat_timeout must be at least twice the heartbeat interval (",
                                                   t.heartbeat_interval_ms(), " ms)"));
  }
  return absl::OkStatus();
}

std::string Visible(const DeviceInventory& inv) {
  std::string s = absl::StrCat(inv.gpus.size(), inv.gpus.size() == 1 ? " is" : " are", " visible");
  if (inv.cuda_visible_devices_set) absl::StrAppend(&s, " (CUDA_VISIBLE_DEVICES=", inv.cuda_visible_devices, ")");
  return s;
}

// Picks the device kind and worker count; fills `out` with GPUs and notes.
absl::Status ChooseDevices(const JobRequest& r, const DeviceInventory& inv, ResolvedJob& out) {
  JobSpec& spec = out.spec;
  std::string device = r.device;
  if ((device.empty() || device == "auto") && r.gpus) device = "cuda";  // the flag overrides the job file
  if (device.empty() || device == "auto") {
    if (spec.device() == DEVICE_KIND_CPU || (spec.device() == DEVICE_KIND_UNSPECIFIED && inv.gpus.empty() && !r.gpus)) {
      device = "cpu";
    } else {
      device = "cuda";
    }
  }
  if (device == "cpu") {
    if (r.gpus) return absl::InvalidArgumentError("--gpus and --device=cpu contradict each other; use --workers=N for CPU workers");
    int n = r.workers ? *r.workers : (spec.workers() > 0 ? spec.workers() : kDefaultCpuWorkers);
    if (r.device != "cpu" && spec.device() != DEVICE_KIND_CPU) {
      out.notes.push_back(absl::StrCat("no GPU visible (", inv.note, "): running ", n,
                                       " CPU workers; pass --device=cpu --workers=N to choose the count"));
    }
    spec.set_device(DEVICE_KIND_CPU);
    spec.set_workers(n);
    return absl::OkStatus();
  }
  if (device != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat("--device=", device, ": unknown device; use cuda, cpu or auto"));
  }
  int n = r.gpus ? *r.gpus : (spec.workers() > 0 ? spec.workers() : static_cast<int>(inv.gpus.size()));
  if (r.workers && *r.workers != n) {
    return absl::InvalidArgumentError(absl::StrCat("--workers=", *r.workers, " with ", n,
                                                   " GPUs: GPU jobs run one worker per GPU; drop --workers or pass --gpus"));
  }
  if (inv.gpus.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("asked for GPUs but none is visible (", inv.note,
                                                   "); pass --device=cpu to run CPU workers"));
  }
  if (n > static_cast<int>(inv.gpus.size())) {
    return absl::InvalidArgumentError(absl::StrCat("asked for ", n, " GPUs but ", Visible(inv), "; pass --gpus=",
                                                   inv.gpus.size(), " or fewer"));
  }
  spec.set_device(DEVICE_KIND_CUDA);
  spec.set_workers(n);
  out.gpus.assign(inv.gpus.begin(), inv.gpus.begin() + n);
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& KnownModels() {
  static const auto* models = [] {
    auto* m = new std::vector<std::string>{kAllReduceModel};
    for (const std::string& g : BuiltinPresets()) m->push_back(g);
    return m;
  }();
  return *models;
}

absl::StatusOr<JobSpec> ReadJobFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("--job=", path, ": not a file"));
  }
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat("--job=", path, ": cannot read it: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  JobSpec spec;
  if (!google::protobuf::TextFormat::ParseFromString(text.str(), &spec)) {
    return absl::InvalidArgumentError(absl::StrCat("--job=", path,
                                                   ": not a JobSpec in protobuf text format (see protos/job.proto)"));
  }
  return spec;
}

absl::StatusOr<ResolvedJob> ResolveJob(const JobRequest& request, const DeviceInventory& inventory) {
  ResolvedJob out;
  if (!request.job_file.empty()) {
    absl::StatusOr<JobSpec> spec = ReadJobFile(request.job_file);
    if (!spec.ok()) return spec.status();
    out.spec = *std::move(spec);
  }
  // Defaults fill what the job file left unset (proto3 zeros); flags come last, so that a flag's 0 is
  // refused rather than mistaken for "unset".
  ApplyDefaults(out.spec);
  ApplyRequest(request, out.spec);
  if (absl::Status s = ValidateCounts(request, out.spec); !s.ok()) return s;
  if (absl::Status s = ChooseDevices(request, inventory, out); !s.ok()) return s;
  if (out.spec.model().empty()) ChooseDefaultModel(request, out);
  if (!request.schedule_file.empty()) {
    std::ifstream in(request.schedule_file);
    std::stringstream text;
    if (!in || !(text << in.rdbuf())) {
      return Invalid(absl::StrCat("--schedule_file=", request.schedule_file, ": cannot read it: ", std::strerror(errno)));
    }
    out.spec.mutable_pipeline()->set_schedule_text(text.str());
    if (absl::Status s = TakeMicroBatchesFromSchedule(request, out.spec); !s.ok()) return s;
  }
  if (IsModelJob(out.spec)) {
    if (absl::Status s = ResolveModel(out.spec, request.custom_worker); !s.ok()) return s;
  }
  if (out.spec.name().empty()) out.spec.set_name(out.spec.model());
  return out;
}

}  // namespace stagehand
