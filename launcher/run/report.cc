// report.json, trace.json and the run's summary numbers, computed from the job and the step reports
// alone (no clocks, no files), so every figure the launcher prints can be checked by hand in a test.
#include "launcher/run/report.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "models/registry.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/json_util.h"
#include "telemetry/aggregate.h"
#include "telemetry/throttle.h"

namespace stagehand {
namespace {

// (rank, step) -> the report. Ordered, so every walk over it is by rank, then step: the output does
// not depend on the order in which reports arrived.
using Reports = std::map<std::pair<int, int64_t>, const ReportStepRequest*>;

// A retried ReportStep may deliver a (rank, step) twice; it must count once, and the last one wins.
Reports ByRankAndStep(const std::vector<ReportStepRequest>& steps) {
  Reports out;
  for (const ReportStepRequest& r : steps) out[{r.rank(), r.step()}] = &r;
  return out;
}

// The steps after the warm-up; all of them when the warm-up covers the whole run, so a short run
// (a smoke test, a job that died early) still gets numbers rather than zeros.
Reports TimedReports(const Reports& all, int64_t warmup_steps) {
  Reports timed;
  for (const auto& [key, r] : all) {
    if (key.second >= warmup_steps) timed.emplace(key, r);
  }
  return timed.empty() ? all : timed;
}

struct StepTime {
  double seconds = 0;
  int64_t tokens = 0;
  int64_t samples = 0;  // a program's (stagehand.step), as its tokens and FLOPs
  double flops = 0;
};

// Per step: the time of the rank holding the loss (the head finishes last, so its step time is the
// pipeline's); without a loss (inference) the slowest rank's, which bounds the step the same way.
// Decided per step, so a step whose head report is missing still gets the slowest rank's time.
std::map<int64_t, StepTime> StepTimes(const Reports& timed) {
  std::map<int64_t, double> head;
  std::map<int64_t, StepTime> out;
  for (const auto& [key, r] : timed) {
    StepTime& s = out[key.second];
    s.seconds = std::max(s.seconds, r->step_seconds());
    s.tokens = std::max(s.tokens, r->tokens());  // every rank reports the pipeline's batch
    s.samples = std::max(s.samples, r->samples());
    s.flops = std::max(s.flops, r->flops());
    if (r->has_loss()) head[key.second] = std::max(head[key.second], r->step_seconds());
  }
  for (const auto& [step, seconds] : head) out[step].seconds = seconds;
  return out;
}

// Tokens/s is total tokens over total time, i.e. mean tokens / mean step time, so one slow step
// weighs by its length as it does in wall time; samples/s and a program's FLOPs alike.
void FillThroughput(const Reports& timed, const ReportInput& input, int ranks, RunReport& report) {
  double seconds = 0;
  double tokens = 0, samples = 0, flops = 0;
  const std::map<int64_t, StepTime> steps = StepTimes(timed);
  for (const auto& [step, t] : steps) {
    seconds += t.seconds;
    tokens += static_cast<double>(t.tokens);
    samples += static_cast<double>(t.samples);
    flops += t.flops;
  }
  report.set_flops_per_step(StepFlops(input.job));
  if (steps.empty() || seconds <= 0) return;
  // A program's FLOPs are what its script reported; a model's are counted from its shape.
  if (flops > 0) report.set_flops_per_step(flops / steps.size());
  report.set_step_seconds(seconds / steps.size());
  report.set_tokens_per_second(tokens / seconds);
  report.set_samples_per_second(samples / seconds);
  report.set_tflops(report.flops_per_step() / report.step_seconds() / 1e12);
  const double peak = input.peak_tflops_per_device * ranks;
  if (peak > 0) report.set_mfu(report.tflops() / peak);
}

// Losses over the whole run, warm-up included (the first loss is the point of comparison), in step
// order whatever the ranks: (step, rank) keys, so the first and last are the ends of the map.
void FillLosses(const Reports& all, const JobSpec& job, RunReport& report) {
  std::map<std::pair<int64_t, int>, double> losses;
  for (const auto& [key, r] : all) {
    if (r->has_loss()) losses[{key.second, key.first}] = r->loss();
  }
  if (losses.empty()) return;
  report.set_first_loss(losses.begin()->second);
  report.set_last_loss(losses.rbegin()->second);
  // Inference of a model with weights: every step's batch counts alike (warm-up too: no timing here).
  if (job.pipeline().inference()) {
    double sum = 0;
    for (const auto& [key, loss] : losses) sum += loss;
    report.set_inference_loss(sum / losses.size());
    report.set_inference_perplexity(std::exp(report.inference_loss()));
  }
}

// The last evaluation (the latest step that carries a validation loss) and the training tokens of
// the steps done: (last step + 1) x the tokens of a step, so a resumed run counts its checkpoint's.
void FillEvalAndCounts(const Reports& all, RunReport& report) {
  const ReportStepRequest* eval = nullptr;
  int64_t last_step = -1, tokens = 0;
  for (const auto& [key, r] : all) {
    if (r->has_val_loss() && (eval == nullptr || r->step() > eval->step())) eval = r;
    if (r->step() > last_step) last_step = r->step(), tokens = r->tokens();
  }
  if (eval != nullptr) {
    report.set_has_val_loss(true);
    report.set_val_loss(eval->val_loss());
    report.set_val_perplexity(std::exp(eval->val_loss()));
    report.set_val_step(eval->step() + 1);
  }
  if (!report.job().pipeline().inference() && report.steps_done() > 0) {
    report.set_tokens_seen((last_step + 1) * tokens);
  }
}

// Sums of one rank's timed steps; the means divide by the steps that carried timing, so a run with
// timing off on some steps is not diluted by zeros.
struct RankSums {
  int steps = 0;
  double forward_ms = 0, backward_ms = 0, optimizer_ms = 0, wait_ms = 0, idle_ms = 0;
  double bubble = 0;
  int bubble_steps = 0;
  double comm_bytes = 0, comm_ms = 0;
};

// The reports of one rank: a contiguous range of the (rank, step) map.
template <typename Fn>
void ForRank(int rank, const Reports& reports, Fn fn) {
  for (auto it = reports.lower_bound({rank, std::numeric_limits<int64_t>::min()});
       it != reports.end() && it->first.first == rank; ++it) {
    fn(*it->second);
  }
}

RankSums SumRank(int rank, const Reports& timed) {
  RankSums s;
  ForRank(rank, timed, [&s](const ReportStepRequest& r) {
    if (!r.has_timing()) return;
    const StepTiming& t = r.timing();
    ++s.steps;
    s.forward_ms += t.forward_ms();
    s.backward_ms += t.backward_ms();
    s.optimizer_ms += t.optimizer_ms();
    s.wait_ms += t.wait_ms();
    s.idle_ms += t.idle_ms();
    s.comm_bytes += static_cast<double>(t.comm_bytes());
    s.comm_ms += t.comm_ms();
    // Clamped per step: compute a little over the step time is disagreement between timers, not a
    // negative bubble.
    const double busy = t.forward_ms() + t.backward_ms() + t.optimizer_ms();
    // With --timing=false a step still carries its length but neither actions nor a breakdown: that
    // is no bubble of 100%, it is no bubble figure at all.
    if (t.step_ms() <= 0 || (busy <= 0 && t.actions_size() == 0)) return;
    s.bubble += std::clamp(1 - busy / t.step_ms(), 0.0, 1.0);
    ++s.bubble_steps;
  });
  return s;
}

// Peak memory is a high-water mark, so the warm-up steps count too.
int64_t PeakMemory(int rank, const Reports& all) {
  int64_t peak = 0;
  ForRank(rank, all, [&peak](const ReportStepRequest& r) { peak = std::max(peak, r.peak_memory_bytes()); });
  return peak;
}

// The rank's GPU over its timed steps; none when no step carried telemetry (CPU runs, --telemetry=false).
std::optional<StepTelemetry> RankTelemetry(int rank, const Reports& timed) {
  std::vector<const StepTelemetry*> steps;
  ForRank(rank, timed, [&steps](const ReportStepRequest& r) {
    if (r.has_telemetry()) steps.push_back(&r.telemetry());
  });
  if (steps.empty()) return std::nullopt;
  return CombineSteps(steps);
}

RankReport BuildRank(int rank, const Reports& all, const Reports& timed, const ReportInput& input) {
  RankReport out;
  out.set_rank(rank);
  if (rank < static_cast<int>(input.hosts.size())) out.set_host(input.hosts[rank]);
  if (rank < static_cast<int>(input.devices.size())) out.set_device(input.devices[rank]);
  if (rank < static_cast<int>(input.layers.size())) {
    out.set_first_layer(input.layers[rank].first);
    out.set_last_layer(input.layers[rank].second);
  }
  out.set_peak_memory_bytes(PeakMemory(rank, all));
  const RankSums s = SumRank(rank, timed);
  if (s.steps > 0) {
    out.set_forward_ms(s.forward_ms / s.steps);
    out.set_backward_ms(s.backward_ms / s.steps);
    out.set_optimizer_ms(s.optimizer_ms / s.steps);
    out.set_wait_ms(s.wait_ms / s.steps);
    out.set_idle_ms(s.idle_ms / s.steps);
  }
  if (s.bubble_steps > 0) out.set_bubble_fraction(s.bubble / s.bubble_steps);
  // Bytes per ms / 1e6 = GB/s.
  if (s.comm_bytes > 0 && s.comm_ms > 0) out.set_comm_gbps(s.comm_bytes / s.comm_ms / 1e6);
  if (std::optional<StepTelemetry> t = RankTelemetry(rank, timed)) *out.mutable_telemetry() = *std::move(t);
  if (rank < static_cast<int>(input.health.size()) && !input.health[rank].uuid().empty()) {
    *out.mutable_health() = input.health[rank];
  }
  if (rank < static_cast<int>(input.predicted_compute_ms.size())) {
    out.set_predicted_compute_ms(input.predicted_compute_ms[rank]);
  }
  if (rank < static_cast<int>(input.planned_sm_mhz.size())) out.set_planned_sm_mhz(input.planned_sm_mhz[rank]);
  return out;
}

// The ranks of the run: the launcher's list when it has one (a rank that never reported still shows,
// with zeros), else every rank up to the highest that reported.
int RankCount(const ReportInput& input, const Reports& all) {
  if (!input.hosts.empty()) return static_cast<int>(input.hosts.size());
  return all.empty() ? 0 : all.rbegin()->first.first + 1;
}

// JSON string literal. Action names are ours ("SA3>1"), but nothing stops a name with a quote, so
// everything JSON forbids raw is escaped; other bytes (UTF-8) pass through.
std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// Trace times are kept in integer nanoseconds and printed as microseconds with three decimals, so what
// is printed is exactly what was clamped: rounding ts and dur separately could reopen an overlap.
int64_t Nanos(double ms) { return std::isfinite(ms) ? std::llround(ms * 1e6) : 0; }

std::string Micros(int64_t ns) {
  const uint64_t abs_ns = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  return absl::StrFormat("%s%d.%03d", ns < 0 ? "-" : "", abs_ns / 1000, abs_ns % 1000);
}

std::vector<std::string> MetadataEvents(int rank) {
  const std::string head = absl::StrFormat(R"({"ph":"M","pid":%d,"tid":0,)", rank);
  return {
      absl::StrCat(head, R"("name":"process_name","args":{"name":"rank )", rank, "\"}}"),
      absl::StrCat(head, R"("name":"process_sort_index","args":{"sort_index":)", rank, "}}"),
      absl::StrCat(head, R"("name":"thread_name","args":{"name":"actions"}})"),
  };
}

// One rank's track. The steps' start times come from the worker's wall clock and the actions' offsets
// from its device timers, so an action can appear to start before the previous one ended (clock
// jitter between steps, timers that disagree by microseconds). Trace viewers mis-nest overlapping
// complete events of one thread, so such a slice is moved to start where the previous one ended and
// shortened by as much, never below zero: the end it had is kept when it can be.
class Track {
 public:
  // Returns {ts, dur} in ns.
  std::pair<int64_t, int64_t> Place(int64_t ts, int64_t dur) {
    dur = std::max<int64_t>(dur, 0);
    if (ts < end_) {
      dur = std::max<int64_t>(dur - (end_ - ts), 0);
      ts = end_;
    }
    end_ = ts + dur;
    return {ts, dur};
  }

