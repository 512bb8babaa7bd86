// An AgentClient for unit tests of the agent: answers RegisterAgent with what the test set, records
// heartbeats and exit reports, fails heartbeats while the test says the coordinator is unreachable,
// and ends the long poll when the test pushes a stop.
#ifndef STAGEHAND_LAUNCHER_MULTIHOST_FAKE_AGENT_CLIENT_H_
#define STAGEHAND_LAUNCHER_MULTIHOST_FAKE_AGENT_CLIENT_H_

#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "launcher/multihost/agent_client.h"

namespace stagehand {

class FakeAgentClient : public AgentClient {
 public:
  explicit FakeAgentClient(absl::StatusOr<RegisterAgentResponse> joined) : joined_(std::move(joined)) {}

  absl::StatusOr<RegisterAgentResponse> RegisterAgent(const RegisterAgentRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    registered_ = request;
    return joined_;
  }
  void SetSecret(std::string secret) override {
    absl::MutexLock lock(&mu_);
    secret_ = std::move(secret);
  }
  absl::StatusOr<AgentHeartbeatResponse> Heartbeat(const AgentHeartbeatRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    ++heartbeats_;
    last_heartbeat_ = request;
    sent_.push_back(request);
    if (unreachable_) return absl::UnavailableError("AgentHeartbeat: the coordinator is unreachable");
    AgentHeartbeatResponse r;
    r.set_checkpoint_and_stop_at(checkpoint_and_stop_at_);
    if (heartbeat_stop_) {
      r.set_stop(true);
      r.set_stop_reason(*heartbeat_stop_);
    }
    return r;
  }
  absl::Status ReportWorkerExit(const ReportWorkerExitRequest& request, absl::Duration) override {
    absl::MutexLock lock(&mu_);
    if (unreachable_) return absl::UnavailableError("ReportWorkerExit: the coordinator is unreachable");
    exits_.push_back(request);
    return absl::OkStatus();
  }
  void StartWaitForStop(const WaitForStopRequest& request, StopCallback done) override {
    absl::MutexLock lock(&mu_);
    wait_request_ = request;
    wait_ = std::move(done);
  }
  void CancelWaitForStop() override { End(absl::CancelledError("WaitForStop: cancelled")); }

  // Test controls.
  void PushStop(const std::string& reason, const std::string& origin) {
    WaitForStopResponse r;
    r.set_reason(reason);
    r.set_origin(origin);
    End(r);
  }
  // Node 0 starts attempt `restart_count` of the job (an agent's wait until_restart ends with it).
  void PushRestart(int64_t restart_count, const std::string& reason, const std::string& store_host = "",
                   int store_port = 0) {
    WaitForStopResponse r;
    r.set_restart_count(restart_count);
    r.set_reason(reason);
    r.set_origin("the coordinator");
    r.set_store_host(store_host);
    r.set_store_port(store_port);
    End(r);
  }
  // The long poll ends with `error` (UNAVAILABLE: node 0 shut down, done with the job).
  void EndWait(absl::Status error) { End(std::move(error)); }
  // Every heartbeat so far, in order.
  std::vector<AgentHeartbeatRequest> heartbeats_sent() const {
    absl::MutexLock lock(&mu_);
    return sent_;
  }
  void SetUnreachable(bool unreachable) {
    absl::MutexLock lock(&mu_);
    unreachable_ = unreachable;
  }
  void CheckpointAndStopAt(int64_t step) {  // what heartbeats answer from now on
    absl::MutexLock lock(&mu_);
    checkpoint_and_stop_at_ = step;
  }
  AgentHeartbeatRequest last_heartbeat() const {
    absl::MutexLock lock(&mu_);
    return last_heartbeat_;
  }
  void StopInHeartbeat(const std::string& reason) {
    absl::MutexLock lock(&mu_);
    heartbeat_stop_ = reason;
  }
  std::vector<ReportWorkerExitRequest> exits() const {
    absl::MutexLock lock(&mu_);
    return exits_;
  }
  RegisterAgentRequest registered() const {
    absl::MutexLock lock(&mu_);
    return registered_;
  }
  WaitForStopRequest wait_request() const {
    absl::MutexLock lock(&mu_);
    return wait_request_;
  }
  std::string secret() const {
    absl::MutexLock lock(&mu_);
    return secret_;
  }
  int heartbeats() const {
    absl::MutexLock lock(&mu_);
    return heartbeats_;
  }

 private:
  void End(absl::StatusOr<WaitForStopResponse> r) {
    StopCallback done;
    {
      absl::MutexLock lock(&mu_);
      done = std::exchange(wait_, nullptr);
    }
    if (done) done(std::move(r));
  }

  mutable absl::Mutex mu_;
  absl::StatusOr<RegisterAgentResponse> joined_ ABSL_GUARDED_BY(mu_);
  RegisterAgentRequest registered_ ABSL_GUARDED_BY(mu_);
  WaitForStopRequest wait_request_ ABSL_GUARDED_BY(mu_);
  std::string secret_ ABSL_GUARDED_BY(mu_);
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<std::string> heartbeat_stop_ ABSL_GUARDED_BY(mu_);
  std::vector<ReportWorkerExitRequest> exits_ ABSL_GUARDED_BY(mu_);
  StopCallback wait_ ABSL_GUARDED_BY(mu_);
  int heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  AgentHeartbeatRequest last_heartbeat_ ABSL_GUARDED_BY(mu_);
  std::vector<AgentHeartbeatRequest> sent_ ABSL_GUARDED_BY(mu_);
  int64_t checkpoint_and_stop_at_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_MULTIHOST_FAKE_AGENT_CLIENT_H_
