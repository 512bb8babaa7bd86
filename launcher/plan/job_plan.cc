// The plan of a model job (see job_plan.h).
#include "launcher/plan/job_plan.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/input_file.h"
#include "google/protobuf/text_format.h"
#include "launcher/plan/layout.h"
#include "launcher/plan/plan_clocks.h"
#include "launcher/plan/planner.h"
#include "models/registry.h"
#include "schedule/schedule_proto.h"

namespace stagehand {
namespace {

absl::Status Invalid(absl::string_view what) { return absl::InvalidArgumentError(what); }

// The ranks of one pipeline: the workers of one replica.
int PipelineRanks(const JobSpec& job) { return job.workers() / std::max(1, job.data_parallel()); }

// Parses --partition: "auto", "uniform", or comma-separated pipeline-layer counts.
absl::StatusOr<std::vector<int>> ParsePartition(const std::string& text) {
  if (text.empty() || text == "auto" || text == "uniform") return std::vector<int>{};
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      return Invalid(absl::StrCat("--partition=", text,
                                  ": expected auto, uniform, or pipeline-layer counts like "
                                  "27,23 (each at least 1)"));
    }
    counts.push_back(n);
  }
  return counts;
}

// How many of the schedule's stages each rank holds (more than one when interleaved).
std::vector<int> StagesPerRank(const Schedule& schedule) {
  std::vector<int> n(schedule.num_ranks, 0);
  for (int r : schedule.stage_rank) ++n[r];
  return n;
}

// Each stage's share of its rank's memory: a rank's memory split evenly among the stages it holds.
std::vector<int64_t> StageMemory(const Schedule& schedule, const std::vector<int64_t>& rank_memory) {
  if (rank_memory.empty()) return {};
  const std::vector<int> per_rank = StagesPerRank(schedule);
  std::vector<int64_t> out;
  for (int r : schedule.stage_rank) out.push_back(rank_memory[r] / std::max(1, per_rank[r]));
  return out;
}

// Memory a stage holds per micro-batch in flight comes from the schedule: the most activations its
// rank keeps at once in the simulation, shared evenly among the rank's stages (an approximation when
// interleaved: the simulator counts activations per rank).
PlanRequest MakePlanRequest(const JobSpec& job, const Schedule& schedule, const SimulationResult& sim,
                            const std::vector<LayerCost>& layers, const std::vector<int64_t>& memory_bytes) {
  PlanRequest r;
  r.stages = schedule.num_stages;
  r.forward_only = schedule.forward_only;
  r.memory_bytes = memory_bytes;
  const int d = std::max(1, job.data_parallel());
  for (const LayerCost& c : layers) {
    // ZeRO-1: the parameter and its gradient (8 of the 16 bytes) whole, the AdamW moments 1/D.
    const int64_t bytes = job.shard_optimizer() ? c.param_bytes() / 2 + c.param_bytes() / (2 * d) : c.param_bytes();
    r.layers.push_back({c.forward_ms(), c.backward_ms(), bytes, c.activation_bytes()});
  }
  const std::vector<int> per_rank = StagesPerRank(schedule);
  for (int s = 0; s < r.stages; ++s) {
    const int rank = schedule.stage_rank[s];
    r.in_flight.push_back(std::max(1, (sim.peak_activations[rank] + per_rank[rank] - 1) / std::max(1, per_rank[rank])));
  }
  return r;
}

absl::StatusOr<Plan> MakePlan(const JobSpec& job, const PlanRequest& request) {
  const std::string& p = job.pipeline().partition();
  if (p == "auto") return PlanBalanced(request);
  if (p == "uniform") return PlanUniform(request);
  absl::StatusOr<std::vector<int>> counts = ParsePartition(p);
  if (!counts.ok()) return counts.status();
  return PlanExplicit(request, *counts);
}

// The replicas' all-reduce bandwidth: --replica_gbps, else the device kind's figure (layout.h).
double ReplicaGbps(const JobSpec& job) {
  return job.has_replica_gbps() ? job.replica_gbps() : FiguresFor(job.device() == "cuda").replica_gbps;
}

