// How fast a failure is noticed, in one place: a worker or an agent that dies, hangs or loses its
// network ends the job on every host within kFailureBoundMs. A death is seen at once (an exit, a
// closed connection); a hang or a cut link only by silence, so the silences allowed here, plus the
// stop notice the others get before SIGTERM, must fit the bound (checked below).
#ifndef STAGEHAND_LAUNCHER_COORDINATOR_LIVENESS_H_
#define STAGEHAND_LAUNCHER_COORDINATOR_LIVENESS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace stagehand {

inline constexpr int64_t kFailureBoundMs = 5000;

// Workers (the job's Timeouts, unless a job file or --heartbeat_timeout_ms says otherwise). A worker
// heartbeats on a thread of its own (worker/agent.h), which compute, CUDA graph capture, NCCL calls
// and checkpoint writes do not hold up, and only once it has its assignment (until then it waits in
// Register, alive; the registration deadline covers that time): 3 s is 30 missed beats.
inline constexpr int64_t kDefaultHeartbeatIntervalMs = 100;
inline constexpr int64_t kDefaultHeartbeatTimeoutMs = 3000;

// Agents (several hosts): one silent for kAgentTimeoutMs is lost, and so are its ranks; an agent that
// hears nothing from the coordinator for as long stops its own workers. A call that takes longer than
// kAgentCallTimeoutMs counts as missed, so that the agent's loop goes on.
inline constexpr int64_t kAgentHeartbeatIntervalMs = 200;
inline constexpr int64_t kAgentTimeoutMs = 2000;
inline constexpr int64_t kAgentCallTimeoutMs = 500;
inline constexpr absl::Duration kAgentHeartbeatInterval = absl::Milliseconds(kAgentHeartbeatIntervalMs);
inline constexpr absl::Duration kAgentTimeout = absl::Milliseconds(kAgentTimeoutMs);
inline constexpr absl::Duration kAgentCallTimeout = absl::Milliseconds(kAgentCallTimeoutMs);
// A program job: the steps of an agent's ranks one heartbeat carries at most (the rest go with the
// next ones), so that a flood of steps keeps each heartbeat small; a step is about 60 bytes.
inline constexpr int kMaxStepsPerHeartbeat = 1024;

// How long workers get to notice a stop (through their heartbeat) and leave by themselves,
// aborting their communicators, before they are sent SIGTERM (and SIGCONT: a stopped one).
constexpr int64_t StopNoticeMs(int64_t heartbeat_interval_ms) { return 3 * heartbeat_interval_ms + 200; }
constexpr absl::Duration StopNotice(int64_t heartbeat_interval_ms) {
  return absl::Milliseconds(StopNoticeMs(heartbeat_interval_ms));
}

// What is left of the bound after the silence and the notice: a SIGTERM'd worker's exit, its
// agent's report, the launchers' 20 ms ticks.
inline constexpr int64_t kExitMarginMs = 1000;
static_assert(kDefaultHeartbeatTimeoutMs + StopNoticeMs(kDefaultHeartbeatIntervalMs) + kExitMarginMs <= kFailureBoundMs,
              "a hung worker would not end the job within the failure bound");
static_assert(kAgentTimeoutMs + StopNoticeMs(kDefaultHeartbeatIntervalMs) + kExitMarginMs <= kFailureBoundMs,
              "a silent agent or a cut link would not end the job within the failure bound");
static_assert(kAgentTimeoutMs >= 5 * kAgentHeartbeatIntervalMs, "an agent must miss several beats before it is lost");
static_assert(kDefaultHeartbeatTimeoutMs >= 10 * kDefaultHeartbeatIntervalMs,
              "a worker must miss many beats before it is declared hung");

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_COORDINATOR_LIVENESS_H_
