// The layout planner (see layout.h).
#include "launcher/layout.h"

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "schedule/schedule.h"

namespace stagehand {

double AllReduceMs(int64_t bytes, int replicas, double gbps) {
  if (replicas < 2 || gbps <= 0) return 0;
  return 2.0 * (replicas - 1) / replicas * static_cast<double>(bytes) / (gbps * 1e9) * 1e3;
}

std::vector<int> MicroBatchCandidates(int stages) {
  std::vector<int> m = {stages, 2 * stages, 4 * stages, 8, 16, 32};
  std::sort(m.begin(), m.end());
  m.erase(std::unique(m.begin(), m.end()), m.end());
  return m;
}

namespace {

std::string Name(int stages, int replicas, const std::string& schedule, int m) {
  return absl::StrCat(stages, " stages x ", replicas, " replicas, ", schedule, ", ", m, " micro-batches");
}

// The layers at micro-batch `mb`: time and activations scale with the sequences, parameters do not;
// ZeRO-1 keeps the parameter and gradient (8 of the 16 bytes per parameter) and 1/D of the moments.
std::vector<PlanLayer> Scaled(const LayoutRequest& r, int64_t mb, int replicas) {
  const double k = static_cast<double>(mb) / std::max<int64_t>(1, r.profile_micro_batch);
  std::vector<PlanLayer> out = r.layers;
  for (PlanLayer& l : out) {
    l.forward_ms *= k;
    l.backward_ms *= k;
    l.activation_bytes = static_cast<int64_t>(l.activation_bytes * k);
    if (r.shard_optimizer && replicas > 1) l.param_bytes = l.param_bytes / 2 + l.param_bytes / (2 * replicas);
  }
  return out;
}

// One candidate simulated: partitioned within memory by planner.h, then timed. An error says why not.
absl::StatusOr<LayoutCandidate> Evaluate(const LayoutRequest& r, int stages, const std::string& name, int m) {
  LayoutCandidate c;
  c.stages = stages;
  c.replicas = r.workers / stages;
  c.schedule = name;
  c.micro_batches = m;
  c.micro_batch = r.global_batch / (int64_t{m} * c.replicas);
  absl::StatusOr<Schedule> s = MakeSchedule(name, stages, m);
  if (!s.ok()) return s.status();
  absl::StatusOr<SimulationResult> uniform = Simulate(*s, UniformCosts(s->num_stages));
  if (!uniform.ok()) return uniform.status();
  PlanRequest p;
  p.layers = Scaled(r, c.micro_batch, c.replicas);
  p.stages = s->num_stages;
  if (r.memory_bytes > 0) p.memory_bytes.assign(p.stages, r.memory_bytes);
  for (int v = 0; v < p.stages; ++v) p.in_flight.push_back(std::max(1, uniform->peak_activations[s->stage_rank[v]]));
  absl::StatusOr<Plan> plan = PlanBalanced(p);
  if (!plan.ok()) return plan.status();
  StageCosts costs;
  size_t layer = 0;
  int64_t largest_grads = 0;
  for (int n : plan->layers_per_stage) {
    double f = 0, b = 0;
    int64_t params = 0;
    for (int i = 0; i < n; ++i, ++layer) {
      f += p.layers[layer].forward_ms;
      b += p.layers[layer].backward_ms;
      params += r.layers[layer].param_bytes / 16;  // parameters: the profile counts 16 bytes each
    }
    costs.forward.push_back(f);
    costs.backward.push_back(b);
    largest_grads = std::max(largest_grads, params * 4);  // fp32 gradients
  }
  absl::StatusOr<SimulationResult> sim = Simulate(*s, costs);
  if (!sim.ok()) return sim.status();
  c.layers_per_stage = plan->layers_per_stage;
  c.pipeline_ms = sim->makespan;
  c.bubble = sim->bubble_fraction;
  c.allreduce_ms = AllReduceMs(largest_grads, c.replicas, r.replica_gbps);
  c.step_ms = c.pipeline_ms + c.allreduce_ms;
  c.peak_bytes = *std::max_element(plan->stage_bytes.begin(), plan->stage_bytes.end());
  return c;
}

}  // namespace

absl::StatusOr<LayoutChoice> ChooseLayout(const LayoutRequest& r) {
  if (r.layers.empty() || r.workers < 1 || r.global_batch < 1) {
    return absl::InvalidArgumentError("layout: no layers, workers or batch to lay out");
  }
  LayoutChoice out;
  const int layers = static_cast<int>(r.layers.size());
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
        absl::StatusOr<LayoutCandidate> c = Evaluate(r, stages, name, m);
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
      "%s of %d: %.4g ms (pipeline %.4g ms, bubble %.1f%%; all-reduce %.4g ms); layers %s; %.3g GiB peak per device",
      Name(c.stages, c.replicas, c.schedule, c.micro_batches), c.micro_batch, c.step_ms, c.pipeline_ms,
      100 * c.bubble, c.allreduce_ms, counts, static_cast<double>(c.peak_bytes) / (1 << 30));
}

}  // namespace stagehand