// The simulator's costs: each stage's forward and backward time from the layers it holds (a split
// backward's W taken as half of it, as layout.h does), the transfers between stages (a stage's fp32
// hidden states per micro-batch at the device kind's bandwidth), and AdamW's step for the fullest rank.
// Each stage's compute is at its device's speed (`speed` empty: 1 each).
StageCosts CostsOf(const JobSpec& job, const Schedule& schedule, const Plan& plan, const std::vector<LayerCost>& layers,
                   const std::vector<double>& speed = {}) {
  const DeviceFigures figures = FiguresFor(job.device() == "cuda");
  StageCosts c;
  c.overlap_communication = job.device() == "cuda";
  std::vector<int64_t> rank_params(schedule.num_ranks, 0);
  size_t layer = 0;
  for (size_t v = 0; v < plan.layers_per_stage.size(); ++v) {
    double f = 0, b = 0;
    int64_t params = 0;
    for (int i = 0; i < plan.layers_per_stage[v] && layer < layers.size(); ++i, ++layer) {
      f += layers[layer].forward_ms();
      b += layers[layer].backward_ms();
      params += layers[layer].param_bytes();
    }
    const double speed_v = v < speed.size() ? speed[v] : 1.0;
    c.forward.push_back(f / speed_v);
    c.backward.push_back(b / speed_v);
    if (v < schedule.stage_rank.size()) rank_params[schedule.stage_rank[v]] += params;
  }
  const ModelSpec& m = job.model_spec();
  if (schedule.num_ranks > 1 && figures.p2p_gbps > 0) {
    const double bytes = 4.0 * static_cast<double>(MicroBatchSize(job)) * m.seq() * m.hidden();
    c.p2p = figures.p2p_latency_ms + bytes / (figures.p2p_gbps * 1e6);
  }
  int64_t fullest = rank_params.empty() ? 0 : *std::max_element(rank_params.begin(), rank_params.end());
  if (job.shard_optimizer() && job.data_parallel() > 1) fullest /= job.data_parallel();
  c.optimizer = figures.optimizer_ms_per_gb * static_cast<double>(fullest) / 1e9;
  return c;
}

// One micro-batch's activations on rank `rank`: the layers of every stage it holds.
int64_t RankActivationBytes(const Plan& plan, const Schedule& schedule, const std::vector<LayerCost>& layers,
                            size_t rank) {
  int64_t bytes = 0;
  size_t layer = 0;
  for (size_t v = 0; v < plan.layers_per_stage.size(); ++v) {
    for (int i = 0; i < plan.layers_per_stage[v] && layer < layers.size(); ++i, ++layer) {
      if (v < schedule.stage_rank.size() && schedule.stage_rank[v] == static_cast<int>(rank)) {
        bytes += layers[layer].activation_bytes();
      }
    }
  }
  return bytes;
}

std::string Describe(const JobSpec& job, const Schedule& schedule, const Plan& plan,
                     const std::vector<LayerCost>& layers, bool profiled, const SimulationResult& predicted) {
  std::string counts;
  for (size_t i = 0; i < plan.layers_per_stage.size(); ++i) {
    absl::StrAppend(&counts, i ? "/" : "", plan.layers_per_stage[i]);
  }
  std::string out = absl::StrCat(job.pipeline().partition(), ": ", counts, " pipeline layers");
  // A family's estimate is in a GPU's milliseconds: against CPU workers its times mean nothing.
  const bool timed = profiled || job.device() == "cuda";
  if (timed) {
    absl::StrAppend(&out, "; stage ms");
    for (double ms : plan.stage_ms) absl::StrAppend(&out, absl::StrFormat(" %.2f", ms));
    absl::StrAppend(&out, profiled ? " (profiled)" : " (estimated)");
    absl::StrAppend(&out, absl::StrFormat("; predicted step %.1f ms, bubble %.1f%%", predicted.makespan,
                                          100 * predicted.bubble_fraction));
  } else {
    absl::StrAppend(&out, " (no profile: no time predicted on CPU workers)");
  }
  // The simulator's memory in flight: per rank, the most micro-batches whose activations it holds at
  // once (until the backward, or the W of a split one), and what that is in bytes.
  absl::StrAppend(&out, "; in flight per rank");
  for (size_t r = 0; r < predicted.peak_activations.size(); ++r) {
    absl::StrAppend(&out, r ? "/" : " ", predicted.peak_activations[r]);
  }
  absl::StrAppend(&out, " micro-batches (");
  for (size_t r = 0; r < predicted.peak_activations.size(); ++r) {
    const double bytes = static_cast<double>(predicted.peak_activations[r]) *
                         static_cast<double>(RankActivationBytes(plan, schedule, layers, r));
    absl::StrAppend(&out, r ? "/" : "",
                    bytes >= (1 << 30) ? absl::StrFormat("%.2f GiB", bytes / (1 << 30))
                                       : absl::StrFormat("%.1f MiB", bytes / (1 << 20)));
  }
  absl::StrAppend(&out, " of activations)");
  // Each kind of layer, forward + backward ms per micro-batch (its first one): what the partition was
  // made from. Only a built-in family's kinds are known here.
  const ModelDescription* d = FindBuiltinModel(job.model());
  if (timed && d != nullptr && static_cast<int>(layers.size()) == d->NumLayers(job.model_spec())) {
    std::vector<bool> seen(d->NumLayerKinds());
    absl::StrAppend(&out, "; layer ms (forward + backward):");
    for (size_t i = 0; i < layers.size(); ++i) {
      const int kind = d->LayerKind(job.model_spec(), static_cast<int>(i));
      if (seen[kind]) continue;
      seen[kind] = true;
      absl::StrAppend(&out, absl::StrFormat("%s %s %.2f + %.2f", i == 0 ? "" : ",", d->LayerKindName(kind),
                                            layers[i].forward_ms(), layers[i].backward_ms()));
    }
  }
  return out;
}

