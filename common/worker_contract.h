// What the launcher and every worker binary agree on outside the Coordinator protocol: how the job
// secret is handed over, and what a worker's exit code means.
#ifndef STAGEHAND_COMMON_WORKER_CONTRACT_H_
#define STAGEHAND_COMMON_WORKER_CONTRACT_H_

namespace stagehand {

// The environment variable naming the inherited file descriptor from which a worker reads the job
// secret (until EOF). The secret never appears in argv or in the environment.
inline constexpr char kSecretFdEnv[] = "STAGEHAND_SECRET_FD";

// A worker's exit codes.
inline constexpr int kWorkerExitOk = 0;
inline constexpr int kWorkerExitFailed = 1;           // failed, and reported it to the coordinator
inline constexpr int kWorkerExitStopped = 3;          // the coordinator stopped the job, or replaced us
inline constexpr int kWorkerExitLostCoordinator = 4;  // no answer from the coordinator for too long

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_WORKER_CONTRACT_H_