 private:
  int64_t end_ = std::numeric_limits<int64_t>::min();
};

std::string ActionEvent(const ActionTiming& a, int rank, int64_t step, std::pair<int64_t, int64_t> slice) {
  std::string args = absl::StrCat(R"({"step":)", step);
  if (a.bytes() > 0) absl::StrAppend(&args, R"(,"bytes":)", a.bytes());
  return absl::StrCat("{\"name\":", JsonString(a.name()), ",\"cat\":", JsonString(a.kind()), R"(,"ph":"X","pid":)",
                      rank, R"(,"tid":0,"ts":)", Micros(slice.first), R"(,"dur":)", Micros(slice.second), R"(,"args":)",
                      args, "}}");
}

// The earliest step start or GPU sample of the run: time zero of the trace.
int64_t TraceOrigin(const Reports& reports) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const auto& [key, r] : reports) {
    if (r->has_timing()) origin = std::min(origin, r->timing().start_unix_micros());
    for (const GpuSample& s : r->telemetry().raw()) origin = std::min(origin, s.unix_micros());
  }
  return origin;
}

// One counter event: Perfetto draws a track per (process, name, argument), "GPU power W" under the rank.
std::string CounterEvent(const char* name, int rank, int64_t ts_ns, const std::string& args) {
  return absl::StrCat("{\"name\":\"", name, R"(","cat":"gpu","ph":"C","pid":)", rank, R"(,"ts":)", Micros(ts_ns),
                      R"(,"args":{)", args, "}}");
}

