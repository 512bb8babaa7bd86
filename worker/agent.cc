// The worker's heartbeat and stop agent (see agent.h).
#include "worker/agent.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"

namespace stagehand {

Agent::Agent(CoordinatorClient& client, int rank, int64_t incarnation, const Timeouts& timeouts)
    : client_(client),
      rank_(rank),
      incarnation_(incarnation),
      interval_(absl::Milliseconds(timeouts.heartbeat_interval_ms())),
      timeout_(absl::Milliseconds(timeouts.heartbeat_timeout_ms())),
      heartbeat_thread_([this] { HeartbeatLoop(); }),
      stop_thread_([this] { WaitForStopLoop(); }) {}

Agent::~Agent() {
  done_.Notify();
  client_.CancelWaitForStop();  // the long poll would otherwise outlive the run
  heartbeat_thread_.join();
  stop_thread_.join();
}

void Agent::SetTransport(Transport* transport) {
  absl::MutexLock lock(&mu_);
  transport_ = transport;
  if (exit_code_ != 0 && transport != nullptr) transport->Abort();
}

int Agent::exit_code() const {
  absl::MutexLock lock(&mu_);
  return exit_code_;
}

std::string Agent::reason() const {
  absl::MutexLock lock(&mu_);
  return reason_;
}

bool Agent::AwaitTrip(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto tripped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return exit_code_ != 0; };
  return mu_.AwaitWithTimeout(absl::Condition(&tripped), timeout);
}

void Agent::Trip(int code, std::string reason) {
  absl::MutexLock lock(&mu_);
  if (exit_code_ != 0) return;
  exit_code_ = code;
  reason_ = std::move(reason);
  if (transport_ != nullptr) transport_->Abort();
}

void Agent::HeartbeatLoop() {
  absl::Time last_ok = absl::Now();
  while (!done_.WaitForNotificationWithTimeout(interval_)) {
    HeartbeatRequest request;
    request.set_rank(rank_);
    request.set_incarnation(incarnation_);
    request.set_steps_done(steps_);
    absl::StatusOr<HeartbeatResponse> r = client_.Heartbeat(request, interval_ * 5);
    if (r.ok()) {
      last_ok = absl::Now();
      if (r->stop()) Trip(kWorkerExitStopped, r->stop_reason());
    } else if (absl::IsAborted(r.status())) {
      Trip(kWorkerExitStopped, std::string(r.status().message()));
    } else if (absl::Now() - last_ok > timeout_) {
      Trip(kWorkerExitLostCoordinator, absl::StrCat("no answer from the coordinator for ",
                                                    absl::FormatDuration(timeout_), ": ", r.status().message()));
    }
  }
}

void Agent::WaitForStopLoop() {
  WaitForStopRequest request;
  request.set_rank(rank_);
  request.set_incarnation(incarnation_);
  while (!done_.HasBeenNotified()) {
    absl::StatusOr<WaitForStopResponse> r = client_.WaitForStop(request);
    if (r.ok()) {
      Trip(kWorkerExitStopped, absl::StrCat(r->reason(), " (from ", r->origin(), ")"));
      return;
    }
    if (absl::IsAborted(r.status())) {
      Trip(kWorkerExitStopped, std::string(r.status().message()));
      return;
    }
    if (done_.HasBeenNotified()) return;  // our own cancellation
    // Anything else (the coordinator restarting, a deadline) is no stop: poll again. Losing the
    // coordinator for good is the heartbeat's to judge; waiting an interval keeps this from spinning.
    LOG(WARNING) << "WaitForStop failed, polling again: " << r.status().ToString();
    if (done_.WaitForNotificationWithTimeout(interval_)) return;
  }
}

}  // namespace stagehand
