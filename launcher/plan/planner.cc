// Pipeline partitioning: exact min-bottleneck contiguous split under per-stage memory limits (suffix
// dynamic programme), plus the uniform and explicit splits, all priced by the same cost model.
#include "launcher/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace stagehand {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Stage times are sums of profiled doubles; the same stage summed in another order can differ in the
// last bits, so "equal bottleneck" means equal within this relative tolerance.
constexpr double kRelEps = 1e-9;
constexpr char kAdvice[] = "use more GPUs, fewer micro-batches in flight (1F1B), or a smaller model";

// Infinite a (a stage that does not fit) must never pass as "within tolerance" of a finite b.
bool AtMost(double a, double b) { return a <= b || (std::isfinite(a) && a <= b + kRelEps * std::fabs(b)); }

std::string GiB(int64_t bytes) { return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (int64_t{1} << 30)); }

absl::Status ValidateLayers(const std::vector<PlanLayer>& layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const PlanLayer& c = layers[i];
    // NaN or negative costs would silently break the minimisation; catch a bad profile here.
    if (!(c.forward_ms >= 0) || !(c.backward_ms >= 0) || !std::isfinite(c.forward_ms + c.backward_ms) ||
        c.param_bytes < 0 || c.activation_bytes < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("layer %d has a negative or non-finite cost; every time and byte count must be >= 0", i));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateRequest(const PlanRequest& r) {
  const int n = static_cast<int>(r.layers.size());
  if (r.stages < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("%d stages asked for; use at least 1", r.stages));
  }
  if (r.stages > n) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d stages but the model has only %d layers; use at most %d stages", r.stages, n, n));
  }
  if (!r.memory_bytes.empty() && static_cast<int>(r.memory_bytes.size()) != r.stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "memory_bytes lists %d entries but there are %d stages; give one per stage, or none for unlimited",
        r.memory_bytes.size(), r.stages));
  }
  if (!r.in_flight.empty() && static_cast<int>(r.in_flight.size()) != r.stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("in_flight lists %d entries but there are %d stages; give one per stage, or none for 1 each",
                        r.in_flight.size(), r.stages));
  }
  if (!r.stage_speed.empty() && static_cast<int>(r.stage_speed.size()) != r.stages) {
    return absl::InvalidArgumentError(
        absl::StrFormat("stage_speed lists %d entries but there are %d stages; give one per stage, or none for 1 each",
                        r.stage_speed.size(), r.stages));
  }
  for (int s = 0; s < r.stages; ++s) {
    if (!r.stage_speed.empty() && !(r.stage_speed[s] > 0 && std::isfinite(r.stage_speed[s]))) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stage %d has speed %g; every speed must be > 0", s, r.stage_speed[s]));
    }
    if (!r.memory_bytes.empty() && r.memory_bytes[s] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("stage %d has negative memory_bytes", s));
    }
    if (!r.in_flight.empty() && r.in_flight[s] < 0) {
      return absl::InvalidArgumentError(absl::StrFormat("stage %d has negative in_flight", s));
    }
  }
  return ValidateLayers(r.layers);
}