std::string Value(double v) { return std::isfinite(v) ? absl::StrFormat("%.6g", v) : "0"; }

std::vector<std::string> SampleEvents(const GpuSample& s, int rank, int64_t ts_ns) {
  const uint64_t r = s.throttle_reasons();
  return {
      CounterEvent("GPU SM clock", rank, ts_ns, absl::StrCat(R"("MHz":)", Value(s.sm_mhz()))),
      CounterEvent("GPU memory clock", rank, ts_ns, absl::StrCat(R"("MHz":)", Value(s.mem_mhz()))),
      CounterEvent("GPU power", rank, ts_ns, absl::StrCat(R"("W":)", Value(s.power_w()))),
      CounterEvent("GPU temperature", rank, ts_ns, absl::StrCat(R"("C":)", Value(s.temperature_c()))),
      CounterEvent("GPU utilization", rank, ts_ns, absl::StrCat(R"("%":)", Value(s.utilization_percent()))),
      CounterEvent("GPU throttle", rank, ts_ns,
                   absl::StrCat(R"("power_cap":)", (r & kThrottleSwPowerCap) ? 1 : 0, R"(,"thermal":)",
                                (r & kThrottleThermal) ? 1 : 0, R"(,"hw_slowdown":)", (r & kThrottleHardware) ? 1 : 0)),
  };
}

