// A pipeline rank's run and the model profile (see pipeline.h). LibTorch translation unit; c10::Error
// becomes a Status at the public functions.
#include "worker/pipeline.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_option.h"
#include "common/log_message.h"
#include "models/model_description.h"
#include "common/checkpoint.h"
#include "common/fd.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/readahead.h"
#include "schedule/schedule_proto.h"
#include "worker/checkpoint.h"
#include "engine/lr_schedule.h"
#include "engine/data.h"
#include "worker/data_parallel.h"
#include "models/model_family.h"
#include "engine/stage.h"

namespace stagehand {
namespace {

// A developer's kernel trace (docs/profiling.md): with STAGEHAND_KERNEL_TRACE=PREFIX in a worker's
// environment, step STAGEHAND_KERNEL_TRACE_STEP (default 5) of rank R runs under the Kineto profiler
// (CUPTI: every kernel, also those a CUDA graph replays) and its Chrome trace goes to PREFIX.rankR.json.
class KernelTrace {
 public:
  KernelTrace(int rank, int64_t step) {
    const char* prefix = std::getenv("STAGEHAND_KERNEL_TRACE");
    if (prefix == nullptr || *prefix == '\0') return;
    const char* at = std::getenv("STAGEHAND_KERNEL_TRACE_STEP");
    if (step != (at != nullptr && *at != '\0' ? std::atoll(at) : 5)) return;
    path_ = absl::StrCat(prefix, ".rank", rank, ".json");
    namespace prof = torch::profiler::impl;
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    const std::set<prof::ActivityType> activities{prof::ActivityType::CPU, prof::ActivityType::CUDA};
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
  }
  ~KernelTrace() {
    if (path_.empty()) return;
    try {  // a developer's aid: a trace that cannot be written must not end the run
      if (torch::cuda::is_available()) torch::cuda::synchronize();
      torch::autograd::profiler::disableProfiler()->save(path_);
      LOG(INFO) << "kernel trace of this step: " << path_;
    } catch (const std::exception& e) {
      LOG(WARNING) << "kernel trace " << path_ << " not written: " << e.what();
    }
  }

