// The layout planner (see layout.h).
#include "launcher/plan/layout.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "schedule/schedule.h"

namespace stagehand {

double AllReduceMs(int64_t bytes, int replicas, double gbps) {
  if (replicas < 2 || gbps <= 0) return 0;
  return 2.0 * (replicas - 1) / replicas * static_cast<double>(bytes) / (gbps * 1e9) * 1e3;
}

DeviceFigures FiguresFor(bool gpu) {
  DeviceFigures f;
  if (gpu) {
    f.p2p_gbps = f.replica_gbps = 285;
    f.p2p_latency_ms = 0.02;
    f.replica_latency_ms = 0.05;
    f.optimizer_ms_per_gb = 0.55;
    f.layer_fixed_forward_ms = 0.02;
    f.layer_fixed_backward_ms = 0.1;
  } else {
    f.p2p_gbps = f.replica_gbps = 1;
    f.p2p_latency_ms = f.replica_latency_ms = 0.1;
  }
  return f;
}

std::vector<int> MicroBatchCandidates(int stages) {
  std::vector<int> m = {stages, 2 * stages, 4 * stages, 8, 16, 32};
  std::sort(m.begin(), m.end());
  m.erase(std::unique(m.begin(), m.end()), m.end());
  return m;
}

PlanLayer LayerCostModel::At(int64_t micro_batch) const {
  const double b = static_cast<double>(micro_batch);
  PlanLayer l;
  l.forward_ms = forward_fixed_ms + forward_per_seq_ms * b;
  l.backward_ms = backward_fixed_ms + backward_per_seq_ms * b;
  l.param_bytes = param_bytes;
  l.activation_bytes = static_cast<int64_t>(std::llround(activation_bytes_per_seq * b));
  return l;
}

namespace {

// y = fixed + per_seq x, least squares over (x, y), both parts >= 0.
std::pair<double, double> FitLine(const std::vector<double>& x, const std::vector<double>& y) {
  const double n = static_cast<double>(x.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sx += x[i];
    sy += y[i];
    sxx += x[i] * x[i];
    sxy += x[i] * y[i];
  }
  const double through_zero = sxx > 0 ? sxy / sxx : 0;
  if (x.size() < 2) return {0, std::max(0.0, through_zero)};
  const double det = n * sxx - sx * sx;
  if (det <= 0) return {0, std::max(0.0, through_zero)};
  const double slope = (n * sxy - sx * sy) / det, fixed = (sy - slope * sx) / n;
  if (fixed < 0) return {0, std::max(0.0, through_zero)};
  if (slope < 0) return {sy / n, 0};
  return {fixed, slope};
}

std::string Name(int stages, int replicas, const std::string& schedule, int m) {
  return absl::StrCat(stages, stages == 1 ? " stage x " : " stages x ", replicas,
                      replicas == 1 ? " replica, " : " replicas, ", schedule, ", ", m,
                      m == 1 ? " micro-batch" : " micro-batches");
}

// How many of the schedule's virtual stages each rank holds.
std::vector<int> StagesPerRank(const Schedule& s) {
  std::vector<int> n(s.num_ranks, 0);
  for (int r : s.stage_rank) ++n[r];
  return n;
}

}  // namespace

absl::StatusOr<LayerFit> FitLayerCosts(const std::vector<LayerProfileAt>& profiles) {
  if (profiles.empty() || profiles[0].layers.empty())
    return absl::InvalidArgumentError("layout: no profile to plan from");
  std::map<int64_t, const LayerProfileAt*> by_size;  // one profile per size: the last given
  for (const LayerProfileAt& p : profiles) {
    if (p.micro_batch < 1)
      return absl::InvalidArgumentError(absl::StrCat("layout: a profile at micro-batch ", p.micro_batch));
    if (p.layers.size() != profiles[0].layers.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layout: profiles of ", profiles[0].layers.size(), " and ", p.layers.size(), " layers"));
    }
    by_size[p.micro_batch] = &p;
  }
  LayerFit fit;
  std::vector<double> x;
  for (const auto& [size, p] : by_size) {
    fit.sizes.push_back(size);
    x.push_back(static_cast<double>(size));
  }
  const LayerProfileAt& largest = *by_size.rbegin()->second;
  for (size_t i = 0; i < profiles[0].layers.size(); ++i) {
    std::vector<double> f, b;
    for (const auto& [size, p] : by_size) {
      f.push_back(p->layers[i].forward_ms);
      b.push_back(p->layers[i].backward_ms);
    }
    LayerCostModel m;
    std::tie(m.forward_fixed_ms, m.forward_per_seq_ms) = FitLine(x, f);
    std::tie(m.backward_fixed_ms, m.backward_per_seq_ms) = FitLine(x, b);
    m.param_bytes = largest.layers[i].param_bytes;
    m.activation_bytes_per_seq = static_cast<double>(largest.layers[i].activation_bytes) / largest.micro_batch;
    for (size_t k = 0; k < x.size(); ++k) {
      const PlanLayer at = m.At(fit.sizes[k]);
      const double measured = f[k] + b[k];
      if (measured > 0) {
        fit.worst_relative_error =
            std::max(fit.worst_relative_error, std::abs(at.forward_ms + at.backward_ms - measured) / measured);
      }
    }
    fit.layers.push_back(m);
  }
  return fit;
}

namespace {

// One candidate simulated: partitioned within memory by planner.h, then timed. An error says why not.
absl::StatusOr<LayoutCandidate> Evaluate(const LayoutRequest& r, const LayerFit& fit, int stages,
                                         const std::string& name, int m) {
  LayoutCandidate c;
  c.stages = stages;
  c.replicas = r.workers / stages;
  c.schedule = name;
  c.chunks = DefaultChunks(name);
  c.micro_batches = m;
  c.micro_batch = r.global_batch / (int64_t{m} * c.replicas);
  if (stages == 1 && c.chunks > 1) {
    return absl::InvalidArgumentError("one rank holds every chunk: the same as one stage, with more overhead");
  }
  absl::StatusOr<Schedule> s = MakeSchedule(name, stages, m, c.chunks);
  if (!s.ok()) return s.status();
  if (s->num_stages > static_cast<int>(fit.layers.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(s->num_stages, " virtual stages for ", fit.layers.size(), " layers"));
  }
  absl::StatusOr<SimulationResult> uniform = Simulate(*s, UniformCosts(s->num_stages));
  if (!uniform.ok()) return uniform.status();
  // Memory per rank, shared evenly among the rank's stages (as job_plan.cc plans a run), with the
  // micro-batches the simulator keeps in flight there (in a zero-bubble split: until their W).
  const std::vector<int> per_rank = StagesPerRank(*s);
  PlanRequest p;
  for (const LayerCostModel& l : fit.layers) {
    PlanLayer at = l.At(c.micro_batch);
    // ZeRO-1 keeps the parameter and gradient (8 of the 16 bytes per parameter) and 1/D of the moments.
    if (r.shard_optimizer && c.replicas > 1) at.param_bytes = at.param_bytes / 2 + at.param_bytes / (2 * c.replicas);
    p.layers.push_back(at);
  }
  p.stages = s->num_stages;
  for (int v = 0; v < p.stages; ++v) {
    const int rank = s->stage_rank[v], share = std::max(1, per_rank[rank]);
    if (r.memory_bytes > 0) p.memory_bytes.push_back(r.memory_bytes / share);
    p.in_flight.push_back(std::max(1, (uniform->peak_activations[rank] + share - 1) / share));
  }
  absl::StatusOr<Plan> plan = PlanBalanced(p);
  if (!plan.ok()) return plan.status();
  StageCosts costs;
  costs.overlap_communication = true;  // the GPU executor's transfers run on their own stream
  size_t layer = 0;
  int64_t largest_grads = 0;
  std::vector<int64_t> rank_params(s->num_ranks, 0), rank_bytes(s->num_ranks, 0);
  for (int v = 0; v < p.stages; ++v) {
    double f = 0, b = 0, fixed = 0;
    int64_t params = 0;
    for (int i = 0; i < plan->layers_per_stage[v]; ++i, ++layer) {
      f += p.layers[layer].forward_ms;
      b += p.layers[layer].backward_ms;
      fixed += fit.layers[layer].forward_fixed_ms + fit.layers[layer].backward_fixed_ms;
      params += fit.layers[layer].param_bytes;
    }
    costs.forward.push_back(f);
    costs.backward.push_back(b);
    costs.backward_weight.push_back(b * r.weight_grad_share);
    costs.backward_input.push_back(b - b * r.weight_grad_share);
    if (f + b > c.slowest_stage_ms) {
      c.slowest_stage_ms = f + b;
      c.fixed_share = f + b > 0 ? fixed / (f + b) : 0;
    }
    const int rank = s->stage_rank[v];
    rank_params[rank] += params;
    rank_bytes[rank] += plan->stage_bytes[v];
    largest_grads = std::max(largest_grads, params / 4);  // fp32 gradients: 4 of the 16 bytes
  }
  if (r.p2p_gbps > 0 && s->num_ranks > 1) {
    c.p2p_ms = r.p2p_latency_ms + static_cast<double>(r.boundary_bytes_per_seq * c.micro_batch) / (r.p2p_gbps * 1e6);
  }
  costs.p2p = c.p2p_ms;
  const int64_t fullest_params = *std::max_element(rank_params.begin(), rank_params.end());
  int64_t optimizer_bytes = fullest_params;
  if (r.shard_optimizer && c.replicas > 1) optimizer_bytes /= c.replicas;
  c.optimizer_ms = r.optimizer_ms_per_gb * static_cast<double>(optimizer_bytes) / 1e9;
  costs.optimizer = c.optimizer_ms;
  absl::StatusOr<SimulationResult> sim = Simulate(*s, costs);
  if (!sim.ok()) return sim.status();
  c.layers_per_stage = plan->layers_per_stage;
  c.pipeline_ms = sim->makespan;
  c.bubble = sim->bubble_fraction;
  c.in_flight = sim->peak_activations;
  c.allreduce_ms = c.replicas > 1 ? r.replica_latency_ms + AllReduceMs(largest_grads, c.replicas, r.replica_gbps) : 0;
  c.step_ms = c.pipeline_ms + c.allreduce_ms;
  c.peak_bytes = *std::max_element(rank_bytes.begin(), rank_bytes.end());
  return c;
}

}  // namespace

absl::StatusOr<LayoutChoice> ChooseLayout(const LayoutRequest& r) {
  if (r.workers < 1 || r.global_batch < 1) {
    return absl::InvalidArgumentError("layout: no layers, workers or batch to lay out");
  }
  absl::StatusOr<LayerFit> fit = FitLayerCosts(r.profiles);
  if (!fit.ok()) return fit.status();
  if (fit->sizes.size() == 1 && r.layer_fixed_forward_ms + r.layer_fixed_backward_ms > 0) {
    const double b = static_cast<double>(fit->sizes[0]);
    for (LayerCostModel& l : fit->layers) {
      l.forward_fixed_ms = std::min(r.layer_fixed_forward_ms, l.forward_per_seq_ms * b);
      l.forward_per_seq_ms -= l.forward_fixed_ms / b;
      l.backward_fixed_ms = std::min(r.layer_fixed_backward_ms, l.backward_per_seq_ms * b);
      l.backward_per_seq_ms -= l.backward_fixed_ms / b;
    }
    fit->assumed_fixed_ms = r.layer_fixed_forward_ms + r.layer_fixed_backward_ms;
  }
  LayoutChoice out;
  out.fit = *fit;
  const int layers = static_cast<int>(fit->layers.size());
  for (int stages = 1; stages <= std::min(r.workers, layers); ++stages) {
    if (r.workers % stages != 0) continue;
    const int replicas = r.workers / stages;
    for (const std::string& name : r.schedules) {
      for (int m : MicroBatchCandidates(stages)) {
        const std::string what = Name(stages, replicas, name, m);
        if (r.global_batch % (int64_t{m} * replicas) != 0) {
          out.skipped.push_back(absl::StrCat(what, ": ", r.global_batch, " sequences do not split into them"));
          continue;
        }
        absl::StatusOr<LayoutCandidate> c = Evaluate(r, *fit, stages, name, m);
        if (!c.ok()) {
          out.skipped.push_back(absl::StrCat(what, ": ", c.status().message()));
          continue;
        }
        out.ranked.push_back(*std::move(c));
      }
    }
  }
  if (out.ranked.empty()) {
    std::string why;
    for (size_t i = 0; i < out.skipped.size() && i < 3; ++i) absl::StrAppend(&why, i ? "; " : "", out.skipped[i]);
    return absl::FailedPreconditionError(absl::StrCat("no layout of ", r.workers, " workers works: ", why));
  }
  std::stable_sort(out.ranked.begin(), out.ranked.end(), [](const LayoutCandidate& a, const LayoutCandidate& b) {
    return std::tie(a.step_ms, a.stages, a.schedule, a.micro_batches) <
           std::tie(b.step_ms, b.stages, b.schedule, b.micro_batches);
  });
  return out;
}

std::string Describe(const LayoutCandidate& c) {
  std::string counts;
  for (size_t i = 0; i < c.layers_per_stage.size(); ++i) absl::StrAppend(&counts, i ? "/" : "", c.layers_per_stage[i]);
  return absl::StrFormat(
      "%s of %d: %.1f ms = pipeline %.1f ms (bubble %.1f%%; slowest stage %.2f ms per micro-batch, %.0f%% of it "
      "fixed; p2p %.2f ms) incl. optimizer %.1f ms + all-reduce %.1f ms; layers %s; %.1f GiB peak per device "
      "(%s micro-batches in flight)",
      Name(c.stages, c.replicas, c.schedule, c.micro_batches), c.micro_batch, c.step_ms, c.pipeline_ms, 100 * c.bubble,
      c.slowest_stage_ms, 100 * c.fixed_share, c.p2p_ms, c.optimizer_ms, c.allreduce_ms, counts,
      static_cast<double>(c.peak_bytes) / (1 << 30), absl::StrJoin(c.in_flight, "/"));
}

std::string DescribeFit(const LayerFit& fit) {
  double fixed = 0, per_seq = 0;
  for (const LayerCostModel& l : fit.layers) {
    fixed += l.forward_fixed_ms + l.backward_fixed_ms;
    per_seq += l.forward_per_seq_ms + l.backward_per_seq_ms;
  }
  if (fit.sizes.size() < 2 && fit.assumed_fixed_ms > 0) {
    return absl::StrFormat(
        "costs from one size (%d) with an assumed fixed %.2f ms per layer (H200's, fitted to "
        "recorded profiles): the whole model %.2f ms fixed + %.2f ms per sequence, forward + backward",
        fit.sizes.empty() ? 0 : fit.sizes[0], fit.assumed_fixed_ms, fixed, per_seq);
  }
  if (fit.sizes.size() < 2) {
    return absl::StrFormat(
        "costs linear in the micro-batch (one size profiled, %d): the whole model %.2f ms per "
        "sequence forward + backward, no fixed cost",
        fit.sizes.empty() ? 0 : fit.sizes[0], per_seq);
  }
  return absl::StrFormat(
      "costs fitted to micro-batches of %s (worst layer off by %.1f%%): the whole model %.2f ms "
      "fixed + %.2f ms per sequence, forward + backward",
      absl::StrJoin(fit.sizes, ", "), 100 * fit.worst_relative_error, fixed, per_seq);
}

std::string WhyFirst(const LayoutChoice& choice) {
  if (choice.ranked.size() < 2) return "";
  const LayoutCandidate &a = choice.ranked[0], &b = choice.ranked[1];
  const double pct = b.step_ms > 0 ? 100 * (b.step_ms - a.step_ms) / b.step_ms : 0;
  std::string why =
      absl::StrFormat("%.1f%% faster than %s", pct, Name(b.stages, b.replicas, b.schedule, b.micro_batches));
  // The parts of the step that differ most between the two.
  const double compute_a = a.pipeline_ms * (1 - a.bubble), compute_b = b.pipeline_ms * (1 - b.bubble);
  const double idle_a = a.pipeline_ms * a.bubble, idle_b = b.pipeline_ms * b.bubble;
  absl::StrAppend(&why, absl::StrFormat(": busy %.1f against %.1f ms per rank, idle %.1f against %.1f ms, all-reduce "
                                        "%.1f against %.1f ms",
                                        compute_a, compute_b, idle_a, idle_b, a.allreduce_ms, b.allreduce_ms));
  return why;
}

}  // namespace stagehand
