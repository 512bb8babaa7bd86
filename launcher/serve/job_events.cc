// A served job's numbered events (see job_events.h).
#include "launcher/serve/job_events.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace stagehand {

void JobEvents::Add(control::JobEvent event) {
  event.set_seq(next_seq_++);
  event.set_time_ms(absl::ToUnixMillis(absl::Now()));
  events_.push_back(std::move(event));
}

void JobEvents::AddState(const control::JobInfo& info, bool final) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;  // nothing follows the final state
  control::JobEvent e;
  *e.mutable_state() = info;
  Add(std::move(e));
  ended_ = final;
}

void JobEvents::AddStep(const ReportStepRequest& step) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  control::JobEvent e;
  *e.mutable_step() = step;
  Add(std::move(e));
}

void JobEvents::AddLine(absl::string_view line) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  ++lines_;
  if (lines_ > kMaxLines + 1) return;
  control::JobEvent e;
  if (lines_ == kMaxLines + 1) {
    e.set_line(absl::StrCat("[stagehand] more than ", kMaxLines,
                            " lines of output: the rest are not streamed; the rank logs have them (client logs)"));
  } else {
    e.set_line(std::string(line));
  }
  Add(std::move(e));
}

void JobEvents::AddText(absl::string_view text) {
  std::vector<std::string> lines;
  {
    absl::MutexLock lock(&mu_);
    absl::StrAppend(&partial_, text);
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string line = partial_.substr(start, nl - start);
      // A bar's redraws ("\r[###...] ...") are for terminals; keep what follows the last one.
      if (size_t cr = line.rfind('\r'); cr != std::string::npos) line = line.substr(cr + 1);
      if (!line.empty()) lines.push_back(std::move(line));
    }
    partial_.erase(0, start);
  }
  for (const std::string& line : lines) AddLine(line);
}

JobEvents::Read JobEvents::After(int64_t after_seq, bool lines, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto has_news = [this, after_seq]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ended_ || next_seq_ - 1 > after_seq; };
  mu_.AwaitWithDeadline(absl::Condition(&has_news), deadline);
  Read out;
  const int64_t first = events_.empty() ? next_seq_ : events_.front().seq();
  const size_t from = static_cast<size_t>(std::max<int64_t>(0, after_seq + 1 - first));
  for (size_t i = from; i < events_.size(); ++i) {
    if (!lines && events_[i].has_line()) continue;
    out.events.push_back(events_[i]);
  }
  out.ended = ended_;
  return out;
}

int64_t JobEvents::last_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_ - 1;
}

bool JobEvents::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

}  // namespace stagehand