// Each rank's GPU samples as counter events, in time order per rank.
std::vector<std::string> CounterEvents(const Reports& reports, int64_t origin) {
  std::map<int, std::vector<const GpuSample*>> by_rank;
  for (const auto& [key, r] : reports) {
    for (const GpuSample& s : r->telemetry().raw()) by_rank[key.first].push_back(&s);
  }
  std::vector<std::string> events;
  for (auto& [rank, samples] : by_rank) {
    std::stable_sort(samples.begin(), samples.end(),
                     [](const GpuSample* a, const GpuSample* b) { return a->unix_micros() < b->unix_micros(); });
    for (const GpuSample* s : samples) {
      for (std::string& e : SampleEvents(*s, rank, (s->unix_micros() - origin) * 1000)) events.push_back(std::move(e));
    }
  }
  return events;
}

// In the worker's order when its slices are well formed; a slice listed out of order would otherwise
// be clamped away entirely by the one after it.
std::vector<const ActionTiming*> ActionsInStartOrder(const StepTiming& t) {
  std::vector<const ActionTiming*> actions;
  for (const ActionTiming& a : t.actions()) actions.push_back(&a);
  std::stable_sort(actions.begin(), actions.end(),
                   [](const ActionTiming* x, const ActionTiming* y) { return x->start_ms() < y->start_ms(); });
  return actions;
}