// Prices any contiguous range [begin, end) as stage s in O(1) through prefix sums, so the O(S * L^2)
// search stays cheap for a few hundred layers.
class CostModel {
 public:
  explicit CostModel(const PlanRequest& r) : r_(r) {
    const size_t n = r.layers.size();
    ms_.assign(n + 1, 0);
    params_.assign(n + 1, 0);
    acts_.assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
      const PlanLayer& c = r.layers[i];
      ms_[i + 1] = ms_[i] + c.forward_ms + (r.forward_only ? 0 : c.backward_ms);
      params_[i + 1] = params_[i] + c.param_bytes;
      acts_[i + 1] = acts_[i] + c.activation_bytes;
    }
  }

  int layers() const { return static_cast<int>(r_.layers.size()); }
  int stages() const { return r_.stages; }
  // At stage s's speed; a speed of exactly 1 divides exactly, so unweighted plans are unchanged.
  double Ms(int s, int begin, int end) const { return (ms_[end] - ms_[begin]) / Speed(s); }
  // Summed layer by layer: the reported time then matches a hand sum, free of prefix-sum rounding.
  double ExactMs(int s, int begin, int end) const {
    double ms = 0;
    for (int i = begin; i < end; ++i) {
      ms += r_.layers[i].forward_ms + (r_.forward_only ? 0 : r_.layers[i].backward_ms);
    }
    return ms / Speed(s);
  }
  double Speed(int s) const { return r_.stage_speed.empty() ? 1.0 : r_.stage_speed[s]; }

  int64_t Bytes(int s, int begin, int end) const {
    int64_t params = params_[end] - params_[begin];
    // param_bytes counts fp32 AdamW state: parameter + gradient + 2 moments = 4x the parameter.
    // Inference keeps only the parameter, so a quarter of it.
    if (r_.forward_only) params /= 4;
    const int64_t in_flight = r_.in_flight.empty() ? 1 : r_.in_flight[s];
    return params + in_flight * (acts_[end] - acts_[begin]);
  }

  bool Limited() const { return !r_.memory_bytes.empty(); }
  int64_t Available(int s) const { return Limited() ? r_.memory_bytes[s] : std::numeric_limits<int64_t>::max(); }
  bool Fits(int s, int begin, int end) const { return Bytes(s, begin, end) <= Available(s); }

 private:
  const PlanRequest& r_;
  std::vector<double> ms_;
  std::vector<int64_t> params_;
  std::vector<int64_t> acts_;
};

// Cost of layers [begin, end) as stage s; kInf where that is not allowed.
using StageCost = std::function<double(int s, int begin, int end)>;

// best[s][i]: the smallest achievable max cost of stages s..S-1 over layers i..L-1 (kInf: none).
std::vector<std::vector<double>> SuffixMinMax(int stages, int layers, const StageCost& cost) {
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, kInf));
  best[stages][layers] = 0;
  for (int s = stages - 1; s >= 0; --s) {
    const int last_end = layers - (stages - 1 - s);  // leave one layer to each later stage
    for (int begin = s; begin < last_end; ++begin) {
      double b = kInf;
      for (int end = begin + 1; end <= last_end; ++end) {
        b = std::min(b, std::max(cost(s, begin, end), best[s + 1][end]));
      }
      best[s][begin] = b;
    }
  }
  return best;
}

// Walks the table from stage 0, giving each stage the fewest layers that still lets the rest reach the
// optimum. Among equally good splits this picks the lexicographically smallest layers_per_stage:
// surplus layers go to later stages, which under 1F1B hold fewer micro-batches in flight.
std::vector<int> Reconstruct(const std::vector<std::vector<double>>& best, const StageCost& cost) {
  const int stages = static_cast<int>(best.size()) - 1;
  const int layers = static_cast<int>(best[0].size()) - 1;
  const double target = best[0][0];
  std::vector<int> counts;
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int last_end = layers - (stages - 1 - s);
    int end = begin + 1;
    while (end < last_end && !(AtMost(cost(s, begin, end), target) && AtMost(best[s + 1][end], target))) {
      ++end;
    }
    counts.push_back(end - begin);
    begin = end;
  }
  return counts;
}

Plan Price(const CostModel& m, const std::vector<int>& counts) {
  Plan plan;
  plan.layers_per_stage = counts;
  int begin = 0;
  for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
    const int end = begin + counts[s];
    plan.stage_ms.push_back(m.ExactMs(s, begin, end));
    plan.stage_bytes.push_back(m.Bytes(s, begin, end));
    plan.bottleneck_ms = std::max(plan.bottleneck_ms, plan.stage_ms.back());
    begin = end;
  }
  return plan;
}

