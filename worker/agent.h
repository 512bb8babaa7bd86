// The worker's agent (after TSL's coordination_service_agent): heartbeats on one thread, keeps a
// WaitForStop long poll outstanding on another, and when the job stops (a heartbeat says so,
// WaitForStop returns, the coordinator answers ABORTED) or the coordinator is lost for the
// heartbeat timeout, records the exit code and reason and aborts the registered Transport, so that
// a rank blocked in a collective returns at once.
#ifndef STAGEHAND_WORKER_AGENT_H_
#define STAGEHAND_WORKER_AGENT_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/worker_contract.h"
#include "protos/job.pb.h"
#include "transport/transport.h"
#include "worker/coordinator_client.h"

namespace stagehand {

class Agent {
 public:
  // Starts both threads at once; `client` must outlive the agent. The heartbeat interval and
  // timeout come from the job's Timeouts.
  Agent(CoordinatorClient& client, int rank, int64_t incarnation, const Timeouts& timeouts);
  ~Agent();  // cancels the WaitForStop and joins both threads
  Agent(const Agent&) = delete;
  Agent& operator=(const Agent&) = delete;

  int rank() const { return rank_; }
  int64_t incarnation() const { return incarnation_; }

  // The transport to abort on a stop (nullptr: none). Aborted at once if the agent already tripped.
  void SetTransport(Transport* transport);
  // The progress counter the heartbeats carry.
  void SetSteps(int64_t steps) { steps_ = steps; }

  // 0 while the run may go on; kWorkerExitStopped or kWorkerExitLostCoordinator once tripped.
  int exit_code() const;
  std::string reason() const;
  // Waits up to `timeout` for the agent to trip; true if it has.
  bool AwaitTrip(absl::Duration timeout) const;

 private:
  void HeartbeatLoop();
  void WaitForStopLoop();
  // The first trip wins: its code and reason are the run's.
  void Trip(int code, std::string reason);

  CoordinatorClient& client_;
  const int rank_;
  const int64_t incarnation_;
  const absl::Duration interval_;
  const absl::Duration timeout_;
  std::atomic<int64_t> steps_{0};
  absl::Notification done_;
  mutable absl::Mutex mu_;
  Transport* transport_ ABSL_GUARDED_BY(mu_) = nullptr;
  int exit_code_ ABSL_GUARDED_BY(mu_) = 0;
  std::string reason_ ABSL_GUARDED_BY(mu_);
  std::thread heartbeat_thread_;  // last two: they start once the members above exist
  std::thread stop_thread_;
};

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_AGENT_H_