std::vector<std::string> ActionEvents(const Reports& reports) {
  std::vector<std::string> events;
  const int64_t origin = TraceOrigin(reports);
  std::map<int, Track> tracks;
  for (const auto& [key, r] : reports) {
    if (!r->has_timing()) continue;
    const int64_t step_start_ns = (r->timing().start_unix_micros() - origin) * 1000;
    Track& track = tracks[key.first];
    for (const ActionTiming* a : ActionsInStartOrder(r->timing())) {
      const auto slice = track.Place(step_start_ns + Nanos(a->start_ms()), Nanos(a->duration_ms()));
      events.push_back(ActionEvent(*a, key.first, key.second, slice));
    }
  }
  return events;
}

double Busy(const RankReport& r) { return r.forward_ms() + r.backward_ms() + r.optimizer_ms(); }

// Why a rank's clocks were held down, from its fractions: "power-capped 38%, thermally throttled 2%
// of the time"; "" when they never were.
std::string ThrottleText(const StepTelemetry& t) {
  std::vector<std::string> parts;
  auto add = [&parts](const char* what, double fraction) {
    if (fraction > 0) parts.push_back(absl::StrFormat("%s %.0f%%", what, 100 * fraction));
  };
  add("power-capped", t.power_capped_fraction());
  add("thermally throttled", t.thermal_fraction());
  add("slowed by the hardware (slowdown or power brake)", t.hw_slowdown_fraction());
  if (parts.empty() && t.throttled_fraction() > 0) {
    add(absl::StrCat("held down (", ThrottleNames(t.throttle_reasons_seen() & kThrottleSlowing), ")").c_str(),
        t.throttled_fraction());
  }
  return parts.empty() ? "" : absl::StrCat(absl::StrJoin(parts, ", "), " of the time");
}

// A step is done when every rank reported it (a rank's report comes after its part of the step).
int64_t StepsDone(const Reports& all, int ranks) {
  if (ranks <= 0) return 0;
  std::map<int64_t, int> reporters;
  for (const auto& [key, r] : all) ++reporters[key.second];
  int64_t done = 0;
  for (const auto& [step, n] : reporters) done += n >= ranks;
  return done;
}

}  // namespace

bool HasActionTiming(const std::vector<ReportStepRequest>& steps) {
  for (const ReportStepRequest& r : steps) {
    if (!r.has_timing()) continue;
    const StepTiming& t = r.timing();
    if (t.actions_size() > 0 || t.forward_ms() + t.backward_ms() + t.optimizer_ms() > 0) return true;
  }
  return false;
}

double StepFlops(const JobSpec& job) {
  // A built-in family's count; a user's family (or "allreduce") has no model FLOPs we could count.
  const ModelDescription* d = FindBuiltinModel(job.model());
  if (d == nullptr || job.model_spec().layers() <= 0) return 0;
  return d->FlopsPerStep(job.model_spec(), job.pipeline().global_batch(), job.pipeline().inference());
}

RunReport BuildReport(const ReportInput& input) {
  RunReport report;
  report.set_job_id(input.job_id);
  *report.mutable_job() = input.job;
  report.set_exit_code(input.exit_code);
  report.set_root_cause(input.root_cause);
  report.set_steps(input.job.steps());
  report.set_warmup_steps(input.warmup_steps);
  report.set_peak_tflops_per_device(input.peak_tflops_per_device);
  report.set_launch_to_first_step_seconds(input.launch_to_first_step_seconds);

  const Reports all = ByRankAndStep(input.steps);
  const Reports timed = TimedReports(all, input.warmup_steps);
  const int ranks = RankCount(input, all);
  report.set_steps_done(StepsDone(all, ranks));
  FillThroughput(timed, input, ranks, report);
  FillLosses(all, input.job, report);
  FillEvalAndCounts(all, report);
  for (int rank = 0; rank < ranks; ++rank) *report.add_ranks() = BuildRank(rank, all, timed, input);
  int64_t parameters = 0;
  for (RankReport& r : *report.mutable_ranks()) {
    for (const auto& [key, step] : all) {
      if (key.first == r.rank() && step->parameters() > 0) r.set_parameters(step->parameters());
    }
    parameters += r.parameters();
  }
  report.set_parameters(parameters / std::max(1, input.job.data_parallel()));  // one replica's
  return report;
}

