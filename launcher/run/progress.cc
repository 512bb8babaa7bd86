// Progress lines of a foreground run (see progress.h).
#include "launcher/run/progress.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/model_description.h"

namespace stagehand {

std::string Progress::AllReduceHeader() {
  return absl::StrFormat("#%12s %12s %8s %6s %10s %8s %8s %7s\n#%12s %12s %8s %6s %10s %8s %8s %7s\n", "size", "count",
                         "type", "redop", "time", "algbw", "busbw", "#wrong", "(B)", "(elements)", "", "", "(us)",
                         "(GB/s)", "(GB/s)", "");
}

std::string Progress::AllReduceRow(int64_t elements, int ranks, double seconds) {
  const double bytes = 4.0 * elements;
  const double algbw = seconds > 0 ? bytes / seconds / 1e9 : 0;
  const double busbw = ranks > 0 ? algbw * 2.0 * (ranks - 1) / ranks : 0;
  // #wrong is 0 by construction: every rank checks every element and fails the job otherwise.
  return absl::StrFormat(" %12d %12d %8s %6s %10.1f %8.2f %8.2f %7d\n", static_cast<int64_t>(bytes), elements, "float",
                         "sum", seconds * 1e6, algbw, busbw, 0);
}

void Progress::Update(const CoordinatorState& state) {
  const std::vector<ReportStepRequest> steps = state.StepsSince(seen_);
  seen_ += steps.size();
  const JobSpec& job = state.job();
  for (const ReportStepRequest& r : steps) PrintStep(r, job);
}

namespace {

// 1234567 -> "1.23M", as the parameter and token counts are read.
std::string Count(int64_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e9) return absl::StrFormat("%.2fB", v / 1e9);
  if (v >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (v >= 1e3) return absl::StrFormat("%.1fk", v / 1e3);
  return absl::StrCat(n);
}

}  // namespace

void Progress::PrintStep(const ReportStepRequest& r, const JobSpec& job) {
  if (IsModelJob(job) && !parameters_printed_ && r.parameters() > 0 && r.rank() >= 0 && r.rank() < job.workers()) {
    parameters_.resize(job.workers(), 0);
    parameters_[r.rank()] = r.parameters();
    if (std::all_of(parameters_.begin(), parameters_.end(), [](int64_t p) { return p > 0; })) {
      parameters_printed_ = true;
      int64_t total = 0;
      std::string each;
      for (size_t k = 0; k < parameters_.size(); ++k) {
        total += parameters_[k];
        absl::StrAppend(&each, k ? ", " : "", "rank ", k, " ", Count(parameters_[k]));
      }
      // Replicas hold the same parameters: the model's count is one replica's.
      const int replicas = std::max(1, job.data_parallel());
      if (bar_ && drawn_) write_("\n");
      write_(absl::StrFormat("stagehand: parameters: %d (%s)%s: %s\n", total / replicas, Count(total / replicas),
                             replicas > 1 ? absl::StrCat(" per replica, ", replicas, " replicas") : "", each));
    }
  }
  if (job.program_size() > 0) {
    if (r.rank() == 0) PrintProgramStep(r);  // a program's steps, as rank 0 reported them
  } else if (!IsModelJob(job)) {
    if (r.rank() == job.workers() - 1) PrintAllReduceStep(r, job);  // one row a step
  } else if (r.has_loss() || (job.pipeline().inference() && r.rank() == job.workers() - 1)) {
    PrintModelStep(r, job);  // from the rank that holds the last stage
  }
}

void Progress::Done() {
  if (bar_ && drawn_) write_("\n");
  if (busbw_count_ > 0) {
    write_(absl::StrFormat("# Out of bounds values : 0 OK\n# Avg bus bandwidth    : %.3f GB/s (%d rank%s, %d step%s)\n",
                           busbw_sum_ / busbw_count_, ranks_, ranks_ == 1 ? "" : "s", busbw_count_,
                           busbw_count_ == 1 ? "" : "s"));
    busbw_count_ = 0;
  }
}

void Progress::PrintAllReduceStep(const ReportStepRequest& r, const JobSpec& job) {
  if (!header_) {
    write_(AllReduceHeader());
    header_ = true;
  }
  ranks_ = job.workers();
  const std::string row = AllReduceRow(job.tensor_elements(), ranks_, r.step_seconds());
  write_(row);
  const double bytes = 4.0 * job.tensor_elements();
  // The first step includes the transport's warm-up: the average leaves it out, as nccl-tests' does.
  if (r.step() > 0 && r.step_seconds() > 0) {
    busbw_sum_ += bytes / r.step_seconds() / 1e9 * 2.0 * (ranks_ - 1) / ranks_;
    ++busbw_count_;
  }
}

// A program job's step (the `stagehand` module): its number, and what the script reported.
void Progress::PrintProgramStep(const ReportStepRequest& r) {
  std::string text = absl::StrFormat("step %d", r.step() + 1);
  if (r.has_loss()) absl::StrAppend(&text, absl::StrFormat("  loss %.4f", r.loss()));
  absl::StrAppend(&text, absl::StrFormat("  %.3f s", r.step_seconds()));
  if (r.tokens() > 0 && r.step_seconds() > 0) {
    absl::StrAppend(&text, absl::StrFormat("  %.0f tokens/s", r.tokens() / r.step_seconds()));
  } else if (r.samples() > 0 && r.step_seconds() > 0) {
    absl::StrAppend(&text, absl::StrFormat("  %.1f samples/s", r.samples() / r.step_seconds()));
  }
  if (bar_ && drawn_) write_("\n");
  drawn_ = false;
  write_(absl::StrCat("stagehand: ", text, "\n"));
}

void Progress::PrintModelStep(const ReportStepRequest& r, const JobSpec& job) {
  if (r.step() > 0 && r.step_seconds() > 0) {
    recent_seconds_.push_back(r.step_seconds());
    if (recent_seconds_.size() > 10) recent_seconds_.pop_front();
  }
  std::string text = absl::StrFormat("step %d/%d", r.step() + 1, job.steps());
  if (r.has_loss()) absl::StrAppend(&text, absl::StrFormat("  loss %.4f", r.loss()));
  if (r.has_loss() && job.pipeline().inference()) {
    absl::StrAppend(&text, absl::StrFormat("  perplexity %.3f", std::exp(r.loss())));
  }
  absl::StrAppend(&text, absl::StrFormat("  %.3f s  %.0f tokens/s", r.step_seconds(),
                                         r.step_seconds() > 0 ? r.tokens() / r.step_seconds() : 0.0));
  if (!recent_seconds_.empty()) {
    double sum = 0;
    for (double s : recent_seconds_) sum += s;
    const double eta = sum / recent_seconds_.size() * std::max<int64_t>(0, job.steps() - r.step() - 1);
    absl::StrAppend(&text, absl::StrFormat("  ETA %.0f s", eta));
  }
  if (!job.pipeline().inference()) absl::StrAppend(&text, "  seen ", Count((r.step() + 1) * r.tokens()), " tokens");
  if (r.has_val_loss()) {
    absl::StrAppend(&text, absl::StrFormat("  val_loss %.4f  ppl %.2f", r.val_loss(), std::exp(r.val_loss())));
  }
  if (!bar_) {
    write_(absl::StrCat("stagehand: ", text, "\n"));
  } else {
    const int width = 30, done = static_cast<int>(width * (r.step() + 1) / std::max<int64_t>(1, job.steps()));
    write_(absl::StrCat("\r[", std::string(done, '#'), std::string(width - done, '.'), "] ", text, "\x1b[K"));
    drawn_ = true;
  }
}

}  // namespace stagehand
