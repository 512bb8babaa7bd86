// Job resolution and validation: flags over the job file over defaults, every value ranged, checked
// against the devices and the machine.
#include "launcher/job/job.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/escaping.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "common/checkpoint.h"
#include "common/input_file.h"
#include "launcher/coordinator/liveness.h"
#include "launcher/job/job_options.h"
#include "launcher/job/run_dir.h"
#include "launcher/job/data_file.h"
#include "models/export_layout.h"
#include "models/registry.h"
#include "schedule/schedule.h"

namespace stagehand {
namespace {

constexpr int kDefaultCpuWorkers = 2;

// The training defaults each built-in preset carries, whichever way it was chosen (--model, the job
// file, a submitted spec, or the bare run's choice): the small CPU presets learn visibly at 3e-3, the
// large ones take the reference runs' 1e-4. A family's own name resolves to its preset first; a preset
// not listed (a user family's) takes kDefaultLr.
struct PresetDefaults {
  const char* preset;
  double lr;
};
constexpr PresetDefaults kPresetDefaults[] = {
    {"tiny", 3e-3},
    {"llama-tiny", 3e-3},
    {"gpt-1.3b", 1e-4},
    {"tinyllama-1.1b", 1e-4},
};
constexpr double kDefaultLr = 1e-4;

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

// Collects the parser's errors: the first one becomes the single line of the refusal (the default
// collector would log each to stderr besides).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat("line ", line + 1, " column ", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

// A JobSpec in protobuf text format from a regular file (common/input_file.h: a FIFO or a device is
// refused, never waited on). INVALID_ARGUMENT starting with `what` ("--job=PATH").
absl::StatusOr<JobSpec> ParseJobFile(const std::string& path, const std::string& what) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, what, int64_t{64} << 20);
  if (!text.ok()) return Invalid(std::string(text.status().message()));
  JobSpec spec;
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(*text, &spec)) {
    return Invalid(absl::StrCat(what, ": ", errors.first(), " (a JobSpec in protobuf text format: protos/job.proto)"));
  }
  return spec;
}

// Fills what neither the job file nor a flag set.
void ApplyDefaults(JobSpec& spec) {
  if (!spec.has_steps()) spec.set_steps(10);
  if (!spec.has_tensor_elements()) spec.set_tensor_elements(1 << 20);
  if (!spec.has_seed()) spec.set_seed(0);
  // The job's own switches that are on unless turned off, as protos/job.proto declares them.
  for (const JobOption& o : JobOptions()) {
    if (o.fields.size() == 1 && o.is_bool() && o.option->default_true() && !HasJobOption(o, spec)) {
      if (absl::Status s = SetJobOption(o, "true", spec); !s.ok()) std::abort();  // a bool takes "true"
    }
  }
  if (spec.health().empty()) spec.set_health("warn");
  if (!spec.has_profile_single_stage()) spec.set_profile_single_stage(false);
  Timeouts& t = *spec.mutable_timeouts();
  if (!t.has_register_ms()) t.set_register_ms(60000);
  if (!t.has_heartbeat_interval_ms()) t.set_heartbeat_interval_ms(kDefaultHeartbeatIntervalMs);  // liveness.h
  if (!t.has_heartbeat_timeout_ms()) t.set_heartbeat_timeout_ms(kDefaultHeartbeatTimeoutMs);
  if (!t.has_progress_timeout_ms()) t.set_progress_timeout_ms(300000);
  if (!t.has_nccl_init_ms()) t.set_nccl_init_ms(60000);
  if (!t.has_grace_ms()) t.set_grace_ms(3000);
}

}  // namespace

double PresetLr(const std::string& preset) {
  for (const PresetDefaults& d : kPresetDefaults) {
    if (preset == d.preset) return d.lr;
  }
  return kDefaultLr;
}

namespace {

absl::Status Positive(const char* flag, int64_t v) {
  if (v >= 1) return absl::OkStatus();
  return Invalid(absl::StrCat("--", flag, "=", v, ": must be at least 1; pass --", flag, "=N with N >= 1"));
}

// The flags the user typed, over the job file: one overlay.
void ApplyRequest(const JobRequest& r, JobSpec& spec) { spec.MergeFrom(r.flags); }

// Names become a directory under runs/: no separators, no "..", nothing hidden.
absl::Status CheckName(const std::string& name) {
  const bool ok =
      !name.empty() && name.size() <= 64 && name[0] != '.' && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
      });
  if (ok) return absl::OkStatus();
  return Invalid(absl::StrCat("name: \"", absl::CHexEscape(name),
                              "\": a job's name names its directory under runs/; "
                              "use up to 64 of A-Z a-z 0-9 . _ - (not starting with .)"));
}

// Every number of the merged job in its range, before any default or preset fills the rest.
absl::Status ValidateRanges(const JobRequest& r, const JobSpec& spec) {
  if (r.gpus) {
    if (absl::Status s = Positive("gpus", *r.gpus); !s.ok()) return s;
    if (*r.gpus > kMaxWorkers) return Invalid(absl::StrCat("--gpus=", *r.gpus, ": pass at most ", kMaxWorkers));
  }
  if (absl::Status s = CheckJobOptionRanges(spec, r.flags, r.job_file); !s.ok()) return s;
  if (!spec.name().empty()) return CheckName(spec.name());
  return absl::OkStatus();
}

