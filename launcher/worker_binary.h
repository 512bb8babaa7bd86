// The worker binary the launcher spawns and the environment it gets.
#ifndef STAGEHAND_LAUNCHER_WORKER_BINARY_H_
#define STAGEHAND_LAUNCHER_WORKER_BINARY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {

// `given` (resolved against the user's directory), or the worker beside the launcher (the bundle) or
// in ../worker/ (bazel-bin). INVALID_ARGUMENT saying to pass --worker_binary when there is none.
absl::StatusOr<std::string> FindWorker(const std::string& given);

// The workers' environment: the launcher's, less what the supervisor sets per worker, with OMP threads
// shared out among `workers` and NVLink multicast off.
std::vector<std::string> WorkerEnvironment(int workers);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_WORKER_BINARY_H_
