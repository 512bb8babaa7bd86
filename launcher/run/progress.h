// What a foreground run prints while it goes, from the workers' step reports: for a model, a line per
// step (or one bar redrawn in place on a terminal) with the loss, step time, tokens/s and, from the
// second step on, an ETA from the mean of the last steps, the tokens seen, and after an evaluation
// the validation loss and perplexity; once every rank has reported, the parameter count; for the
// checked all-reduce, nccl-tests' columns (size, count, type, time, algbw, busbw, #wrong) and its
// average bus bandwidth at the end; for a program, rank 0's steps with what its script reported
// (the loss, tokens/s, else samples/s).
#ifndef STAGEHAND_LAUNCHER_RUN_PROGRESS_H_
#define STAGEHAND_LAUNCHER_RUN_PROGRESS_H_

#include <cstdio>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/time/time.h"
#include "launcher/coordinator/coordinator.h"
#include "protos/job.pb.h"

namespace stagehand {

class Progress {
 public:
  // `out` is where lines go (stdout in the launcher); `bar` redraws one line in place.
  explicit Progress(bool bar, std::FILE* out = stdout)
      : Progress(bar, [out](absl::string_view text) {
          std::fwrite(text.data(), 1, text.size(), out);
          std::fflush(out);
        }) {}
  // Text (whole lines, or a bar's redraw) goes to `write` (a served job's events).
  Progress(bool bar, std::function<void(absl::string_view)> write) : bar_(bar), write_(std::move(write)) {}
  // Prints what arrived since the last call.
  void Update(const CoordinatorState& state);
  // Ends the bar's line; for the all-reduce, the footer.
  void Done();
  // What Update() does with each new report (the lines come from the rank that holds the loss).
  void PrintStep(const ReportStepRequest& r, const JobSpec& job);

  // One row of nccl-tests' all_reduce_perf table for `elements` floats over `ranks` in `seconds`:
  // algbw = bytes / time, busbw = algbw * 2 (n - 1) / n.
  static std::string AllReduceRow(int64_t elements, int ranks, double seconds);
  static std::string AllReduceHeader();

 private:
  void PrintModelStep(const ReportStepRequest& r, const JobSpec& job);
  void PrintProgramStep(const ReportStepRequest& r);
  void PrintAllReduceStep(const ReportStepRequest& r, const JobSpec& job);

  const bool bar_;
  const std::function<void(absl::string_view)> write_;
  size_t seen_ = 0;  // step reports read so far
  bool drawn_ = false;
  bool header_ = false;
  int ranks_ = 0;
  double busbw_sum_ = 0;
  int busbw_count_ = 0;
  // The last steps' times, for the ETA. Step 0 is left out: it includes the first allocations and
  // the transport's warm-up, and a run's length estimated from it can be ten times off.
  std::deque<double> recent_seconds_;
  // Each rank's parameter count from its first report; printed once every rank's is in.
  std::vector<int64_t> parameters_;
  bool parameters_printed_ = false;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_RUN_PROGRESS_H_