// The validation split (engine/data.h): a token file's end, held out of a model's training, large
// enough for one global batch, its forward part of the schedule free of deadlock; the evaluation
// flags only with a split. Fills eval_every and eval_batches.
absl::Status ResolveEval(JobSpec& spec) {
  const bool split = spec.val_fraction() > 0;
  if (!split) {
    if (spec.has_eval_every() || spec.has_eval_batches()) {
      return Invalid(absl::StrCat("--", spec.has_eval_every() ? "eval_every" : "eval_batches",
                                  " evaluates a validation split, and the job has none: pass --val_fraction=F "
                                  "(0 < F < 1) with --data=FILE, or drop it"));
    }
    return absl::OkStatus();
  }
  if (!IsModelJob(spec) || spec.pipeline().inference()) {
    return Invalid("--val_fraction evaluates a model during training: drop it (or --inference)");
  }
  if (spec.data().empty() || spec.data() == "synthetic") {
    return Invalid(
        "--val_fraction holds out the end of a token file, and the synthetic corpus has none: pass "
        "--data=FILE or drop --val_fraction");
  }
  if (spec.data_parallel() > 1) {
    return Invalid("--val_fraction with --data_parallel is not supported yet: drop one of them");
  }
  struct stat st;
  if (stat(spec.data().c_str(), &st) != 0)
    return Invalid(absl::StrCat("--data=", spec.data(), ": ", std::strerror(errno)));
  const int64_t tokens = st.st_size / 2, seq = spec.model_spec().seq(), batch = spec.pipeline().global_batch();
  const int64_t sequences =
      static_cast<int64_t>(std::floor(static_cast<double>(tokens) * spec.val_fraction())) / (seq + 1);
  if (sequences < batch) {
    const double need = std::ceil(1000.0 * static_cast<double>(batch * (seq + 1)) / static_cast<double>(tokens)) / 1000;
    return Invalid(absl::StrCat(
        "--val_fraction=", spec.val_fraction(), " holds ", sequences, " whole sequences of seq + 1 = ", seq + 1,
        " tokens of --data's ", tokens, " tokens, fewer than one evaluation batch (", "--global_batch=", batch,
        "); pass --val_fraction=", need, " or more", need < 1 ? "" : " (the file is too small: use a larger one)"));
  }
  if (tokens - sequences * (seq + 1) < seq + 1) {
    return Invalid(absl::StrCat("--val_fraction=", spec.val_fraction(), " leaves fewer than seq + 1 = ", seq + 1,
                                " tokens of --data to train on; pass a smaller --val_fraction"));
  }
  if (!spec.has_eval_every()) spec.set_eval_every(std::max<int64_t>(1, spec.steps() / 10));
  if (!spec.has_eval_batches()) spec.set_eval_batches(4);
  absl::StatusOr<Schedule> schedule = JobSchedule(spec);
  if (!schedule.ok()) return schedule.status();  // refused again, with its message, by the model's check
  const Schedule forward = ForwardPart(*schedule);
  if (absl::StatusOr<SimulationResult> sim = Simulate(forward, UniformCosts(forward.num_stages)); !sim.ok()) {
    return Invalid(absl::StrCat("--val_fraction: the forward part of the ", schedule->name,
                                " schedule (its evaluation) cannot run: ", sim.status().message()));
  }
  return absl::OkStatus();
}

// The pipeline's counts, checked: they do not depend on the model. (The schedule is checked by the
// schedule library, and the partition and the memory with the model's description: launcher/plan/job_plan.h.)
absl::Status ValidatePipeline(const JobSpec& job) {
  const PipelineSpec& p = job.pipeline();
  if (p.stages() < 1) return Invalid("--pipeline_stages must be at least 1");
  const int d = std::max(1, job.data_parallel());
  if (int64_t{p.stages()} * d != job.workers()) {
    return Invalid(absl::StrCat("--pipeline_stages=", p.stages(), " x --data_parallel=", d, " is ",
                                int64_t{p.stages()} * d, " workers but the job has ", job.workers(),
                                "; workers = stages x replicas: pass --data_parallel=", job.workers() / p.stages(),
                                " with a stage count that divides the workers"));
  }
  if (job.shard_optimizer() && d < 2) {
    return Invalid("--shard_optimizer shards the optimizer over the replicas: pass --data_parallel=2 or more");
  }
  // Not yet combined with replicas: the global norm must be taken after the replicas' averaging, and a
  // checkpoint would hold each stage once per replica (and ZeRO's state in shards).
  if (d > 1 && job.has_grad_clip()) {
    return Invalid("--grad_clip with --data_parallel is not supported yet: drop one of them");
  }
  if (d > 1 && (job.has_checkpoint_every() || !job.resume().empty())) {
    return Invalid("--checkpoint_every and --resume with --data_parallel are not supported yet: drop one of them");
  }
  if (p.micro_batches() < 1) return Invalid("--micro_batches must be at least 1");
  // What the schedule's checks cost before the start (kMaxPipelinePairs).
  const int64_t chunks = std::max(1, p.stage_chunks());
  const int64_t pairs = int64_t{p.stages()} * chunks * p.micro_batches();
  if (pairs > kMaxPipelinePairs) {
    return Invalid(absl::StrCat("--micro_batches=", p.micro_batches(), " on ", p.stages(), " stages",
                                chunks > 1 ? absl::StrCat(" x ", chunks, " chunks") : "", " is ", pairs,
                                " (stage, micro-batch) pairs, more than the ", kMaxPipelinePairs,
                                " a schedule is checked for before the start; pass --micro_batches=",
                                std::max<int64_t>(1, kMaxPipelinePairs / (p.stages() * chunks)), " or fewer"));
  }
  if (p.global_batch() < 1 || p.global_batch() % (int64_t{p.micro_batches()} * d) != 0) {
    if (d == 1) {
      return Invalid(absl::StrCat("--global_batch=", p.global_batch(), " does not split into ", p.micro_batches(),
                                  " equal micro-batches; pass a multiple of --micro_batches"));
    }
    return Invalid(absl::StrCat("--global_batch=", p.global_batch(), " does not split into ", d, " replicas x ",
                                p.micro_batches(), " equal micro-batches; pass a multiple of ",
                                int64_t{p.micro_batches()} * d));
  }
  if (!job.layout().empty() && job.layout() != "manual" && job.layout() != "auto") {
    return Invalid(absl::StrCat("--layout=", job.layout(), ": use manual or auto"));
  }
  if (!job.layout_profiles().empty() && job.layout() != "auto") {
    return Invalid("--layout_profiles plans a --layout=auto job: pass --layout=auto, or drop them");
  }
  return absl::OkStatus();
}