const std::vector<std::string>& GpuCounterNames() {
  static const std::vector<std::string> names = {"GPU SM clock",    "GPU memory clock", "GPU power",
                                                 "GPU temperature", "GPU utilization",  "GPU throttle"};
  return names;
}

std::string GpuSummaryLine(const RunReport& report) {
  std::vector<const RankReport*> gpus;
  for (const RankReport& r : report.ranks()) {
    if (r.has_telemetry() && r.telemetry().sm_mhz_mean() > 0) gpus.push_back(&r);
  }
  if (gpus.empty()) return "";
  // The slowest: the most compute per step where the workers timed it (the pipeline's bottleneck),
  // else the lowest clock.
  const bool timed = std::any_of(gpus.begin(), gpus.end(), [](const RankReport* r) { return Busy(*r) > 0; });
  const RankReport* slowest =
      *std::max_element(gpus.begin(), gpus.end(), [timed](const RankReport* a, const RankReport* b) {
        return timed ? Busy(*a) < Busy(*b) : a->telemetry().sm_mhz_mean() > b->telemetry().sm_mhz_mean();
      });
  const StepTelemetry& t = slowest->telemetry();
  std::string why = ThrottleText(t);
  std::string line =
      absl::StrCat("rank ", slowest->rank(), gpus.size() > 1 ? " is the slowest" : "",
                   timed ? absl::StrFormat(" (%.1f ms of compute per step)", Busy(*slowest)) : "", ": ",
                   why.empty() ? "not throttled" : why, absl::StrFormat(", SM clock %.0f MHz mean", t.sm_mhz_mean()));
  const RankReport* fastest = nullptr;
  for (const RankReport* r : gpus) {
    if (r != slowest && (fastest == nullptr || r->telemetry().sm_mhz_mean() > fastest->telemetry().sm_mhz_mean())) {
      fastest = r;
    }
  }
  if (fastest != nullptr) {
    absl::StrAppend(&line,
                    absl::StrFormat(" vs rank %d's %.0f MHz", fastest->rank(), fastest->telemetry().sm_mhz_mean()));
  } else {
    absl::StrAppend(&line, absl::StrFormat(" (%.0f min)", t.sm_mhz_min()));
  }
  absl::StrAppend(&line, absl::StrFormat("; %.0f W mean of %.0f W, %.0f C max", t.power_w_mean(), t.power_limit_w(),
                                         t.temperature_c_max()));
  return line;
}

std::vector<std::string> PredictedVsMeasuredLines(const RunReport& report) {
  std::vector<const RankReport*> gpus;
  for (const RankReport& r : report.ranks()) {
    if (r.has_telemetry() && r.telemetry().sm_mhz_mean() > 0) gpus.push_back(&r);
  }
  std::vector<std::string> lines;
  for (const RankReport* r : gpus) {
    const double measured = r->forward_ms() + r->backward_ms();
    if (r->predicted_compute_ms() <= 0 || measured <= 0) continue;
    std::string line = absl::StrFormat(
        "rank %d: predicted %.1f ms, measured %.1f ms (%+.1f%%) of forward + backward per step, SM clock %.0f MHz mean",
        r->rank(), r->predicted_compute_ms(), measured, 100 * (measured / r->predicted_compute_ms() - 1),
        r->telemetry().sm_mhz_mean());
    const RankReport* fastest = nullptr;
    for (const RankReport* o : gpus) {
      if (o != r && (fastest == nullptr || o->telemetry().sm_mhz_mean() > fastest->telemetry().sm_mhz_mean()))
        fastest = o;
    }
    if (fastest != nullptr) {
      absl::StrAppend(&line,
                      absl::StrFormat(" vs rank %d's %.0f MHz", fastest->rank(), fastest->telemetry().sm_mhz_mean()));
    }
    absl::StrAppend(&line, r->planned_sm_mhz() > 0
                               ? absl::StrFormat(" (the partition weighed it at %.0f MHz)", r->planned_sm_mhz())
                               : std::string(" (clock-blind partition)"));
    lines.push_back(std::move(line));
  }
  return lines;
}

absl::StatusOr<std::string> ReportJson(const RunReport& report) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;  // a zero (no bubble, no loss) is a result too
  options.preserve_proto_field_names = true;     // the names documented in job.proto
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(report, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("cannot print report.json: ", status.ToString()));
  }
  return json;
}