 private:
  std::string path_;
};

torch::Device DeviceOf(const JobSpec& job) {
  return job.device() == "cuda" ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

absl::StatusOr<const ModelFamily*> FamilyOf(const JobSpec& job) {
  const ModelFamily* f = FindModelFamily(job.model());
  if (f == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("this worker binary has no model family for --model=", job.model(), " (it has ",
                     absl::StrJoin(RegisteredFamilies(), ", "), "); pass --worker_binary=a worker that registers it"));
  }
  if (absl::Status s = f->Prepare(job); !s.ok()) return s;
  return f;
}

// The job with its model's sizes resolved by the family this binary registers: the launcher resolves
// the built-in families' (and this is then a no-op), but knows nothing of a user's family.
absl::StatusOr<JobSpec> Resolved(const ModelFamily& family, JobSpec job) {
  absl::StatusOr<ModelSpec> spec = family.description().Resolve(job.model(), job.model_spec());
  if (!spec.ok()) return spec.status();
  *job.mutable_model_spec() = *std::move(spec);
  return job;
}

absl::StatusOr<std::unique_ptr<TokenSource>> MakeData(const JobSpec& job) {
  const ModelSpec& m = job.model_spec();
  if (job.data().empty() || job.data() == "synthetic") return MakeSyntheticCorpus(m.vocab(), m.seq(), job.seed());
  return OpenTokenFile(job.data(), m.vocab(), m.seq(), job.seed(), job.val_fraction());
}

// The held-out split, when the job evaluates (the launcher refuses a split without a token file).
absl::StatusOr<std::unique_ptr<TokenSource>> MakeValidationData(const JobSpec& job) {
  if (!(job.val_fraction() > 0)) return std::unique_ptr<TokenSource>();
  const ModelSpec& m = job.model_spec();
  return OpenValidationSplit(job.data(), m.vocab(), m.seq(), job.val_fraction());
}

bool EvalDue(const JobSpec& job, int64_t steps_done) {
  const int64_t every = job.eval_every() > 0 ? job.eval_every() : std::max<int64_t>(1, job.steps() / 10);
  return steps_done % every == 0 || steps_done == job.steps();
}

absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const ModelFamily& family, const JobSpec& job, int first, int last) {
  StageOptions o;
  o.job = &job;
  o.first_layer = first;
  o.last_layer = last;
  o.num_layers = family.description().NumLayers(job.model_spec());
  o.device = DeviceOf(job);
  o.seed = static_cast<uint64_t>(job.seed());
  o.init_on_device = BoolOption(job, JobSpec::kInitOnDeviceFieldNumber);
  return family.MakeStage(o);
}

// The rank's stages (its chunks, in increasing stage order) from the assignment's partition.
absl::StatusOr<std::vector<std::unique_ptr<Stage>>> MakeChunks(const ModelFamily& family, const Assignment& a,
                                                               const Schedule& schedule) {
  std::vector<int> first(a.layers_per_stage_size() + 1, 0);
  for (int s = 0; s < a.layers_per_stage_size(); ++s) first[s + 1] = first[s] + a.layers_per_stage(s);
  if (a.layers_per_stage_size() != schedule.num_stages) {
    return absl::InvalidArgumentError(absl::StrCat("the assignment splits the model into ", a.layers_per_stage_size(),
                                                   " stages but its schedule has ", schedule.num_stages));
  }
  std::vector<std::unique_ptr<Stage>> chunks;
  for (int s = 0; s < schedule.num_stages; ++s) {
    if (schedule.stage_rank[s] != a.rank()) continue;
    absl::StatusOr<std::unique_ptr<Stage>> stage = MakeStage(family, a.job(), first[s], first[s + 1]);
    if (!stage.ok()) return stage.status();
    chunks.push_back(*std::move(stage));
  }
  return chunks;
}

// params_rank<r>.pt: the rank's chunks in order; params_stage<v>.pt: each virtual stage's, so that
// the model reads in stage order however stages are placed (interleaved, a V).
absl::Status SaveParams(const Executor& executor, const std::string& dir, int rank) {
  auto cpu = [](const std::vector<torch::Tensor>& from) {
    std::vector<torch::Tensor> out;
    for (const auto& p : from) out.push_back(p.detach().cpu());
    return out;
  };
  torch::save(cpu(executor.Parameters()), absl::StrCat(dir, "/params_rank", rank, ".pt"));
  for (size_t c = 0; c < executor.chunk_stages().size(); ++c) {
    torch::save(cpu(executor.Parameters(static_cast<int>(c))),
                absl::StrCat(dir, "/params_stage", executor.chunk_stages()[c], ".pt"));
  }
  return absl::OkStatus();
}

// A worker on a host other than node 0's writes its checkpoint shards into node 0's run directory,
// its export beside the others', and reads --resume's checkpoint by node 0's paths: that needs one
// file system under those paths. Node 0 wrote <run_dir>/job_id before any worker started; a host
// that does not see it (or sees another job's) is refused here, before the first step, in one line.
absl::Status CheckNodeZeroPaths(const Assignment& a, const std::string& local_dir) {
  const JobSpec& job = a.job();
  if (local_dir.empty() || local_dir == job.run_dir()) return absl::OkStatus();
  if (!job.has_checkpoint_every() && job.resume().empty() && job.export_dir().empty()) return absl::OkStatus();
  auto refuse = [&](const std::string& what) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " on this host (", HostName(),
        "): a job on several hosts keeps its checkpoints in node 0's run "
        "directory and reads --resume and writes --export_dir by node 0's paths, so every host must see them at the "
        "same path (a shared file system): give node 0 a --run_dir (and --resume, --export_dir) there"));
  };
  std::ifstream in(job.run_dir() + "/job_id");
  std::string id;
  std::getline(in, id);
  if (id.empty()) return refuse(absl::StrCat("node 0's run directory ", job.run_dir(), " is not visible"));
  if (id != a.job_id()) {
    return refuse(absl::StrCat(job.run_dir(), " holds job ", id, ", not this job (", a.job_id(),
                               "): node 0's run directory is another directory"));
  }
  if (!job.resume().empty() && access((job.resume() + "/" + kManifestName).c_str(), R_OK) != 0) {
    return refuse(absl::StrCat("--resume's checkpoint ", job.resume(), " is not readable (", ErrnoText(errno), ")"));
  }
  return absl::OkStatus();
}