// The mean of the workers' profiles, each rescaled by `scale` (its clock over the reference clock:
// 1 when clock-blind) to the reference clock; a built-in family's estimate when none profiled; equal
// costs for a user's family that reported only its layer count.
std::vector<LayerCost> Costs(const JobSpec& job, const std::vector<WorkerState>& workers,
                             const std::vector<double>& scale, bool* profiled) {
  std::vector<LayerCost> mean(workers[0].profile.layers().begin(), workers[0].profile.layers().end());
  *profiled = !mean.empty() && (mean[0].forward_ms() > 0 || mean[0].backward_ms() > 0);
  if (*profiled) {
    for (LayerCost& c : mean) {
      c.set_forward_ms(c.forward_ms() * scale[0]);
      c.set_backward_ms(c.backward_ms() * scale[0]);
    }
    for (size_t w = 1; w < workers.size(); ++w) {
      for (int i = 0; i < static_cast<int>(mean.size()) && i < workers[w].profile.layers_size(); ++i) {
        const LayerCost& c = workers[w].profile.layers(i);
        mean[i].set_forward_ms(mean[i].forward_ms() + c.forward_ms() * scale[w]);
        mean[i].set_backward_ms(mean[i].backward_ms() + c.backward_ms() * scale[w]);
      }
    }
    for (LayerCost& c : mean) {
      c.set_forward_ms(c.forward_ms() / workers.size());
      c.set_backward_ms(c.backward_ms() / workers.size());
    }
    return mean;
  }
  if (const ModelDescription* d = FindBuiltinModel(job.model()); d != nullptr) {
    LayerProfile estimate = d->Estimate(job.model_spec(), MicroBatchSize(job));
    return {estimate.layers().begin(), estimate.layers().end()};
  }
  for (LayerCost& c : mean) {
    c.set_forward_ms(1);
    c.set_backward_ms(2);
  }
  return mean;
}

bool HasCommunication(const Schedule& s) {
  for (const std::vector<Action>& rank : s.ranks) {
    for (const Action& a : rank) {
      if (IsCommunication(a.kind)) return true;
    }
  }
  return false;
}

// Replica `replica`'s copy of a pipeline's schedule in the job's rank space: rank = replica x stages +
// the pipeline rank, so its stage_rank and every peer move by replica x ranks and the other replicas'
// lists are empty.
Schedule ForReplica(const Schedule& s, int replica, int replicas) {
  const int offset = replica * s.num_ranks;
  Schedule g = s;
  g.num_ranks = s.num_ranks * replicas;
  for (int& r : g.stage_rank) r += offset;
  g.ranks.assign(g.num_ranks, {});
  for (int r = 0; r < s.num_ranks; ++r) {
    std::vector<Action>& list = g.ranks[offset + r] = s.ranks[r];
    for (Action& a : list) {
      if (a.peer >= 0) a.peer += offset;
    }
  }
  return g;
}