// Several model chunks per worker (p * V virtual stages): each needs a pipeline layer of its own.
// (Whether the schedule takes the chunk count, and interleaved's m % p, the schedule library says.)
absl::Status CheckVirtualStages(const JobSpec& spec) {
  const PipelineSpec& p = spec.pipeline();
  if (p.stage_chunks() <= 1 || !p.schedule_text().empty()) return absl::OkStatus();
  const ModelDescription* d = FindBuiltinModel(spec.model());
  if (d == nullptr) return absl::OkStatus();
  const int layers = d->NumLayers(spec.model_spec());
  const int64_t virtual_stages = int64_t{p.stages()} * p.stage_chunks();
  if (virtual_stages <= layers) return absl::OkStatus();
  return Invalid(absl::StrCat("--schedule=", p.schedule(), " with --stage_chunks=", p.stage_chunks(), " on ",
                              p.stages(), " stages needs ", virtual_stages, " virtual stages but the model has only ",
                              layers, " pipeline layers; use fewer --stage_chunks or workers, or more --layers"));
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
    return Invalid(absl::StrCat("--model=", spec.model(),
                                ": unknown model; known: ", absl::StrJoin(KnownModels(), ", "),
                                "; a model family of your own runs with --worker_binary=YOUR_WORKER "
                                "(docs/custom_model.md)"));
  }  // else: its worker binary's family resolves the sizes (worker/pipeline.cc)
  PipelineSpec& p = *spec.mutable_pipeline();
  // Workers = stages x replicas: either given, the other follows (one stage per worker when neither is).
  if (!p.has_stages()) p.set_stages(std::max(1, spec.workers() / std::max(1, spec.data_parallel())));
  if (!spec.has_data_parallel()) spec.set_data_parallel(std::max(1, spec.workers() / p.stages()));
  if (p.schedule().empty()) p.set_schedule("1f1b");
  // Written only where it is not 1, so that other jobs' resolved files stay as they were.
  if (!p.has_stage_chunks() && DefaultChunks(p.schedule()) > 1) p.set_stage_chunks(DefaultChunks(p.schedule()));
  if (absl::Status s = CheckVirtualStages(spec); !s.ok()) return s;
  if (const ModelDescription* d = FindBuiltinModel(spec.model()); d != nullptr) {
    const int layers = d->NumLayers(spec.model_spec());
    if (p.stages() > layers) {
      return Invalid(absl::StrCat(p.stages(), " stages but the model has only ", layers, " pipeline layers (",
                                  d->DescribeLayers(spec.model_spec()), "); use at most ", layers,
                                  " stages or more --layers"));
    }
  }
  if (!p.has_micro_batches()) {
    // Interleaved runs micro-batches in rounds of one per stage: the default is a whole number of rounds.
    const int rounds = p.schedule() == "interleaved-1f1b" ? p.stages() : 1;
    p.set_micro_batches((std::max(8, p.stages()) + rounds - 1) / rounds * rounds);
  }
  if (!p.has_global_batch()) p.set_global_batch(std::max<int64_t>(32, p.micro_batches()));
  if (p.partition().empty()) p.set_partition("auto");
  if (!spec.has_lr())
    spec.set_lr(PresetLr(spec.model_spec().preset().empty() ? spec.model() : spec.model_spec().preset()));
  return ValidatePipeline(spec);
}

// A schedule file says how many micro-batches it runs: that is the job's count, unless the flags ask
// for another, which cannot work.
absl::Status TakeMicroBatchesFromSchedule(const JobRequest& r, JobSpec& spec) {
  absl::StatusOr<Schedule> parsed = ParseSchedule(spec.pipeline().schedule_text(), "file", 1);
  if (!parsed.ok()) {
    return Invalid(absl::StrCat("--schedule_file=", r.schedule_file, ": ", parsed.status().message()));
  }
  int64_t m = 0;  // 64 bits: a list may name micro-batch INT_MAX
  for (const std::vector<Action>& rank : parsed->ranks) {
    for (const Action& a : rank) m = std::max<int64_t>(m, int64_t{a.microbatch} + 1);
  }
  // The same bound as --micro_batches (ValidateRanges): a list naming micro-batch 10^9 must not size
  // the simulator's tables.
  if (m > kMaxMicroBatches) {
    return Invalid(absl::StrCat("--schedule_file=", r.schedule_file, " names micro-batch ", m - 1,
                                "; a schedule runs at most ", kMaxMicroBatches, " micro-batches"));
  }
  if (r.flags.pipeline().has_micro_batches() && r.flags.pipeline().micro_batches() != m) {
    return Invalid(absl::StrCat("--schedule_file=", r.schedule_file, " runs ", m, " micro-batches but --micro_batches=",
                                r.flags.pipeline().micro_batches(), "; drop --micro_batches or pass ", m));
  }
  spec.mutable_pipeline()->set_micro_batches(static_cast<int32_t>(m));
  return absl::OkStatus();
}

// The job of a bare `launcher`: a model that visibly learns, sized to what the devices show. On CPU
// workers the tiny GPT, whose loss falls from ln 256 = 5.5 to about 1 within seconds; on GPUs the
// reference gpt-1.3b for long enough to show what they give. Flags the user set are kept; the
// learning rate is the preset's (kPresetDefaults), as with --model.
// `steps_given`: set by a flag, the job file or a submitted spec, before the defaults.
void ChooseDefaultModel(const JobRequest& r, bool steps_given, ResolvedJob& out) {
  const bool cpu = out.spec.device() == "cpu";
  out.spec.set_model(cpu ? "tiny" : "gpt-1.3b");
  if (r.job_file.empty() && !steps_given) out.spec.set_steps(cpu ? 200 : 30);
  out.notes.push_back(absl::StrCat("no --model given: training ", out.spec.model(), " for ", out.spec.steps(),
                                   " steps (--model=allreduce runs the checked collective instead)"));
}

// --tensor_elements sizes the checked all-reduce alone. With a model it would be ignored: a script that
// means to time the collective (as bench/bench_startup does) would time a model's first training step
// instead, and one GPU runs no collective at all.
absl::Status CheckAllReduceFlags(const JobRequest& r, bool model_given, const JobSpec& spec) {
  if (!r.flags.has_tensor_elements() || !IsModelJob(spec)) return absl::OkStatus();
  if (!model_given) {
    return Invalid(
        absl::StrCat("--tensor_elements sizes the all-reduce of --model=allreduce, and with no --model "
                     "this job would train ",
                     spec.model(),
                     " instead: pass --model=allreduce, or drop "
                     "--tensor_elements"));
  }
  return Invalid(absl::StrCat("--tensor_elements sizes the all-reduce of --model=allreduce, not --model=", spec.model(),
                              "'s job: drop --tensor_elements"));
}

// What ranges alone cannot say: relations between the merged values, once the defaults are in.
absl::Status ValidateRelations(const JobSpec& spec) {
  const Timeouts& t = spec.timeouts();
  if (t.heartbeat_timeout_ms() < 2 * t.heartbeat_interval_ms()) {
    return Invalid(absl::StrCat("--heartbeat_timeout_ms=", t.heartbeat_timeout_ms(),
                                " must be at least twice the heartbeat interval (", t.heartbeat_interval_ms(),
                                " ms); pass --heartbeat_timeout_ms=", 2 * t.heartbeat_interval_ms(), " or more"));
  }
  const std::string& d = spec.device();
  if (!d.empty() && d != "auto" && d != "cpu" && d != "cuda") {
    return Invalid(absl::StrCat("--device=", d, ": unknown device; use cuda, cpu or auto"));
  }
  const std::string& h = spec.health();
  if (h != "off" && h != "warn" && h != "strict") {
    return Invalid(absl::StrCat("--health=", absl::CHexEscape(h),
                                " (or the job file's health:): unknown; use off, "
                                "warn (the default) or strict"));
  }
  return absl::OkStatus();
}