std::string ChromeTrace(const std::vector<ReportStepRequest>& steps, int ranks) {
  const Reports reports = ByRankAndStep(steps);
  // Every rank the launcher ran gets a named track, and so does any other rank that reported.
  std::set<int> track_ranks;
  for (int rank = 0; rank < ranks; ++rank) track_ranks.insert(rank);
  for (const auto& [key, r] : reports) track_ranks.insert(key.first);

  std::vector<std::string> events;
  for (const int rank : track_ranks) {
    for (std::string& e : MetadataEvents(rank)) events.push_back(std::move(e));
  }
  for (std::string& e : ActionEvents(reports)) events.push_back(std::move(e));
  for (std::string& e : CounterEvents(reports, TraceOrigin(reports))) events.push_back(std::move(e));
  return absl::StrCat("{\"traceEvents\":[\n", absl::StrJoin(events, ",\n"), "\n],\n\"displayTimeUnit\":\"ms\"}\n");
}

std::string FlopsText(double tflops) {
  if (!(tflops > 0)) return "0 FLOP/s";
  if (tflops >= 1) return absl::StrFormat("%.1f TFLOP/s", tflops);
  if (tflops >= 1e-3) return absl::StrFormat("%.1f GFLOP/s", tflops * 1e3);
  return absl::StrFormat("%.1f MFLOP/s", tflops * 1e6);
}

std::string SecondsText(double seconds) {
  if (!(seconds > 0) || !std::isfinite(seconds)) return absl::StrFormat("%.4f", seconds);
  const int magnitude = static_cast<int>(std::floor(std::log10(seconds)));
  const int decimals = std::min(9, std::max(0, 2 - magnitude));
  return absl::StrFormat("%.*f", decimals, seconds);
}

namespace {

// Measured against predicted: "+12%", or in words once it is 3x or more either way.
std::string PredictionLine(const RunReport& report, bool action_timing) {
  const double predicted = report.predicted_step_seconds(), measured = report.step_seconds();
  const std::string from = report.predicted_from() == "profile" ? "the measured profile" : "the model's estimate";
  const double ratio = measured / predicted;
  std::string line;
  if (ratio >= 3 || ratio <= 1.0 / 3) {
    const double off = ratio >= 1 ? ratio : 1 / ratio;
    const std::string times = off >= 10 ? absl::StrFormat("%.0fx", off) : absl::StrFormat("%.1fx", off);
    line = absl::StrCat("stagehand: measured ", SecondsText(measured), " s/step, ", times,
                        ratio >= 1 ? " the predicted " : " faster than the predicted ", SecondsText(predicted),
                        " s (from ", from, ")");
  } else {
    line = absl::StrFormat("stagehand: predicted %s s/step (from %s), measured %s s/step (%+.0f%%)",
                           SecondsText(predicted), from, SecondsText(measured), 100 * (ratio - 1));
  }
  if (action_timing) {
    absl::StrAppend(&line, "; bubble per rank predicted");
    for (const RankReport& r : report.ranks())
      absl::StrAppend(&line, absl::StrFormat(" %.1f%%", 100 * r.predicted_bubble_fraction()));
    absl::StrAppend(&line, ", measured");
    for (const RankReport& r : report.ranks())
      absl::StrAppend(&line, absl::StrFormat(" %.1f%%", 100 * r.bubble_fraction()));
  }
  return absl::StrCat(line, "\n");
}

}  // namespace

