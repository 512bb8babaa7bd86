// What a run leaves behind besides the logs: report.json (RunReport, through protobuf's JSON printer),
// trace.json (a Chrome/Perfetto timeline: one track per rank, one slice per action) and the summary
// numbers the launcher prints. Pure functions of the job and the step reports, so they are unit-tested.
#ifndef STAGEHAND_LAUNCHER_RUN_REPORT_H_
#define STAGEHAND_LAUNCHER_RUN_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protos/coordinator.pb.h"
#include "protos/job.pb.h"

namespace stagehand {

// FLOPs of one step of a GPT job (targets.md): 6*GB*S*(12*L*H^2 + V*H) + 6*L*GB*S^2*H for training,
// a third of it for forward-only inference. 0 for other models.
double StepFlops(const JobSpec& job);

struct ReportInput {
  std::string job_id;
  JobSpec job;
  int exit_code = 0;
  std::string root_cause;
  std::vector<ReportStepRequest> steps;     // every step report of every rank, in arrival order
  std::vector<std::string> hosts;           // per rank
  std::vector<std::string> devices;         // per rank, e.g. "NVIDIA H200" or "cpu"
  std::vector<std::pair<int, int>> layers;  // per rank: [first, last) pipeline layers
  double peak_tflops_per_device = 989.0;    // H100/H200 dense bf16
  int64_t warmup_steps = 0;                 // steps left out of the means (min(3, steps - 1) by default)
  double launch_to_first_step_seconds = 0;
  std::vector<GpuHealth> health;  // per rank: its GPU's pre-flight readings (empty for CPU runs)
  // Per rank, from the partition (empty: no measured profile): its predicted compute per step and the
  // SM clock the partition weighed it at (0: clock-blind).
  std::vector<double> predicted_compute_ms;
  std::vector<double> planned_sm_mhz;
};

// Aggregates: steps done (every rank reported them), step time (the rank holding the loss, else the slowest rank),
// tokens/s, TFLOP/s, MFU, and per rank the mean breakdown, bubble fraction, communication bandwidth and peak memory.
RunReport BuildReport(const ReportInput& input);

// Whether any step carries per-action timing or a compute breakdown (not so with --timing=false):
// without it there is no bubble to print.
bool HasActionTiming(const std::vector<ReportStepRequest>& steps);

// report.json text (protobuf's JSON printer, fields as in the proto, indented).
absl::StatusOr<std::string> ReportJson(const RunReport& report);

// trace.json text in the Chrome trace event format: {"traceEvents": [...]} with one process per rank
// (named "rank N"), one thread ("actions"), a complete event ("ph": "X") per action, and for GPU runs
// with telemetry counter events ("ph": "C") per GPU sample, which Perfetto draws as graphs under the
// rank: "GPU SM clock" (MHz), "GPU memory clock" (MHz), "GPU power" (W), "GPU temperature" (C),
// "GPU utilization" (%), "GPU throttle" (power_cap, thermal, hw_slowdown: 1 while it holds).
// Timestamps in microseconds from the earliest step start or sample of the run.
std::string ChromeTrace(const std::vector<ReportStepRequest>& steps, int ranks);

// The counter names ChromeTrace writes, for checks.
const std::vector<std::string>& GpuCounterNames();

// The line the launcher prints at the end of a GPU run with telemetry: the slowest rank (the most
// compute per step when the workers timed their actions, else the lowest SM clock) and, when it was
// throttled, why, beside the fastest other rank's clock:
//   "rank 0 is the slowest: power-capped 38% of the time, SM clock 1752 MHz mean vs rank 1's 1841 MHz"
// "" when no rank reported telemetry.
std::string GpuSummaryLine(const RunReport& report);

// Below it, one line per GPU rank with a prediction and measured compute: the plan's compute per step
// (forward + backward) beside the measured, and the clock it ran at against the partition's:
//   "rank 0: predicted 412.0 ms, measured 421.0 ms (+2.2%) of forward + backward per step, SM clock
//    1752 MHz mean vs rank 1's 1841 MHz (the partition weighed it at 1760 MHz)"
// Empty for CPU runs, without timing or without a measured profile.
std::vector<std::string> PredictedVsMeasuredLines(const RunReport& report);

// FLOP/s in the unit its magnitude reads in: "3.2 TFLOP/s" on GPUs, "41.7 GFLOP/s" or "512.0 MFLOP/s"
// on CPU workers (never "0.0 TFLOP/s").
std::string FlopsText(double tflops);

// A time in seconds to three significant digits, without an exponent: "0.940", "0.0440", "12.3".
std::string SecondsText(double seconds);

// The lines that end a model run (each "stagehand: ...\n"): the summary (step time, tokens/s, FLOP/s
// and MFU on GPUs where the model's FLOPs are known, the measured bubble with `action_timing`) and, where one is
// meaningful, the predicted step beside the measured one: from the workers' measured profile, or from a built-in
// family's estimate on GPUs (its figures are a GPU's: on CPU workers it predicts nothing worth printing). A prediction
// missed by 3x or more says so in words ("measured 0.940 s/step, 21x the predicted 0.0440 s ...").
std::string SummaryLines(const RunReport& report, bool action_timing);

// Whether a run's exit code is a stop by SIGINT (130) or by SIGTERM/SIGHUP (143): not a failure.
bool StoppedBySignal(int exit_code);

// How a run ended, for its last line.
struct RunEnd {
  int exit_code = 0;
  std::string root_cause;  // "" on success
  int64_t steps_done = 0;
  int64_t steps = 0;
  int workers = 0;
  double seconds = 0;
  std::string run_dir;
  std::string program;  // a program job's command line ("": stagehand's worker): no steps to count
};

// The run's last line (with its newline): "stagehand: done: 1 worker, 10 steps in 2.10 s; run
// directory D", "stagehand: stopped by SIGINT (exit 130); 3 of 10 steps done; run directory D",
// "stagehand: stopped (exit 75): ... of 10; continue with --resume=D" or "stagehand: FAILED (exit 1):
// <root cause>; 0 of 10 steps done; run directory D".
std::string EndLine(const RunEnd& end);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_REPORT_H_
