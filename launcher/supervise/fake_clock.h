// A clock for unit tests of the supervisor, the coordinator and the agent: read from any thread (the
// coordinator reads it on registering threads), advanced only by the test.
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_FAKE_CLOCK_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_FAKE_CLOCK_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagehand {

class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  std::function<absl::Time()> AsFunction() {
    return [this] { return Now(); };
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1700000000);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_FAKE_CLOCK_H_
