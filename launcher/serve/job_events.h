// One served job's events (state changes, step reports, output lines), numbered 1, 2, 3, ... and kept
// in memory for watchers, who read them after a sequence number and wait for more. Thread-safe: the
// serve loop and the job's output thread append, gRPC threads read.
#ifndef STAGEHAND_LAUNCHER_SERVE_JOB_EVENTS_H_
#define STAGEHAND_LAUNCHER_SERVE_JOB_EVENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "protos/control.pb.h"

namespace stagehand {

class JobEvents {
 public:
  // Output lines beyond this many are not kept (the rank logs have them all); one line says so.
  static constexpr int64_t kMaxLines = 100000;

  // `first_seq`: the number of the first event appended (1 for a new job).
  explicit JobEvents(int64_t first_seq = 1) : next_seq_(first_seq) {}

  void AddState(const control::JobInfo& info, bool final);
  void AddStep(const ReportStepRequest& step);
  void AddLine(absl::string_view line);
  // Text as a run writes it (whole lines; a partial one waits for its end); "\r" redraws are dropped.
  void AddText(absl::string_view text);

  struct Read {
    std::vector<control::JobEvent> events;
    bool ended = false;  // the final state is among them, or came before
  };
  // The events after `after_seq` (without lines unless `lines`), waiting until `deadline` for one.
  Read After(int64_t after_seq, bool lines, absl::Time deadline) const;

  int64_t last_seq() const;
  bool ended() const;

 private:
  void Add(control::JobEvent event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::vector<control::JobEvent> events_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_);
  int64_t lines_ ABSL_GUARDED_BY(mu_) = 0;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  std::string partial_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_JOB_EVENTS_H_