// Data parallelism: every replica's lists, each rank's replica group (the ranks of its pipeline
// position, one per replica), the replicas' all-reduce in the prediction, and a line on it.
void AddReplicas(const JobSpec& job, const Schedule& schedule, const Plan& plan, const std::vector<LayerCost>& costs,
                 Partition& out) {
  const int d = job.data_parallel(), ranks = schedule.num_ranks;
  for (int replica = 0; replica < d; ++replica) {
    const Schedule g = ForReplica(schedule, replica, d);
    for (int r = 0; r < ranks; ++r) out.schedules.push_back(ToProto(g, replica * ranks + r));
  }
  for (int rank = 0; rank < ranks * d; ++rank) {
    std::vector<int> group;
    for (int replica = 0; replica < d; ++replica) group.push_back(replica * ranks + rank % ranks);
    out.replica_groups.push_back(group);
  }
  int64_t largest = 0;  // the fullest stage's fp32 gradients (the profile counts 16 bytes per parameter)
  size_t layer = 0;
  for (int n : plan.layers_per_stage) {
    int64_t bytes = 0;
    for (int i = 0; i < n && layer < costs.size(); ++i, ++layer) bytes += costs[layer].param_bytes() / 4;
    largest = std::max(largest, bytes);
  }
  const double gbps = ReplicaGbps(job);
  const double allreduce = FiguresFor(job.device() == "cuda").replica_latency_ms + AllReduceMs(largest, d, gbps);
  if (out.predicted_step_ms > 0) out.predicted_step_ms += allreduce;
  absl::StrAppend(
      &out.description,
      absl::StrFormat("; %d replicas (rank = replica x %d + stage), gradients averaged in buckets%s: "
                      "all-reduce %.2f MiB at %.0f GB/s predicted %.2f ms, step %.1f ms",
                      d, ranks, job.shard_optimizer() ? " (ZeRO-1: reduce-scatter, sharded AdamW, all-gather)" : "",
                      static_cast<double>(largest) / (1 << 20), gbps, allreduce, out.predicted_step_ms));
}

// The usable memory of one device for the layout: the smallest GPU's, or a CPU worker's share.
int64_t LayoutMemory(const JobSpec& job, const std::vector<GpuInfo>& gpus, int64_t cpu_memory_bytes) {
  if (job.device() == "cuda") {
    int64_t least = 0;
    for (const GpuInfo& g : gpus) least = least == 0 ? g.total_bytes * 9 / 10 : std::min(least, g.total_bytes * 9 / 10);
    return least;
  }
  if (cpu_memory_bytes <= 0) return 0;
  return std::max<int64_t>(1, cpu_memory_bytes * 8 / 10 / std::max(1, job.workers()) - kCpuWorkerBytes);
}

}  // namespace

