// A hand-written CoordinatorClient for tests: records every call, answers from a script, and lets a
// test end the pending WaitForStop (TriggerStop) to stand for the job stopping. Its key-value store
// has the coordinator's write-once semantics.
#ifndef STAGEHAND_WORKER_FAKE_COORDINATOR_CLIENT_H_
#define STAGEHAND_WORKER_FAKE_COORDINATOR_CLIENT_H_

#include <deque>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/coordinator_client.h"

namespace stagehand {

class FakeCoordinatorClient : public CoordinatorClient {
 public:
  // --- The script ---
  void SetJob(GetJobResponse job) {
    absl::MutexLock lock(&mu_);
    job_ = std::move(job);
  }
  // What Register answers; by default an Assignment with rank = worker_index.
  void SetRegisterResult(absl::StatusOr<Assignment> result) {
    absl::MutexLock lock(&mu_);
    register_result_ = std::move(result);
  }
  // What every Heartbeat answers from now on (by default OK, stop = false).
  void SetHeartbeatResult(absl::StatusOr<HeartbeatResponse> result) {
    absl::MutexLock lock(&mu_);
    heartbeat_result_ = std::move(result);
  }
  // Ends the pending WaitForStop (or the next one) with `result`; each result answers one call.
  void TriggerStop(absl::StatusOr<WaitForStopResponse> result) {
    absl::MutexLock lock(&mu_);
    stop_results_.push_back(std::move(result));
  }
  void TriggerStop(const std::string& reason, const std::string& origin) {
    WaitForStopResponse response;
    response.set_reason(reason);
    response.set_origin(origin);
    TriggerStop(response);
  }

  // --- What was called ---
  std::vector<HeartbeatRequest> heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }
  std::vector<ReportStepRequest> steps() const {
    absl::MutexLock lock(&mu_);
    return steps_;
  }
  std::vector<ReportMilestoneRequest> milestones() const {
    absl::MutexLock lock(&mu_);
    return milestones_;
  }
  std::vector<FinishRequest> finishes() const {
    absl::MutexLock lock(&mu_);
    return finishes_;
  }
  int wait_for_stop_calls() const {
    absl::MutexLock lock(&mu_);
    return wait_for_stop_calls_;
  }
  // Wait (up to `timeout`) until that many calls came; true if they did.
  bool AwaitHeartbeats(int count, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return static_cast<int>(heartbeats_.size()) >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  bool AwaitWaitForStopCalls(int count, absl::Duration timeout) const {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return wait_for_stop_calls_ >= count; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }

  // --- CoordinatorClient ---
  absl::StatusOr<GetJobResponse> GetJob(absl::Duration) override {
    absl::MutexLock lock(&mu_);
    return job_;
  }
  absl::StatusOr<Assignment> Register(const RegisterRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    registrations_.push_back(request);
    if (register_result_) return *register_result_;
    Assignment a;
    a.set_job_id(request.job_id());
    a.set_rank(request.worker_index());
    *a.mutable_job() = job_.job();
    return a;
  }
  absl::StatusOr<HeartbeatResponse> Heartbeat(const HeartbeatRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    heartbeats_.push_back(request);
    return heartbeat_result_;
  }
  absl::StatusOr<WaitForStopResponse> WaitForStop(const WaitForStopRequest&) override {
    absl::MutexLock lock(&mu_);
    ++wait_for_stop_calls_;
    auto over = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_ || !stop_results_.empty(); };
    mu_.Await(absl::Condition(&over));
    if (cancelled_) return absl::CancelledError("WaitForStop: cancelled by this worker");
    absl::StatusOr<WaitForStopResponse> result = std::move(stop_results_.front());
    stop_results_.pop_front();
    return result;
  }
  void CancelWaitForStop() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  absl::Status ReportMilestone(const ReportMilestoneRequest& request) override {
    absl::MutexLock lock(&mu_);
    milestones_.push_back(request);
    return absl::OkStatus();
  }
  absl::StatusOr<ReportStepResponse> ReportStep(const ReportStepRequest& request) override {
    absl::MutexLock lock(&mu_);
    steps_.push_back(request);
    return ReportStepResponse();
  }
  absl::Status Finish(const FinishRequest& request) override {
    absl::MutexLock lock(&mu_);
    finishes_.push_back(request);
    return absl::OkStatus();
  }
  absl::Status Barrier(const BarrierRequest&) override { return absl::OkStatus(); }
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    auto [it, inserted] = kv_.emplace(key, value);
    if (inserted || it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(absl::StrCat("key \"", key, "\" is already set; keys are write-once"));
  }
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return kv_.count(key) > 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError(absl::StrCat("key \"", key, "\" was not set in time"));
    }
    return kv_.at(key);
  }

 private:
  mutable absl::Mutex mu_;
  GetJobResponse job_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::StatusOr<Assignment>> register_result_ ABSL_GUARDED_BY(mu_);
  absl::StatusOr<HeartbeatResponse> heartbeat_result_ ABSL_GUARDED_BY(mu_) = HeartbeatResponse();
  std::deque<absl::StatusOr<WaitForStopResponse>> stop_results_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<RegisterRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<HeartbeatRequest> heartbeats_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportStepRequest> steps_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportMilestoneRequest> milestones_ ABSL_GUARDED_BY(mu_);
  std::vector<FinishRequest> finishes_ ABSL_GUARDED_BY(mu_);
  int wait_for_stop_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_FAKE_COORDINATOR_CLIENT_H_