// The checkpoint this rank starts from: a restarted worker's run's own newest, else the job's --resume
// (the launcher resolved it to one checkpoint's directory); "" to start afresh.
absl::StatusOr<std::string> ResumeFrom(const JobSpec& job, int64_t incarnation) {
  if (incarnation > 1) {
    absl::StatusOr<FoundCheckpoint> own = NewestCheckpoint(job.run_dir());
    if (own.ok()) return own->dir;
    if (!absl::IsNotFound(own.status())) return own.status();
  }
  return job.resume();
}

bool CheckpointDue(const JobSpec& job, int64_t steps_done) {
  if (!job.has_checkpoint_every()) return false;
  return steps_done % job.checkpoint_every() == 0 || steps_done == job.steps();
}

CheckpointWriterOptions WriterOptions(const Assignment& a, const PipelineContext& context) {
  CheckpointWriterOptions o;
  o.job = &a.job();
  o.job_id = a.job_id();
  o.incarnation = context.incarnation;
  o.rank = a.rank();
  o.world_size = a.world_size();
  o.first_layer = a.first_layer();
  o.last_layer = a.last_layer();
  o.layers_per_stage.assign(a.layers_per_stage().begin(), a.layers_per_stage().end());
  o.kv = context.kv;
  return o;
}

// Seconds since `since`, for the startup lines in the log.
double SecondsSince(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

absl::Status RunPipelineImpl(Assignment a, Transport* transport, const PipelineStepCallback& on_step,
                             const PipelineContext& context) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<const ModelFamily*> family = FamilyOf(a.job());
  if (!family.ok()) return family.status();
  absl::StatusOr<JobSpec> resolved = Resolved(**family, a.job());
  if (!resolved.ok()) return resolved.status();
  *a.mutable_job() = *std::move(resolved);
  const JobSpec& job = a.job();
  absl::StatusOr<Schedule> schedule = FromProto(a.schedule());
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<std::unique_ptr<TokenSource>> data = MakeData(job);
  if (!data.ok()) return data.status();
  absl::StatusOr<std::unique_ptr<TokenSource>> val = MakeValidationData(job);
  if (!val.ok()) return val.status();
  const double data_s = SecondsSince(start);
  absl::StatusOr<std::vector<std::unique_ptr<Stage>>> chunks = MakeChunks(**family, a, *schedule);
  if (!chunks.ok()) return chunks.status();
  if (job.device() == "cuda") torch::cuda::synchronize();  // the draws and copies, for the line below
  const double built_s = SecondsSince(start);
  Streams streams(job.device() == "cuda");
  ExecutorOptions o;
  o.rank = a.rank();
  o.schedule = *schedule;
  o.micro_batch = MicroBatchSize(job);
  o.seq = job.model_spec().seq();
  o.lr = job.lr();  // the launcher fills the default
  if (job.has_weight_decay()) o.weight_decay = job.weight_decay();
  o.fused_optimizer = ModelOptionOn(job.model_spec(), "fused_optimizer");
  o.grad_clip = job.grad_clip();
  o.timing = BoolOption(job, JobSpec::kTimingFieldNumber);
  o.cuda_graphs = BoolOption(job, JobSpec::kCudaGraphsFieldNumber);
  o.device = DeviceOf(job);
  o.replicas = std::max(1, a.replica_group_size());
  o.replica = ReplicaOf(a);
  if (absl::Status s = CheckNodeZeroPaths(a, context.local_dir); !s.ok()) return s;
  absl::StatusOr<std::string> resume = ResumeFrom(job, context.incarnation);
  if (!resume.ok()) return resume.status();
  // Inference of a model with weights reports its loss (and the launcher its perplexity).
  o.inference_loss = job.pipeline().inference() && (!resume->empty() || !job.init_from().empty());
  Executor executor(std::move(o), *std::move(chunks), data->get(), transport, &streams);
  if (absl::Status s = executor.Check(); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<DataParallel>> replicas = AttachDataParallel(a, transport, executor, &streams);
  if (!replicas.ok()) return replicas.status();
  int64_t first_step = 0;
  if (!resume->empty()) {
    absl::StatusOr<int64_t> done = RestoreCheckpoint(*resume, executor, a.rank(), !job.pipeline().inference());
    if (!done.ok()) return done.status();
    first_step = *done;
    LOG(INFO) << "resuming at step " << first_step << " from " << *resume;
  } else if (!job.init_from().empty()) {
    if (absl::Status s = ImportWeights(job.init_from(), job.model_spec(), executor.NamedParameters()); !s.ok()) {
      return s;
    }
    LOG(INFO) << "weights from " << job.init_from();
  }
  std::optional<CheckpointWriter> writer;
  if (job.has_checkpoint_every() && !job.pipeline().inference()) writer.emplace(WriterOptions(a, context));
  const LrSchedule lr = LrScheduleOf(job);
  int64_t parameters = 0;
  for (const torch::Tensor& p : executor.Parameters()) parameters += p.numel();
  LOG(INFO) << "parameters: " << parameters << " in this rank's " << executor.chunk_stages().size()
            << (executor.chunk_stages().size() == 1 ? " stage" : " stages");
  const int eval_batches = job.eval_batches() > 0 ? job.eval_batches() : 4;
  int64_t stop_at = 0;         // the launcher's SIGTERM: a checkpoint after this many steps, then the end
  bool stopped_early = false;  // stopped at stop_at, before the last step
  // After the first step every library page this worker needs is mapped: recorded (a few ms, in a
  // thread of its own) for the next launch's readahead (common/readahead.h).
  ReadaheadRecorder readahead;
  const bool record_readahead = BoolOption(job, JobSpec::kPrefetchLibrariesFieldNumber);
  if (context.before_first_step) context.before_first_step();
  for (int64_t step = first_step; step < job.steps(); ++step) {
    executor.SetLearningRate(LearningRate(lr, step));
    absl::StatusOr<StepResult> r;
    {
      KernelTrace trace(a.rank(), step);
      r = executor.Step(step);
    }
    if (!r.ok()) {
      absl::Status s = r.status();
      if (executor.failed_action() >= 0)
        s.SetPayload(kFailedActionPayload, absl::Cord(absl::StrCat(executor.failed_action())));
      return s;
    }
    if (step == 0) {
      LogMessage(LogSeverity::kInfo, __FILE__, __LINE__).stream()
          << "startup: data " << data_s << " s, stages built " << built_s - data_s << " s (parameters drawn on "
          << (job.device() == "cuda" && BoolOption(job, JobSpec::kInitOnDeviceFieldNumber) ? "the device" : "the CPU")
          << "), step 0 " << r->seconds << " s; " << SecondsSince(start) << " s since the assignment";
    }
    const int64_t done = step + 1;
    // Every rank evaluates after the same steps (the forward part of its list exchanges activations).
    if (*val != nullptr && !job.pipeline().inference() && EvalDue(job, done)) {
      absl::StatusOr<std::optional<double>> loss = executor.Evaluate(**val, eval_batches);
      if (!loss.ok()) return loss.status();
      if (loss->has_value()) {
        r->has_val_loss = true;
        r->val_loss = **loss;
      }
    }
    r->parameters = parameters;
    absl::StatusOr<StepAnswer> answer = on_step(*r);
    if (!answer.ok()) return answer.status();
    if (step == first_step && record_readahead) readahead.Start(DefaultReadaheadDir());
    if (answer->checkpoint_and_stop_at > 0 && stop_at == 0) {
      stop_at = answer->checkpoint_and_stop_at;
      LOG(INFO) << "the launcher asks for a checkpoint after step " << stop_at << ", then the end (SIGTERM)";
    }
    const bool stop_here = stop_at > 0 && done >= stop_at;
    if (writer && (CheckpointDue(job, done) || stop_here)) {
      std::optional<c10::cuda::CUDAStreamGuard> guard;  // the copies queue behind the step's optimizer
      if (streams.cuda()) guard.emplace(streams.compute());
      if (absl::Status s = writer->Save(done, executor); !s.ok()) return s;
    }
    if (stop_here) {
      stopped_early = done < job.steps();
      break;
    }
  }
  if (record_readahead) {
    absl::StatusOr<std::string> recorded = readahead.Join();
    LOG(INFO) << (recorded.ok() ? *recorded
                                : absl::StrCat("library readahead list not written: ", recorded.status().message()));
  }
  if (writer) {
    if (absl::Status s = writer->Finish(); !s.ok()) return s;
  }
  // Stopped early for a SIGTERM checkpoint: the run is to be resumed, so its weights are not final:
  // no export under the final name, no --save_params.
  if (stopped_early) return absl::OkStatus();
  if (!job.export_dir().empty()) {
    if (absl::Status s = WriteExport(WriterOptions(a, context), executor); !s.ok()) return s;
  }
  if (job.save_params())
    return SaveParams(executor, context.local_dir.empty() ? job.run_dir() : context.local_dir, a.rank());
  return absl::OkStatus();
}

// Times fn (forward, or forward and backward) on the device: a warm-up, then the mean of `reps`.
double TimeMs(const std::function<void()>& fn, bool cuda, int reps = 3) {
  fn();
  if (cuda) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

int64_t Allocated(bool cuda) {
  if (!cuda) return 0;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[aggregate].current;
}

// One layer's costs: forward time, forward+backward time minus forward, memory kept by autograd.
absl::StatusOr<LayerCost> ProfileLayer(const ModelFamily& family, const JobSpec& job, int layer, int layers) {
  const bool cuda = job.device() == "cuda";
  const torch::Device device = DeviceOf(job);
  const int64_t mb = MicroBatchSize(job), seq = job.model_spec().seq(), vocab = job.model_spec().vocab();
  absl::StatusOr<std::unique_ptr<Stage>> made = MakeStage(family, job, layer, layer + 1);
  if (!made.ok()) return made.status();
  Stage& stage = **made;
  const bool first = layer == 0, last = layer == layers - 1;
  const TensorSpec in = stage.Input(mb);
  const auto options = torch::TensorOptions().dtype(in.dtype).device(device);
  torch::Tensor input =
      first ? torch::randint(vocab, in.sizes, options) : torch::randn(in.sizes, options).requires_grad_(true);
  torch::Tensor targets = torch::randint(vocab, {mb, seq}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  auto forward = [&] { return last ? stage.Loss(stage.Forward(input), targets) : stage.Forward(input); };
  auto both = [&] {
    torch::Tensor out = forward();
    stage.Backward(out, last ? torch::Tensor() : torch::ones_like(out));
  };
  LayerCost cost;
  if (cuda) {
    // What the executor runs: the layer's captured graphs, timed by events on the stream. (Timing eager
    // calls by the host clock counted milliseconds of host overhead into some layers' backward.)
    both();  // warm-up, and the gradients the graphs accumulate into
    {
      torch::NoGradGuard no_grad;
      for (auto& p : stage.Parameters()) p.mutable_grad().zero_();
    }
    stage.PrepareForGraphs();
    std::unique_ptr<GraphSlot> slot = CaptureSlot(stage, mb, seq, first, last, /*inference=*/false, 1, device);
    {
      torch::NoGradGuard no_grad;
      slot->input.copy_(input);
      if (slot->targets.defined()) slot->targets.copy_(targets);
    }
    auto replay_ms = [&](bool backward) {
      const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
      auto once = [&] {
        slot->forward.replay();
        if (backward) slot->backward.replay();
      };
      once();
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      start.record(stream);
      constexpr int kReps = 5;
      for (int i = 0; i < kReps; ++i) once();
      end.record(stream);
      end.synchronize();
      return static_cast<double>(start.elapsed_time(end)) / kReps;
    };
    const double fwd = replay_ms(false);
    cost.set_forward_ms(fwd);
    cost.set_backward_ms(std::max(0.0, replay_ms(true) - fwd));
  } else {
    double fwd = TimeMs(
        [&] {
          torch::NoGradGuard g;
          forward();
        },
        cuda);
    cost.set_forward_ms(fwd);
    cost.set_backward_ms(std::max(0.0, TimeMs(both, cuda) - fwd));
  }
  int64_t params = 0;
  for (const auto& p : stage.Parameters()) params += p.numel();
  cost.set_param_bytes(params * 16);  // fp32 parameter, gradient, two AdamW moments
  const int64_t before = Allocated(cuda);
  torch::Tensor kept = forward();
  cost.set_activation_bytes(std::max<int64_t>(0, Allocated(cuda) - before));
  return cost;
}

absl::StatusOr<LayerProfile> ProfileModelImpl(const JobSpec& unresolved) {
  absl::StatusOr<const ModelFamily*> family = FamilyOf(unresolved);
  if (!family.ok()) return family.status();
  absl::StatusOr<JobSpec> resolved = Resolved(**family, unresolved);
  if (!resolved.ok()) return resolved.status();
  const JobSpec& job = *resolved;
  const ModelDescription& d = (*family)->description();
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (job.device() == "cuda") guard.emplace(at::cuda::getStreamFromPool(false, 0));
  const int layers = d.NumLayers(job.model_spec());
  std::map<int, LayerCost> by_kind;  // layers of one kind have the same shapes: measured once
  LayerProfile profile;
  profile.set_micro_batch(MicroBatchSize(job));
  for (int i = 0; i < layers; ++i) {
    const int kind = d.LayerKind(job.model_spec(), i);
    if (!by_kind.count(kind)) {
      absl::StatusOr<LayerCost> cost = ProfileLayer(**family, job, i, layers);
      if (!cost.ok()) return cost.status();
      by_kind[kind] = *cost;
    }
    *profile.add_layers() = by_kind[kind];
  }
  return profile;
}

}  // namespace

void* PipelineCommStream() { return CommStream().stream(); }

absl::StatusOr<LayerProfile> DescribeLayers(const JobSpec& job) {
  absl::StatusOr<const ModelFamily*> family = FamilyOf(job);
  if (!family.ok()) return family.status();
  absl::StatusOr<JobSpec> resolved = Resolved(**family, job);
  if (!resolved.ok()) return resolved.status();
  LayerProfile profile;
  const int layers = (*family)->description().NumLayers(resolved->model_spec());
  for (int i = 0; i < layers; ++i) profile.add_layers();
  return profile;
}

absl::StatusOr<LayerProfile> ProfileModel(const JobSpec& job) {
  try {
    return ProfileModelImpl(job);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("profiling the model: ", e.what_without_backtrace()));
  }
}

std::unique_ptr<AttentionPrebuild> StartAttentionPrebuild(const JobSpec& job) {
  if (job.device() != "cuda" || !IsModelJob(job) || (job.has_prebuild_attention() && !job.prebuild_attention())) {
    return nullptr;
  }
  const ModelFamily* family = FindModelFamily(job.model());
  if (family == nullptr) return nullptr;  // RunPipeline says so
  absl::StatusOr<JobSpec> resolved = Resolved(*family, job);
  if (!resolved.ok()) return nullptr;
  const ModelSpec& m = resolved->model_spec();
  if (!(m.attention().empty() || m.attention() == "cudnn") || m.fp32()) return nullptr;
  try {
    return AttentionPrebuild::Start(family->AttentionCalls(*resolved), !job.pipeline().inference(), /*device=*/0);
  } catch (const std::exception& e) {  // a family's sizes it cannot read: step 0 builds the kernels
    LOG(WARNING) << "attention kernels not built ahead: " << e.what();
    return nullptr;
  }
}

absl::Status RunPipeline(const Assignment& a, Transport* transport, const PipelineStepCallback& on_step,
                         const PipelineContext& context) {
  try {
    return RunPipelineImpl(a, transport, on_step, context);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace stagehand
