// An in-process KeyValueStore for tests: the same write-once semantics as the coordinator's store,
// so that transports rendezvous in tests exactly as they do in a job.
#ifndef STAGEHAND_TRANSPORT_IN_MEMORY_KV_STORE_H_
#define STAGEHAND_TRANSPORT_IN_MEMORY_KV_STORE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace stagehand {

class InMemoryKeyValueStore : public KeyValueStore {
 public:
  // Setting a key again to the same value is OK so that retried Sets are idempotent; a different
  // value is ALREADY_EXISTS because a key names one fact of one job (an address, a unique id).
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = values_.emplace(key, value);
    if (!inserted && it->second != value) {
      return absl::AlreadyExistsError(
          absl::StrCat("key '", key, "' already holds a different value; keys are write-once"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(
          absl::StrCat("key '", key, "' was not set within ", absl::FormatDuration(timeout)));
    }
    return values_.at(key);
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_TRANSPORT_IN_MEMORY_KV_STORE_H_
