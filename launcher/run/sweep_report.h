// The outputs of a scaling sweep (`launcher --sweep=1,2,4`, of a model or a program): sweep.csv, a
// markdown table and an SVG plot of speedup against worker count with the ideal line and the
// schedule's bubble bound.
#ifndef STAGEHAND_LAUNCHER_RUN_SWEEP_REPORT_H_
#define STAGEHAND_LAUNCHER_RUN_SWEEP_REPORT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace stagehand {

struct SweepPoint {
  int workers = 0;
  int stages = 0;
  bool ok = false;   // the run at this count succeeded
  std::string note;  // why it was skipped or failed
  double step_seconds = 0;
  double tokens_per_second = 0;
  double samples_per_second = 0;           // a program that reports samples (stagehand.step(samples=...))
  std::vector<int64_t> peak_memory_bytes;  // per worker
  int micro_batches = 0;                   // for the bubble bound; 0 when not a pipeline
  std::string run_dir;
};

// What the sweep compares its runs by: "tokens/s" where every run that finished a timed step
// reported tokens, else "samples/s" where every one reported samples, else "steps/s". A model's
// runs process the same global batch at every count, so each gives the step time's ratio; a
// program's batch at each count is its own, so its throughput is what compares.
std::string ThroughputUnit(const std::vector<SweepPoint>& points);
// A point's throughput in that unit; 0 when it did not finish or has no step time.
double Throughput(const std::vector<SweepPoint>& points, const SweepPoint& p);
// Speedup of a point against the first successful point with the fewest workers (this one's
// throughput over its), and efficiency = speedup * base_workers / workers. 0 when not computable.
double Speedup(const std::vector<SweepPoint>& points, const SweepPoint& p);
double Efficiency(const std::vector<SweepPoint>& points, const SweepPoint& p);
// The GPipe/1F1B speedup bound for p stages and m micro-batches: p*m/(m+p-1) (p for m == 0).
double PipelineSpeedupBound(int stages, int micro_batches);

std::string SweepCsv(const std::vector<SweepPoint>& points);
std::string SweepMarkdown(const std::vector<SweepPoint>& points, const std::string& title);
// A self-contained SVG (no scripts, no external fonts): axes with ticks, the measured speedup (points
// and line), the ideal line (speedup = workers / base), and the bubble bound per worker count, with a
// legend and the title.
std::string SweepSvg(const std::vector<SweepPoint>& points, const std::string& title);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_SWEEP_REPORT_H_