std::string SummaryLines(const RunReport& report, bool action_timing) {
  const bool gpu = report.job().device() == "cuda";
  std::string line =
      absl::StrFormat("stagehand: %.4f s/step  %.0f tokens/s", report.step_seconds(), report.tokens_per_second());
  // A family of the user's has no FLOP count: no FLOP/s and no MFU rather than zeros.
  if (report.tflops() > 0) {
    absl::StrAppend(&line, "  ", FlopsText(report.tflops()));
    if (gpu) absl::StrAppend(&line, absl::StrFormat("  MFU %.1f%%", 100 * report.mfu()));
  }
  if (report.inference_perplexity() > 0) {  // inference with weights: over every step's batch
    absl::StrAppend(
        &line, absl::StrFormat("  loss %.4f  perplexity %.3f", report.inference_loss(), report.inference_perplexity()));
  }
  if (action_timing) {
    absl::StrAppend(&line, "  bubble");
    for (const RankReport& r : report.ranks())
      absl::StrAppend(&line, absl::StrFormat(" %.1f%%", 100 * r.bubble_fraction()));
  }
  std::string out = absl::StrFormat("%s (after %d warm-up step%s)\n", line, static_cast<int>(report.warmup_steps()),
                                    report.warmup_steps() == 1 ? "" : "s");
  // A family's estimate is made with a GPU's figures: against CPU workers it is off by orders of
  // magnitude and says nothing about the run.
  const bool meaningful = report.predicted_from() == "profile" || (report.predicted_from() == "estimate" && gpu);
  if (meaningful && report.predicted_step_seconds() > 0 && report.step_seconds() > 0) {
    absl::StrAppend(&out, PredictionLine(report, action_timing));
  }
  return out;
}

bool StoppedBySignal(int exit_code) { return exit_code == 128 + SIGINT || exit_code == 128 + SIGTERM; }

std::string EndLine(const RunEnd& end) {
  if (!end.program.empty()) {
    const std::string workers = absl::StrCat(end.workers, end.workers == 1 ? " worker" : " workers");
    if (end.exit_code == 0) {
      return absl::StrFormat("stagehand: done: %s of %s in %.2f s; run directory %s\n", workers, end.program,
                             end.seconds, end.run_dir);
    }
    if (StoppedBySignal(end.exit_code)) {
      return absl::StrCat("stagehand: stopped by ", end.exit_code == 128 + SIGINT ? "SIGINT" : "SIGTERM", " (exit ",
                          end.exit_code, "); run directory ", end.run_dir, "\n");
    }
    return absl::StrCat("stagehand: FAILED (exit ", end.exit_code, "): ", end.root_cause, "; run directory ",
                        end.run_dir, "\n");
  }
  const std::string of_steps = absl::StrCat(end.steps_done, " of ", end.steps, end.steps == 1 ? " step" : " steps");
  if (end.exit_code == 0) {
    return absl::StrFormat("stagehand: done: %d worker%s, %d step%s in %.2f s; run directory %s\n", end.workers,
                           end.workers == 1 ? "" : "s", end.steps, end.steps == 1 ? "" : "s", end.seconds, end.run_dir);
  }
  if (end.exit_code == 75) {  // kExitCheckpointedOnTerm
    return absl::StrFormat("stagehand: stopped (exit %d): %s of %d; continue with --resume=%s\n", end.exit_code,
                           end.root_cause, end.steps, end.run_dir);
  }
  if (StoppedBySignal(end.exit_code)) {
    // "interrupted by SIGHUP (handled as SIGTERM)" -> "stopped by SIGHUP (handled as SIGTERM; exit 143)";
    // "interrupted by SIGTERM; no complete checkpoint ..." -> "stopped by SIGTERM (exit 143); no complete ...".
    absl::string_view rest = end.root_cause;
    std::string signal = end.exit_code == 128 + SIGINT ? "SIGINT" : "SIGTERM";
    std::string detail;
    if (absl::ConsumePrefix(&rest, "interrupted by ") && !rest.empty()) {
      const size_t cut = rest.find_first_of(" ;");
      signal = std::string(rest.substr(0, cut));
      detail = cut == absl::string_view::npos ? "" : std::string(rest.substr(cut));
    }
    std::string text = absl::StrCat("stopped by ", signal, " (exit ", end.exit_code, ")", detail);
    if (absl::StartsWith(detail, " (") && absl::EndsWith(detail, ")") && detail.find(')') == detail.size() - 1) {
      text = absl::StrCat("stopped by ", signal, detail.substr(0, detail.size() - 1), "; exit ", end.exit_code, ")");
    }
    return absl::StrCat("stagehand: ", text, "; ", of_steps, " done; run directory ", end.run_dir, "\n");
  }
  return absl::StrCat("stagehand: FAILED (exit ", end.exit_code, "): ", end.root_cause, "; ", of_steps,
                      " done; run directory ", end.run_dir, "\n");
}

}  // namespace stagehand