absl::Status OutOfMemory(int s, int64_t needed, int64_t available, const std::string& context) {
  return absl::ResourceExhaustedError(absl::StrFormat("stage %d needs %s but its device has %s%s; %s", s, GiB(needed),
                                                      GiB(available), context, kAdvice));
}

// The first stage of `plan` over its memory, or OK.
absl::Status CheckMemory(const CostModel& m, const Plan& plan, const std::string& context) {
  if (!m.Limited()) return absl::OkStatus();
  for (int s = 0; s < m.stages(); ++s) {
    if (plan.stage_bytes[s] > m.Available(s)) {
      return OutOfMemory(s, plan.stage_bytes[s], m.Available(s), context);
    }
  }
  return absl::OkStatus();
}

double Fill(int64_t needed, int64_t available) {
  if (available > 0) return static_cast<double>(needed) / static_cast<double>(available);
  return needed > 0 ? kInf : 0;
}

// No split fits: find the split that comes closest (smallest worst needed/available ratio) and name its
// tightest stage, so the message states the least the user must free rather than an arbitrary miss.
absl::Status ExplainNoFit(const CostModel& m) {
  const StageCost fill = [&m](int s, int b, int e) { return Fill(m.Bytes(s, b, e), m.Available(s)); };
  const Plan closest = Price(m, Reconstruct(SuffixMinMax(m.stages(), m.layers(), fill), fill));
  int tightest = 0;
  for (int s = 1; s < m.stages(); ++s) {
    if (Fill(closest.stage_bytes[s], m.Available(s)) > Fill(closest.stage_bytes[tightest], m.Available(tightest))) {
      tightest = s;
    }
  }
  return OutOfMemory(tightest, closest.stage_bytes[tightest], m.Available(tightest),
                     " even in the split that fits memory best");
}

// Extra layers to the earlier stages: 37 layers over 3 stages is 13, 12, 12.
std::vector<int> UniformCounts(int layers, int stages) {
  std::vector<int> counts(stages, layers / stages);
  for (int s = 0; s < layers % stages; ++s) ++counts[s];
  return counts;
}

absl::Status ValidateCounts(const PlanRequest& r, const std::vector<int>& counts) {
  if (static_cast<int>(counts.size()) != r.stages) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--partition lists %d stage sizes but there are %d stages; give one size per stage", counts.size(), r.stages));
  }
  int64_t sum = 0;
  for (int s = 0; s < r.stages; ++s) {
    if (counts[s] < 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("stage %d gets %d layers; every stage needs at least 1", s, counts[s]));
    }
    sum += counts[s];
  }
  if (sum != static_cast<int64_t>(r.layers.size())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sizes sum to %d but the model has %d layers; make them sum to %d", sum, r.layers.size(), r.layers.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Plan> PlanBalanced(const PlanRequest& request) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  const CostModel m(request);
  const StageCost time = [&m](int s, int b, int e) { return m.Fits(s, b, e) ? m.Ms(s, b, e) : kInf; };
  const auto best = SuffixMinMax(m.stages(), m.layers(), time);
  if (best[0][0] == kInf) return ExplainNoFit(m);
  return Price(m, Reconstruct(best, time));
}

absl::StatusOr<Plan> PlanUniform(const PlanRequest& request) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  const CostModel m(request);
  Plan plan = Price(m, UniformCounts(m.layers(), m.stages()));
  if (absl::Status s = CheckMemory(m, plan, " with the uniform split"); !s.ok()) return s;
  return plan;
}

absl::StatusOr<Plan> PlanExplicit(const PlanRequest& request, const std::vector<int>& layers_per_stage) {
  if (absl::Status s = ValidateRequest(request); !s.ok()) return s;
  if (absl::Status s = ValidateCounts(request, layers_per_stage); !s.ok()) return s;
  const CostModel m(request);
  Plan plan = Price(m, layers_per_stage);
  if (absl::Status s = CheckMemory(m, plan, " with this --partition"); !s.ok()) return s;
  return plan;
}

}  // namespace stagehand
