// A TerminalSink for unit tests: a terminal that a test stalls and resumes at will, keeping what it
// was given, so that tests of the bounded writer are deterministic.
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_FAKE_TERMINAL_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_FAKE_TERMINAL_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/supervise/terminal.h"

namespace stagehand {

class FakeTerminalSink : public TerminalSink {
 public:
  // While stalled, Write waits (as write(2) on a full pipe) until Resume() or Cancel().
  bool Write(absl::string_view data) override {
    absl::MutexLock lock(&mu_);
    ++waiting_;
    mu_.Await(absl::Condition(
        +[](FakeTerminalSink* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return !s->stalled_ || s->cancelled_; },
        this));
    --waiting_;
    if (cancelled_ || gone_) return false;
    text_.append(data.data(), data.size());
    return true;
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

  void Stall() {
    absl::MutexLock lock(&mu_);
    stalled_ = true;
  }
  void Resume() {
    absl::MutexLock lock(&mu_);
    stalled_ = false;
  }
  // Later writes fail, as on a closed pipe (EPIPE).
  void Close() {
    absl::MutexLock lock(&mu_);
    gone_ = true;
  }
  // True once the writer's thread waits in a stalled Write (false if `timeout` passes first).
  bool AwaitBlocked(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(
        absl::Condition(
            +[](FakeTerminalSink* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) { return s->waiting_ > 0; }, this),
        timeout);
  }
  std::string text() const {
    absl::MutexLock lock(&mu_);
    return text_;
  }

 private:
  mutable absl::Mutex mu_;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  int waiting_ ABSL_GUARDED_BY(mu_) = 0;
  std::string text_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_FAKE_TERMINAL_H_