namespace {

// --layout_profiles: recorded LayerProfiles (text format), one per micro-batch size, for `layers`
// pipeline layers. INVALID_ARGUMENT naming the file and what to change.
absl::StatusOr<std::vector<LayerProfileAt>> ReadLayoutProfiles(const std::string& list, int layers) {
  std::vector<LayerProfileAt> out;
  for (absl::string_view path : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    absl::StatusOr<std::string> text =
        ReadRegularFile(std::string(path), absl::StrCat("--layout_profiles: ", path), int64_t{64} << 20);
    if (!text.ok()) return Invalid(absl::StrCat(text.status().message(), " (a LayerProfile in text format)"));
    LayerProfile profile;
    if (!google::protobuf::TextFormat::ParseFromString(*text, &profile)) {
      return Invalid(absl::StrCat("--layout_profiles: ", path,
                                  " is not a readable LayerProfile in text format "
                                  "(protos/job.proto; launcher/plan/testdata/ holds examples)"));
    }
    if (profile.layers_size() != layers || profile.micro_batch() < 1) {
      return Invalid(absl::StrCat("--layout_profiles: ", path, " has ", profile.layers_size(),
                                  " layers at micro-batch ", profile.micro_batch(), "; this model has ", layers,
                                  " pipeline layers: profile this model (micro_batch at least 1)"));
    }
    LayerProfileAt at;
    at.micro_batch = profile.micro_batch();
    for (const LayerCost& c : profile.layers()) {
      at.layers.push_back({c.forward_ms(), c.backward_ms(), c.param_bytes(), c.activation_bytes()});
    }
    out.push_back(std::move(at));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ApplyAutoLayout(JobSpec& job, const std::vector<GpuInfo>& gpus,
                                                         int64_t cpu_memory_bytes) {
  PipelineSpec& p = *job.mutable_pipeline();
  if (p.has_stages() || job.has_data_parallel() || p.has_micro_batches() || !p.schedule().empty() ||
      !p.schedule_text().empty() || p.inference()) {
    return Invalid(
        "--layout=auto chooses --pipeline_stages, --data_parallel, --schedule and --micro_batches for "
        "training: drop them, or pass --layout=manual");
  }
  const ModelDescription* d = FindBuiltinModel(job.model());
  if (d == nullptr)
    return Invalid(absl::StrCat("--layout=auto plans with a built-in model's estimate; --model=", job.model(),
                                " is not one: pass --layout=manual"));
  absl::StatusOr<ModelSpec> m = d->Resolve(job.model(), job.model_spec());
  if (!m.ok()) return m.status();
  if (!p.has_global_batch()) p.set_global_batch(32);
  LayoutRequest r;
  std::string source;
  if (!job.layout_profiles().empty()) {
    absl::StatusOr<std::vector<LayerProfileAt>> profiles = ReadLayoutProfiles(job.layout_profiles(), d->NumLayers(*m));
    if (!profiles.ok()) return profiles.status();
    r.profiles = *std::move(profiles);
    source = absl::StrCat(r.profiles.size(), " recorded profile", r.profiles.size() == 1 ? "" : "s");
  } else {
    // At 4 sequences, the size the estimate is fitted at (to the H200 profiles of launcher/plan/testdata).
    const LayerProfile estimate = d->Estimate(*m, 4);
    LayerProfileAt at;
    at.micro_batch = 4;
    for (const LayerCost& c : estimate.layers()) {
      at.layers.push_back({c.forward_ms(), c.backward_ms(), c.param_bytes(), c.activation_bytes()});
    }
    r.profiles.push_back(std::move(at));
    source = absl::StrCat(job.model(), "'s estimate (--layout_profiles=FILES plans from measured ones)");
  }
  const DeviceFigures figures = FiguresFor(job.device() == "cuda");
  r.workers = job.workers();
  r.global_batch = p.global_batch();
  r.memory_bytes = LayoutMemory(job, gpus, cpu_memory_bytes);
  r.replica_gbps = ReplicaGbps(job);
  r.replica_latency_ms = figures.replica_latency_ms;
  r.p2p_gbps = figures.p2p_gbps;
  r.p2p_latency_ms = figures.p2p_latency_ms;
  r.boundary_bytes_per_seq = int64_t{4} * m->seq() * m->hidden();  // fp32 hidden states
  r.optimizer_ms_per_gb = figures.optimizer_ms_per_gb;
  r.layer_fixed_forward_ms = figures.layer_fixed_forward_ms;
  r.layer_fixed_backward_ms = figures.layer_fixed_backward_ms;
  r.shard_optimizer = job.shard_optimizer();
  absl::StatusOr<LayoutChoice> choice = ChooseLayout(r);
  if (!choice.ok()) return Invalid(absl::StrCat("--layout=auto: ", choice.status().message()));
  const LayoutCandidate& best = choice->ranked[0];
  p.set_stages(best.stages);
  job.set_data_parallel(best.replicas);
  p.set_schedule(best.schedule);
  p.set_micro_batches(best.micro_batches);
  if (best.replicas < 2) job.set_shard_optimizer(false);
  std::vector<std::string> lines = {
      absl::StrFormat("layout auto: %d candidates simulated from %s (%d skipped), at %.0f GB/s between replicas; %s; "
                      "the best:",
                      choice->ranked.size(), source, choice->skipped.size(), r.replica_gbps, DescribeFit(choice->fit))};
  for (size_t i = 0; i < choice->ranked.size() && i < 3; ++i) {
    lines.push_back(absl::StrCat("  ", i + 1, ". ", Describe(choice->ranked[i])));
  }
  if (std::string why = WhyFirst(*choice); !why.empty())
    lines.push_back(absl::StrCat("layout auto: the first is ", why));
  lines.push_back(
      absl::StrCat("layout auto: running the first; the report compares its predicted step with the measured one"));
  return lines;
}

absl::StatusOr<Schedule> JobSchedule(const JobSpec& job) {
  const PipelineSpec& p = job.pipeline();
  absl::StatusOr<Schedule> s;
  if (!p.schedule_text().empty()) {
    s = ParseSchedule(p.schedule_text(), "file", p.micro_batches());
    // A list of compute only (torch.distributed.pipelining's compute-only form) gets its sends and
    // receives from the same lowering pass as the generated schedules.
    if (s.ok() && s->num_ranks > 1 && !HasCommunication(*s)) s = AddCommunication(*s);
    if (s.ok() && s->num_ranks != PipelineRanks(job)) {
      return Invalid(absl::StrCat("--schedule_file lists ", s->num_ranks, " ranks but the job has ", PipelineRanks(job),
                                  job.data_parallel() > 1 ? " stages per replica; give one line per stage"
                                                          : " workers; give one line per worker"));
    }
    if (s.ok() && s->forward_only != p.inference()) {
      return Invalid(p.inference() ? "--inference with a --schedule_file that trains (B or OPT actions)"
                                   : "--schedule_file has no backward: pass --inference to run it forward only");
    }
    if (!s.ok()) return Invalid(absl::StrCat("--schedule_file: ", s.status().message()));
  } else if (!p.inference() && p.schedule() == "forward") {
    return Invalid("--schedule=forward runs no backward: pass --inference for a forward-only run");
  } else {
    // Inference runs one chunk per worker whatever the training schedule holds.
    const int chunks = p.inference() ? 1 : p.has_stage_chunks() ? p.stage_chunks() : DefaultChunks(p.schedule());
    s = MakeSchedule(p.inference() ? "forward" : p.schedule(), p.stages(), p.micro_batches(), chunks);
    if (!s.ok()) return Invalid(absl::StrCat("--schedule=", p.schedule(), ": ", s.status().message()));
  }
  absl::StatusOr<SimulationResult> sim = Simulate(*s, UniformCosts(s->num_stages));
  if (!sim.ok()) {
    return Invalid(absl::StrCat("the ", s->name, " schedule cannot run: ", sim.status().message(), "\n", Grid(*s)));
  }
  return s;
}

// The family's estimate counts attention as FlashAttention does (linear in seq); a CPU worker may
// materialize the scores, micro-batch x heads x seq^2 fp32 values, and a long --seq would have the
// kernel kill it. Refused when that alone exceeds a worker's share of the machine's memory.
absl::Status CheckCpuAttention(const JobSpec& job, int64_t share_bytes) {
  const ModelSpec& m = job.model_spec();
  const double scores = 4.0 * static_cast<double>(MicroBatchSize(job)) * m.heads() * m.seq() * m.seq();
  if (scores <= static_cast<double>(share_bytes)) return absl::OkStatus();
  return Invalid(
      absl::StrFormat("--seq=%d: a CPU worker's attention scores (micro-batch %d x %d heads x seq^2 fp32) "
                      "take %.1f GiB, more than its %.1f GiB share of this machine's memory; pass a "
                      "smaller --seq or more --micro_batches",
                      m.seq(), MicroBatchSize(job), m.heads(), scores / (1 << 30),
                      static_cast<double>(std::max<int64_t>(share_bytes, 0)) / (1 << 30)));
}

absl::Status CheckModelJob(const JobSpec& job, const std::vector<GpuInfo>& gpus, int64_t cpu_memory_bytes) {
  absl::StatusOr<Schedule> schedule = JobSchedule(job);
  if (!schedule.ok()) return schedule.status();
  const ModelDescription* d = FindBuiltinModel(job.model());
  if (d == nullptr) return absl::OkStatus();
  // The planner checks an explicit partition's counts, and the memory (the analytic estimate against
  // each GPU's memory, with room for CUDA and NCCL, or against a CPU worker's share of the machine's).
  std::vector<int64_t> rank_memory;
  if (job.device() == "cuda") {
    for (const GpuInfo& g : gpus) rank_memory.push_back(g.total_bytes * 9 / 10);
  } else if (cpu_memory_bytes > 0) {
    // CPU workers share the machine's memory: each gets its share, less what a worker process needs
    // itself, so that a model the machine cannot hold is refused here, not killed by the kernel.
    const int64_t share = cpu_memory_bytes * 8 / 10 / std::max(1, job.workers()) - kCpuWorkerBytes;
    rank_memory.assign(job.workers(), std::max<int64_t>(share, 1));
    if (absl::Status s = CheckCpuAttention(job, share); !s.ok()) return s;
  }
  const std::vector<int64_t> stage_memory = StageMemory(*schedule, rank_memory);
  LayerProfile estimate = d->Estimate(job.model_spec(), MicroBatchSize(job));
  std::vector<LayerCost> costs(estimate.layers().begin(), estimate.layers().end());
  absl::StatusOr<SimulationResult> sim = Simulate(*schedule, UniformCosts(schedule->num_stages));
  if (!sim.ok()) return sim.status();
  absl::StatusOr<Plan> plan = MakePlan(job, MakePlanRequest(job, *schedule, *sim, costs, stage_memory));
  if (!plan.ok()) {
    const std::string& p = job.pipeline().partition();
    return Invalid(p == "auto" || p == "uniform" ? std::string(plan.status().message())
                                                 : absl::StrCat("--partition=", p, ": ", plan.status().message()));
  }
  return absl::OkStatus();
}

PartitionFn Partitioner(const JobSpec& job) {
  return [job](const std::vector<WorkerState>& workers) -> absl::StatusOr<Partition> {
    absl::StatusOr<Schedule> schedule = JobSchedule(job);
    if (!schedule.ok()) return schedule.status();
    bool profiled = false;
    const ClockWeights clocks = RankClocks(job, workers);
    const std::vector<LayerCost> costs = Costs(job, workers, clocks.profile_scale, &profiled);
    if (static_cast<int>(costs.size()) < schedule->num_stages) {
      return Invalid(absl::StrCat(schedule->num_stages, " stages but the model has only ", costs.size(),
                                  " pipeline layers; use fewer stages"));
    }
    absl::StatusOr<SimulationResult> uniform = Simulate(*schedule, UniformCosts(schedule->num_stages));
    if (!uniform.ok()) return uniform.status();
    std::vector<int64_t> rank_memory;
    if (job.device() == "cuda") {
      for (const WorkerState& w : workers) rank_memory.push_back(w.device.free_bytes() * 9 / 10);
    }
    const std::vector<int64_t> memory = StageMemory(*schedule, rank_memory);
    PlanRequest request = MakePlanRequest(job, *schedule, *uniform, costs, memory);
    request.stage_speed = StageSpeeds(job, *schedule, clocks);  // empty when clock-blind: every stage at speed 1
    absl::StatusOr<Plan> plan = MakePlan(job, request);
    if (!plan.ok()) return plan.status();
    const StageCosts stage_costs = CostsOf(job, *schedule, *plan, costs, request.stage_speed);
    absl::StatusOr<SimulationResult> predicted = Simulate(*schedule, stage_costs);
    if (!predicted.ok()) return predicted.status();
    Partition out{plan->layers_per_stage,
                  absl::StrCat(Describe(job, *schedule, *plan, costs, profiled, *predicted), ClockText(job, clocks)),
                  {}};
    // From the workers' measured profile, else on GPUs from a built-in family's estimate (made for its
    // GPUs: the report says which; against CPU workers it is orders of magnitude off); a user's family
    // without a profile predicts nothing.
    out.predicted_from = profiled                                                             ? "profile"
                         : FindBuiltinModel(job.model()) != nullptr && job.device() == "cuda" ? "estimate"
                                                                                              : "";
    if (!out.predicted_from.empty()) {
      out.predicted_step_ms = predicted->makespan;
      for (int replica = 0; replica < std::max(1, job.data_parallel()); ++replica) {
        for (double b : predicted->bubble) out.predicted_rank_bubble.push_back(b);
      }
    }
    if (profiled)
      FillRankPredictions(job, *schedule, *predicted, request.stage_speed, clocks, out, stage_costs.optimizer);
    if (job.data_parallel() > 1) {
      AddReplicas(job, *schedule, *plan, costs, out);
    } else {
      for (int r = 0; r < schedule->num_ranks; ++r) out.schedules.push_back(ToProto(*schedule, r));
    }
    return out;
  };
}

absl::StatusOr<std::string> FailureGrid(const Partition& partition, int rank, int index) {
  if (partition.schedules.empty()) return absl::NotFoundError("no schedule was shipped");
  absl::StatusOr<Schedule> whole = FromProto(partition.schedules[0]);
  if (!whole.ok()) return whole.status();
  for (size_t r = 1; r < partition.schedules.size(); ++r) {
    absl::StatusOr<Schedule> one = FromProto(partition.schedules[r]);
    if (!one.ok()) return one.status();
    whole->ranks[r] = one->ranks[r];
  }
  return Grid(*whole, rank, index);
}

}  // namespace stagehand