// CPU workers are processes of this machine: more than it has memory for is refused (the kernel would
// kill processes at random), more than kCpuWorkersPerCore per core too; more than its cores is a note.
absl::Status CheckCpuWorkers(int n, const DeviceInventory& inv, std::vector<std::string>& notes) {
  if (inv.memory_bytes > 0 && int64_t{n} * kCpuWorkerBytes > inv.memory_bytes) {
    const int64_t fit = std::max<int64_t>(1, inv.memory_bytes / kCpuWorkerBytes);
    return Invalid(absl::StrCat("--workers=", n, ": ", n, " CPU workers need at least ", n * (kCpuWorkerBytes >> 20),
                                " MiB (", kCpuWorkerBytes >> 20, " MiB each) but this machine has ",
                                inv.memory_bytes >> 20, " MiB available; pass --workers=", fit, " or fewer"));
  }
  if (inv.cpu_cores > 0 && n > kCpuWorkersPerCore * inv.cpu_cores) {
    return Invalid(absl::StrCat("--workers=", n, ": more than ", kCpuWorkersPerCore, " CPU workers per core on ",
                                inv.cpu_cores, " cores; pass --workers=", kCpuWorkersPerCore * inv.cpu_cores,
                                " or fewer"));
  }
  if (inv.cpu_cores > 0 && n > inv.cpu_cores) {
    notes.push_back(
        absl::StrCat("warning: ", n, " CPU workers on ", inv.cpu_cores,
                     " cores: they share the cores, so steps are slower than with --workers=", inv.cpu_cores));
  }
  return absl::OkStatus();
}

std::string Visible(const DeviceInventory& inv) {
  std::string s = absl::StrCat(inv.gpus.size(), inv.gpus.size() == 1 ? " is" : " are", " visible");
  if (inv.cuda_visible_devices_set) absl::StrAppend(&s, " (CUDA_VISIBLE_DEVICES=", inv.cuda_visible_devices, ")");
  return s;
}

// Picks the device kind and worker count from the merged job (spec.device: the flag over the file);
// fills `out` with GPUs and notes.
absl::Status ChooseDevices(const JobRequest& r, const DeviceInventory& inv, ResolvedJob& out) {
  JobSpec& spec = out.spec;
  std::string device = spec.device();
  const bool auto_device = device.empty() || device == "auto";
  if (auto_device) device = r.gpus || !inv.gpus.empty() ? "cuda" : "cpu";
  if (r.gpus && r.flags.device().empty() && device == "cpu") device = "cuda";  // the flag overrides the job file
  if (device == "cpu") {
    if (r.gpus) return Invalid("--gpus and --device=cpu contradict each other; use --workers=N for CPU workers");
    const int n = spec.has_workers() ? spec.workers() : kDefaultCpuWorkers;
    if (auto_device) {
      out.notes.push_back(absl::StrCat("no GPU visible (", inv.note, "): running ", n,
                                       " CPU workers; pass --device=cpu --workers=N to choose the count"));
    }
    if (absl::Status s = CheckCpuWorkers(n, inv, out.notes); !s.ok()) return s;
    spec.set_device("cpu");
    spec.set_workers(n);
    return absl::OkStatus();
  }
  const int n = r.gpus ? *r.gpus : (spec.has_workers() ? spec.workers() : static_cast<int>(inv.gpus.size()));
  if (r.flags.has_workers() && r.flags.workers() != n) {
    return Invalid(absl::StrCat("--workers=", r.flags.workers(), " with ", n,
                                " GPUs: GPU jobs run one worker per GPU; drop --workers or pass --gpus"));
  }
  if (inv.gpus.empty()) {
    return Invalid(
        absl::StrCat("asked for GPUs but none is visible (", inv.note, "); pass --device=cpu to run CPU workers"));
  }
  if (n > static_cast<int>(inv.gpus.size())) {
    return Invalid(
        absl::StrCat("asked for ", n, " GPUs but ", Visible(inv), "; pass --gpus=", inv.gpus.size(), " or fewer"));
  }
  spec.set_device("cuda");
  spec.set_workers(n);
  out.gpus.assign(inv.gpus.begin(), inv.gpus.begin() + n);
  return absl::OkStatus();
}

// The sizes a checkpoint's parameters were written with must be the job's (the partition, the stage
// and worker counts may differ: parameters are matched by name).
absl::Status SameModel(const std::string& flag, const CheckpointManifest& m, const JobSpec& spec) {
  const ModelSpec &a = m.model_spec(), &b = spec.model_spec();
  const std::vector<std::tuple<const char*, int64_t, int64_t>> sizes = {{"vocab", a.vocab(), b.vocab()},
                                                                        {"hidden", a.hidden(), b.hidden()},
                                                                        {"heads", a.heads(), b.heads()},
                                                                        {"kv_heads", a.kv_heads(), b.kv_heads()},
                                                                        {"ffn_hidden", a.ffn_hidden(), b.ffn_hidden()},
                                                                        {"layers", a.layers(), b.layers()},
                                                                        {"seq", a.seq(), b.seq()}};
  if (a.family() != b.family()) {
    return Invalid(absl::StrCat(flag, ": the checkpoint is of a ", a.family(), " model (", m.model(),
                                ") but --model=", spec.model(), " is ", b.family(), "; pass --model=", m.model()));
  }
  for (const auto& [name, want, got] : sizes) {
    if (want != got) {
      return Invalid(absl::StrCat(flag, ": the checkpoint's model has ", name, " ", want, " but this job's has ", got,
                                  "; pass --", name, "=", want));
    }
  }
  return absl::OkStatus();
}

// The refusal of a --resume whose checkpoint cannot be found or read.
absl::Status ResumeNotFound(const std::string& flag, const absl::Status& s) {
  return Invalid(absl::StrCat(flag, ": ", s.message(),
                              absl::IsNotFound(s) ? "; pass a run directory written with --checkpoint_every" : ""));
}

// The run directory a checkpoint's directory belongs to (<run_dir>/checkpoints/step_N), or "" when it
// lies elsewhere (a checkpoint copied out of its run).
std::string RunDirOfCheckpoint(const std::string& dir) {
  const size_t slash = dir.rfind('/');
  if (slash == std::string::npos || slash == 0) return "";
  const std::string parent = dir.substr(0, slash);
  const size_t up = parent.rfind('/');
  if (parent.substr(up == std::string::npos ? 0 : up + 1) != "checkpoints") return "";
  return up == std::string::npos ? "." : up == 0 ? "/" : parent.substr(0, up);
}

std::string Text(double v) { return absl::StrCat(v); }
std::string Text(int64_t v) { return absl::StrCat(v); }
std::string Text(bool v) { return v ? "true" : "false"; }
std::string DataText(const std::string& d) { return d.empty() || d == "synthetic" ? "synthetic" : d; }

// What the resumed job changes of the checkpointed one, for its one line.
class Changes {
 public:
  // A setting of the trajectory: the user's value (set: given) over the checkpointed job's (had: it set
  // one). Not given: the checkpointed value is taken. Given and different: a change, said.
  template <typename T, typename Has, typename Get, typename Set>
  void Setting(const char* flag, JobSpec& spec, const JobSpec& job, Has has, Get get, Set set) {
    if (!has(spec)) {
      if (has(job)) set(spec, get(job));
    } else if (!has(job) || get(job) != get(spec)) {
      Add(flag, Text(static_cast<T>(get(spec))), has(job) ? Text(static_cast<T>(get(job))) : "unset");
    }
  }
  void Add(const std::string& flag, const std::string& now, const std::string& was) {
    list_.push_back(absl::StrCat("--", flag, "=", now, " (was ", was, ")"));
  }
  bool empty() const { return list_.empty(); }
  std::string Line() const { return absl::StrJoin(list_, ", "); }

 private:
  std::vector<std::string> list_;
};

// --resume continues the job it resumes: the model and its sizes come from the checkpoint's manifest,
// the optimizer's, the learning-rate schedule's, the batch's, the data's and the checkpointing settings
// from the run's job.textproto (the job as that run resolved it). `spec` is what the user asked for (the
// job file and the flags); what it sets wins, except the model and its sizes, which a checkpoint cannot
// change (refused); a changed setting of the trajectory is said in one note. The layout (devices,
// workers, stages, schedule, micro-batches, partition) is this run's own: a checkpoint resumes on any.
absl::Status CarryResumedJob(const JobRequest& r, JobSpec& spec, std::vector<std::string>& notes) {
  const std::string flag = absl::StrCat("--resume=", r.flags.resume().empty() ? spec.resume() : r.flags.resume());
  absl::StatusOr<FoundCheckpoint> found = NewestCheckpoint(spec.resume());
  if (!found.ok()) return ResumeNotFound(flag, found.status());
  const CheckpointManifest& manifest = found->manifest;
  JobSpec job;
  const std::string run_dir = RunDirOfCheckpoint(found->dir);
  const std::string job_path = run_dir.empty() ? "" : run_dir + "/job.textproto";
  struct stat st;
  if (!job_path.empty() && lstat(job_path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
    return Invalid(absl::StrCat(flag, ": ", job_path,
                                " is a symbolic link; a run directory's job.textproto is a "
                                "regular file: resume a run this launcher wrote"));
  }
  if (!job_path.empty() && lstat(job_path.c_str(), &st) == 0) {
    absl::StatusOr<JobSpec> read = ParseJobFile(job_path, absl::StrCat(flag, ": the checkpointed job ", job_path));
    if (!read.ok()) return read.status();
    job = *std::move(read);
  } else {
    job.set_seed(manifest.seed());
    job.set_data(manifest.data());
    notes.push_back(absl::StrCat("--resume: ", found->dir,
                                 " has no job.textproto beside it: continuing its model, "
                                 "seed and data; the other settings are this run's flags and the defaults"));
  }
  // The model: the checkpoint's, whose parameters these are.
  if (!spec.model().empty() && spec.model() != manifest.model()) {
    return Invalid(absl::StrCat(flag, ": the checkpoint is of ", manifest.model(), " but --model=", spec.model(),
                                "; a resumed run continues its model: drop --model (or pass --model=", manifest.model(),
                                ")"));
  }
  spec.set_model(manifest.model());
  const ModelSpec &had = manifest.model_spec(), &asked = spec.model_spec();
  const std::vector<std::tuple<const char*, bool, bool, double, double>> sizes = {
      {"vocab", had.has_vocab(), asked.has_vocab(), double(had.vocab()), double(asked.vocab())},
      {"hidden", had.has_hidden(), asked.has_hidden(), double(had.hidden()), double(asked.hidden())},
      {"heads", had.has_heads(), asked.has_heads(), double(had.heads()), double(asked.heads())},
      {"kv_heads", had.has_kv_heads(), asked.has_kv_heads(), double(had.kv_heads()), double(asked.kv_heads())},
      {"ffn_hidden", had.has_ffn_hidden(), asked.has_ffn_hidden(), double(had.ffn_hidden()),
       double(asked.ffn_hidden())},
      {"layers", had.has_layers(), asked.has_layers(), double(had.layers()), double(asked.layers())},
      {"seq", had.has_seq(), asked.has_seq(), double(had.seq()), double(asked.seq())},
      {"rope_theta", had.has_rope_theta(), asked.has_rope_theta(), had.rope_theta(), asked.rope_theta()},
      {"norm_eps", had.has_norm_eps(), asked.has_norm_eps(), had.norm_eps(), asked.norm_eps()},
  };
  for (const auto& [name, has_had, has_asked, was, now] : sizes) {
    if (has_asked && has_had && was != now) {
      return Invalid(absl::StrCat(flag, ": --", name, "=", now, " but the checkpointed model has ", name, " ", was,
                                  "; a resumed run keeps its model's sizes: drop --", name, " (or pass --", name, "=",
                                  was, ")"));
    }
  }
  Changes changes;
  if (asked.has_fp32() && asked.fp32() != (had.has_fp32() && had.fp32())) {
    changes.Add("fp32", Text(asked.fp32()), Text(had.has_fp32() && had.fp32()));
  }
  ModelSpec model = had;
  model.MergeFrom(asked);  // the sizes agree; the user's kernels, fp32 and options win
  *spec.mutable_model_spec() = std::move(model);
  // The trajectory: the optimizer, the learning-rate schedule, the batch, the seed and the data.
#define STAGEHAND_SETTING(T, flag, field)                                                                            \
  changes.Setting<T>(                                                                                                \
      flag, spec, job, [](const JobSpec& j) { return j.has_##field(); }, [](const JobSpec& j) { return j.field(); }, \
      [](JobSpec& j, auto v) { j.set_##field(v); })
  STAGEHAND_SETTING(double, "lr", lr);
  STAGEHAND_SETTING(double, "min_lr", min_lr);
  STAGEHAND_SETTING(double, "weight_decay", weight_decay);
  STAGEHAND_SETTING(double, "grad_clip", grad_clip);
  STAGEHAND_SETTING(int64_t, "warmup_steps", warmup_steps);
  STAGEHAND_SETTING(int64_t, "lr_decay_steps", lr_decay_steps);
  STAGEHAND_SETTING(int64_t, "seed", seed);
  STAGEHAND_SETTING(double, "val_fraction", val_fraction);
#undef STAGEHAND_SETTING
  changes.Setting<int64_t>(
      "global_batch", spec, job, [](const JobSpec& j) { return j.pipeline().has_global_batch(); },
      [](const JobSpec& j) { return j.pipeline().global_batch(); },
      [](JobSpec& j, int64_t v) { j.mutable_pipeline()->set_global_batch(v); });
  if (spec.data().empty()) {
    spec.set_data(job.data());
  } else if (DataText(spec.data()) != DataText(job.data())) {
    changes.Add("data", DataText(spec.data()), DataText(job.data()));
  }
  // The steps: the checkpointed job's target unless given. More steps change nothing already run,
  // except the cosine decay's end when it follows the steps.
  const bool decay_follows_steps = (spec.has_warmup_steps() || spec.has_min_lr()) && !spec.has_lr_decay_steps();
  if (!spec.has_steps()) {
    if (job.has_steps()) spec.set_steps(job.steps());
  } else if (decay_follows_steps && job.has_steps() && spec.steps() != job.steps()) {
    changes.Add("steps", Text(spec.steps()), absl::StrCat(job.steps(), ": the cosine decay ends at --steps"));
  }
  // Checkpointing, evaluation and the export carry on as the job had them.
  if (!spec.has_checkpoint_every() && job.has_checkpoint_every()) spec.set_checkpoint_every(job.checkpoint_every());
  if (!spec.has_keep_checkpoints() && job.has_keep_checkpoints()) spec.set_keep_checkpoints(job.keep_checkpoints());
  if (!spec.has_max_restarts() && job.has_max_restarts()) spec.set_max_restarts(job.max_restarts());
  if (!spec.has_term_checkpoint_timeout_ms() && job.has_term_checkpoint_timeout_ms()) {
    spec.set_term_checkpoint_timeout_ms(job.term_checkpoint_timeout_ms());
  }
  if (spec.val_fraction() > 0) {
    if (!spec.has_eval_every() && job.has_eval_every()) spec.set_eval_every(job.eval_every());
    if (!spec.has_eval_batches() && job.has_eval_batches()) spec.set_eval_batches(job.eval_batches());
  }
  if (spec.export_dir().empty() && !job.export_dir().empty()) {
    // An export is written once, at the end: a run that got there has written it, and this one does not
    // replace it (ResolveExport refuses a directory that exists).
    struct stat exported;
    if (stat(UserPath(job.export_dir()).c_str(), &exported) == 0) {
      notes.push_back(absl::StrCat("--resume: the job's export ", job.export_dir(),
                                   " exists already, so this run "
                                   "does not export; pass --export_dir=NEW_DIR to export again"));
    } else {
      spec.set_export_dir(job.export_dir());
    }
  }
  if (!spec.has_save_params() && job.has_save_params()) spec.set_save_params(job.save_params());
  if (spec.name().empty()) spec.set_name(job.name());
  if (!changes.empty()) {
    notes.push_back(
        absl::StrCat("--resume: changed from the checkpointed job, so the run's trajectory differs from "
                     "an uninterrupted one: ",
                     changes.Line()));
  }
  return absl::OkStatus();
}

// --resume=RUN_DIR: its newest complete checkpoint, whole (every shard's SHA-256 checked), of the same
// model, and short of --steps. The job then names that checkpoint's directory. `steps_given`,
// `export_given`: the user asked for them (the job file or the flags), not the checkpointed job.
absl::Status ResolveResume(const JobRequest& r, bool steps_given, bool export_given, ResolvedJob& out) {
  JobSpec& spec = out.spec;
  const std::string flag = absl::StrCat("--resume=", r.flags.resume().empty() ? spec.resume() : r.flags.resume());
  if (!IsModelJob(spec)) return Invalid(absl::StrCat(flag, ": only a model's training resumes; drop --resume"));
  absl::StatusOr<FoundCheckpoint> found = NewestCheckpoint(spec.resume());
  if (!found.ok()) return ResumeNotFound(flag, found.status());
  for (const CheckpointShard& shard : found->manifest.shards()) {
    if (absl::Status s = VerifyShard(found->dir, shard); !s.ok()) return Invalid(absl::StrCat(flag, ": ", s.message()));
  }
  if (absl::Status s = SameModel(flag, found->manifest, spec); !s.ok()) return s;
  const int64_t step = found->manifest.step();
  // With --export_dir and no --steps (or --steps at the checkpoint's): export it, train nothing.
  const bool export_only = export_given && (!steps_given || spec.steps() == step);
  if (export_only) spec.set_steps(step);
  if (step >= spec.steps() && !export_only) {
    return Invalid(absl::StrCat(flag, ": its newest checkpoint has done ", step, " steps but --steps=", spec.steps(),
                                "; pass --steps=N with N > ", step,
                                export_given ? " (or no --steps, to export it without training)" : ""));
  }
  for (const std::string& skipped : found->skipped) {
    out.notes.push_back(absl::StrCat("skipping ", skipped, ": it has no manifest (its write was cut short)"));
  }
  out.notes.push_back(export_only ? absl::StrCat("exporting step ", step, " of ", found->dir, " without training")
                                  : absl::StrCat("resuming from step ", step, " of ", found->dir));
  spec.set_resume(found->dir);
  return absl::OkStatus();
}

// --export_dir: a directory that does not exist yet, in one that does; --init_from: an export whose
// config.json and tensors match the model (models/export_layout.h), read before anything starts.
absl::Status ResolveExport(ResolvedJob& out) {
  JobSpec& spec = out.spec;
  while (spec.export_dir().size() > 1 && spec.export_dir().back() == '/') spec.mutable_export_dir()->pop_back();
  if (!spec.export_dir().empty()) {
    const std::string& dir = spec.export_dir();
    const std::string flag = absl::StrCat("--export_dir=", dir);
    if (!IsModelJob(spec))
      return Invalid(absl::StrCat(flag, ": only a model has weights to export; drop --export_dir"));
    if (std::max(1, spec.data_parallel()) > 1) {
      return Invalid(absl::StrCat(flag, " with --data_parallel is not supported yet: drop one of them"));
    }
    struct stat st;
    if (lstat(dir.c_str(), &st) == 0) {
      return Invalid(absl::StrCat(flag, ": it exists already; pass a new directory (an export never replaces one)"));
    }
    const size_t slash = dir.find_last_of('/');
    const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : dir.substr(0, slash);
    if (stat(parent.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Invalid(absl::StrCat(flag, ": its parent ", parent, " is not a directory; create it first"));
    }
    if (access(parent.c_str(), W_OK) != 0) {
      return Invalid(absl::StrCat(flag, ": cannot write in ", parent, ": ", std::strerror(errno)));
    }
  }
  if (spec.init_from().empty()) return absl::OkStatus();
  const std::string flag = absl::StrCat("--init_from=", spec.init_from());
  if (!IsModelJob(spec)) return Invalid(absl::StrCat(flag, ": only a model starts from weights; drop --init_from"));
  absl::StatusOr<ExportDirectory> e = ReadExportDirectory(spec.init_from());
  if (!e.ok()) return Invalid(absl::StrCat(flag, ": ", e.status().message()));
  if (absl::Status s = CheckExportMatches(*e, spec.model_spec()); !s.ok()) {
    return Invalid(absl::StrCat(flag, ": ", s.message()));
  }
  out.notes.push_back(absl::StrCat("starting from the weights of ", spec.init_from()));
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

absl::StatusOr<JobSpec> ReadJobFile(const std::string& path) { return ParseJobFile(path, "--job=" + path); }

std::string CommandLine(const JobSpec& spec, size_t max_bytes) {
  return ClipInput(absl::StrJoin(spec.program(), " "), max_bytes);
}

// The job file and the token file are the user's paths: relative to where they ran `bazel run`.
absl::StatusOr<JobSpec> ReadJob(const JobRequest& r) {
  JobSpec spec = r.spec.value_or(JobSpec());
  if (!r.job_file.empty()) {
    absl::StatusOr<JobSpec> read = ReadJobFile(UserPath(r.job_file));
    if (!read.ok()) return read.status();
    spec = *std::move(read);
  }
  ApplyRequest(r, spec);
  if (!spec.data().empty() && spec.data() != "synthetic") spec.set_data(UserPath(spec.data()));
  if (!spec.run_dir().empty()) spec.set_run_dir(UserPath(spec.run_dir()));
  if (!spec.resume().empty()) spec.set_resume(UserPath(spec.resume()));
  if (!spec.export_dir().empty()) spec.set_export_dir(UserPath(spec.export_dir()));
  if (!spec.init_from().empty()) spec.set_init_from(UserPath(spec.init_from()));
  if (!spec.layout_profiles().empty()) {
    std::vector<std::string> paths;
    for (absl::string_view p : absl::StrSplit(spec.layout_profiles(), ',', absl::SkipEmpty())) {
      paths.push_back(UserPath(std::string(p)));
    }
    spec.set_layout_profiles(absl::StrJoin(paths, ","));
  }
  return spec;
}

// --schedule_file, a regular file of the user's (relative to where they ran `bazel run`), read whole.
absl::StatusOr<std::string> ReadScheduleText(const JobRequest& request) {
  absl::StatusOr<std::string> text = ReadRegularFile(
      UserPath(request.schedule_file), absl::StrCat("--schedule_file=", request.schedule_file), int64_t{64} << 20);
  if (!text.ok()) return Invalid(std::string(text.status().message()));
  return text;
}

absl::Status ReadScheduleFile(const JobRequest& request, JobSpec& spec) {
  absl::StatusOr<std::string> text = ReadScheduleText(request);
  if (!text.ok()) return text.status();
  spec.mutable_pipeline()->set_schedule_text(*std::move(text));
  return TakeMicroBatchesFromSchedule(request, spec);
}

namespace {

// The directory the user ran the launcher in (`bazel run`: theirs, not the runfiles').
std::string UserDirectory() {
  if (const char* wd = std::getenv("BUILD_WORKING_DIRECTORY")) return wd;
  char buf[4096];
  return getcwd(buf, sizeof buf) != nullptr ? buf : ".";
}

}  // namespace

// None of the model's flags apply to a program; --model is refused.
absl::Status ResolveProgram(const JobRequest& request, JobSpec& spec) {
  const std::string& name = request.program[0];
  // The typed --model, or a server's submission's (the client's flags merged into its JobSpec).
  const std::string model = !request.flags.model().empty() ? request.flags.model()
                            : request.spec                 ? request.spec->model()
                                                           : "";
  if (!model.empty()) {
    return Invalid(
        absl::StrCat("--model=", model, " with a program (-- ", name, "): the program is the job; drop --model"));
  }
  const std::string cwd = UserDirectory();
  std::string path;
  if (name.find('/') != std::string::npos) {
    path = name[0] == '/' ? name : absl::StrCat(cwd, "/", name);
  } else if (!name.empty()) {
    const char* env_path = std::getenv("PATH");
    for (absl::string_view dir : absl::StrSplit(env_path != nullptr ? env_path : "/usr/bin:/bin", ':')) {
      const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", name);
      struct stat st;
      if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0) {
        path = candidate[0] == '/' ? candidate : absl::StrCat(cwd, "/", candidate);
        break;
      }
    }
    if (path.empty()) {
      return Invalid(absl::StrCat("-- ", ClipInput(name), ": no such program on PATH; give its path (-- ./",
                                  ClipInput(name), ") or the interpreter that runs it (-- python3 ", ClipInput(name),
                                  ")"));
    }
  } else {
    return Invalid("-- with an empty program name: launcher [flags] -- PROGRAM [ARGS...]");
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return Invalid(absl::StrCat("-- ", ClipInput(name), ": ", ClipInput(path), ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode))
    return Invalid(absl::StrCat("-- ", ClipInput(name), ": ", ClipInput(path), " is not a file"));
  if (access(path.c_str(), X_OK) != 0) {
    return Invalid(absl::StrCat("-- ", ClipInput(name), ": ", ClipInput(path),
                                " is not executable: chmod +x it, or run it through its interpreter (-- python3 ",
                                ClipInput(name), ")"));
  }
  spec.clear_program();
  spec.add_program(path);
  for (size_t i = 1; i < request.program.size(); ++i) spec.add_program(request.program[i]);
  spec.set_program_cwd(cwd);
  spec.clear_model();
  return absl::OkStatus();
}

absl::StatusOr<ResolvedJob> ResolveJob(const JobRequest& request, const DeviceInventory& inventory) {
  ResolvedJob out;
  absl::StatusOr<JobSpec> merged = ReadJob(request);
  if (!merged.ok()) return merged.status();
  out.spec = *std::move(merged);
  // Ranges first, on what the user wrote or typed: a 0 is refused, never taken for "unset".
  if (absl::Status s = ValidateRanges(request, out.spec); !s.ok()) return s;
  // Flags that contradict each other are said first, before a resumed job's settings are read.
  if (!out.spec.resume().empty() && !out.spec.init_from().empty()) {
    return Invalid("--init_from and --resume both give the starting weights: drop one of them");
  }
  // What the user asked for, before a resumed job's settings fill the rest (CarryResumedJob).
  const bool steps_given = out.spec.has_steps(), export_given = !out.spec.export_dir().empty();
  if (!out.spec.resume().empty()) {
    if (absl::Status s = CarryResumedJob(request, out.spec, out.notes); !s.ok()) return s;
    if (request.check_resumed) {
      if (absl::Status s = request.check_resumed(out.spec); !s.ok()) return s;
    }
  }
  ApplyDefaults(out.spec);
  if (absl::Status s = ValidateRelations(out.spec); !s.ok()) return s;
  if (absl::Status s = ChooseDevices(request, inventory, out); !s.ok()) return s;
  out.host_workers = out.spec.workers();
  if (request.world_workers) out.spec.set_workers(*request.world_workers);
  // A program comes from the command line only (-- PROGRAM, or a server's command job), never from a
  // job file, a resumed run's job.textproto or a submission's JobSpec: a submit token must not make the
  // server a shell unless its admin says so (--allow_commands).
  if (out.spec.program_size() > 0 || !out.spec.program_cwd().empty()) {
    return Invalid(
        "the job names a program (its `program` field): a program is given on the launcher's "
        "command line only (launcher [flags] -- PROGRAM ARGS); drop the field");
  }
  if (!request.program.empty()) {  // a program job: the rest is the model's
    if (absl::Status s = ResolveProgram(request, out.spec); !s.ok()) return s;
    return out;
  }
  const bool model_given = !out.spec.model().empty();
  if (!model_given) ChooseDefaultModel(request, steps_given, out);
  if (absl::Status s = CheckAllReduceFlags(request, model_given, out.spec); !s.ok()) return s;
  if (!request.schedule_file.empty()) {
    if (absl::Status s = ReadScheduleFile(request, out.spec); !s.ok()) return s;
  }
  if (IsModelJob(out.spec)) {
    if (out.spec.layout() == "auto") {
      absl::StatusOr<std::vector<std::string>> lines = ApplyAutoLayout(out.spec, out.gpus, inventory.memory_bytes);
      if (!lines.ok()) return lines.status();
      out.notes.insert(out.notes.end(), lines->begin(), lines->end());
    }
    if (absl::Status s = ResolveModel(out.spec, request.custom_worker); !s.ok()) return s;
    const std::string& data = out.spec.data();
    if (!data.empty() && data != "synthetic") {
      const ModelSpec& m = out.spec.model_spec();
      if (absl::Status s = CheckTokenFile(data, m.seq(), m.vocab()); !s.ok()) return s;
    }
  }
  if (absl::Status s = ResolveEval(out.spec); !s.ok()) return s;
  if (!out.spec.resume().empty()) {
    if (absl::Status s = ResolveResume(request, steps_given, export_given, out); !s.ok()) return s;
  }
  if (absl::Status s = ResolveExport(out); !s.ok()) return s;
  if (out.spec.name().empty()) out.spec.set_name(out.spec.model());
  return out;
}

absl::StatusOr<ResolvedJob> ResolveHostDevices(const JobRequest& request, const DeviceInventory& inventory) {
  ResolvedJob out;
  const std::optional<int> workers =
      request.flags.has_workers() ? std::optional<int>(request.flags.workers()) : std::nullopt;
  for (const auto& [flag, n] : {std::pair{"workers", workers}, std::pair{"gpus", request.gpus}}) {
    if (n && (*n < 1 || *n > kMaxWorkers))
      return Invalid(absl::StrCat("--", flag, "=", *n, ": pass 1 to ", kMaxWorkers));
  }
  if (request.flags.has_workers()) out.spec.set_workers(request.flags.workers());
  if (!request.flags.device().empty()) out.spec.set_device(request.flags.device());
  if (absl::Status s = ChooseDevices(request, inventory, out); !s.ok()) return s;
  return out;
}

absl::StatusOr<JobSpec> MergeJobRequest(const JobRequest& request) {
  JobSpec spec;
  if (!request.job_file.empty()) {
    absl::StatusOr<JobSpec> read = ReadJobFile(UserPath(request.job_file));
    if (!read.ok()) return read.status();
    spec = *std::move(read);
  }
  ApplyRequest(request, spec);
  // The schedule is the client's file, the data and run directory the server's: only the first is read here.
  if (!request.schedule_file.empty()) {
    absl::StatusOr<std::string> text = ReadScheduleText(request);
    if (!text.ok()) return text.status();
    spec.mutable_pipeline()->set_schedule_text(*std::move(text));
  }
  return spec;
}

bool WritesTermCheckpoints(const JobSpec& job) {
  return IsModelJob(job) && !job.pipeline().inference() && job.has_checkpoint_every() &&
         absl::ToInt64Milliseconds(TermCheckpointTimeout(job)) > 0;
}

int64_t CheckpointAtOrPast(const std::string& run_dir, int64_t step) {
  absl::StatusOr<FoundCheckpoint> found = NewestCheckpoint(run_dir);
  return found.ok() && found->manifest.step() >= step ? found->manifest.step() : 0;
}

absl::Duration TermCheckpointTimeout(const JobSpec& job) {
  return absl::Milliseconds(job.has_term_checkpoint_timeout_ms() ? job.term_checkpoint_timeout_ms()
                                                                 : kDefaultTermCheckpointMs);
}

}  // namespace stagehand
