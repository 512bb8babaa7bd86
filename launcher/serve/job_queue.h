// The device queue of `launcher --serve`: which queued jobs start now, on which GPUs. Pure logic (no
// clock, no store, no threads), so the server calls it under its own lock and tests drive it directly.
#ifndef STAGEHAND_LAUNCHER_SERVE_JOB_QUEUE_H_
#define STAGEHAND_LAUNCHER_SERVE_JOB_QUEUE_H_

#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "protos/control.pb.h"

namespace stagehand {

// A job that may start now, and the GPUs it was given (indices among the server's GPUs, ascending).
struct Grant {
  std::string id;
  std::vector<int> gpu_ordinals;
};

// Strict FIFO: Schedule() starts jobs from the head of the queue while each fits the free devices
// and stops at the first that does not. No job overtakes an earlier one, so a job that asks for every
// GPU is never starved by a stream of small ones behind it; the price is that a small job waits behind
// a big one even when it would fit now (no backfilling: a backfilled job could run for days and delay
// the big one just as long). Jobs that fit together still run at once: 2 + 2 CPU workers on a cap of
// 4 start in the same Schedule().
//
// Not thread-safe: the server holds its lock around every call.
class DeviceQueue {
 public:
  // `gpus`: the server's GPUs; `cpu_workers`: how many CPU workers it runs at once, at most.
  DeviceQueue(int gpus, int cpu_workers);

  // Whether `ask` fits on this server when it is idle: INVALID_ARGUMENT naming the ask, what the server
  // has, and what to pass instead. A job that can never fit must not be queued: it would block the
  // queue behind it forever.
  absl::Status CanEverFit(const control::Devices& ask) const;

  // Appends a job to the queue. INVALID_ARGUMENT when it can never fit (CanEverFit's message);
  // ALREADY_EXISTS when `id` is queued or running.
  absl::Status Enqueue(const std::string& id, const control::Devices& ask);

  // Takes a waiting job off the queue (it was cancelled). NOT_FOUND when it is not waiting;
  // FAILED_PRECONDITION when it runs (Release it once its processes have ended).
  absl::Status Remove(const std::string& id);

  // The jobs that start now, in queue order, and their devices, which stay taken until Release.
  std::vector<Grant> Schedule();

  // Frees a running job's devices (it ended). NOT_FOUND when it is not running.
  absl::Status Release(const std::string& id);

  // 1 for the next job to start, 2 for the one after it, ...; 0 when `id` is not waiting.
  int Position(const std::string& id) const;

  // Marks a job as running on `gpu_ordinals` without queueing it (one that was started outside
  // Schedule). INVALID_ARGUMENT when the ordinals do not match the ask or are out of range;
  // FAILED_PRECONDITION when one is taken or the CPU workers do not fit; ALREADY_EXISTS for a known id.
  absl::Status Restore(const std::string& id, const control::Devices& ask, const std::vector<int>& gpu_ordinals);

  int free_gpus() const;
  int free_cpu_workers() const { return cpu_workers_ - cpu_in_use_; }
  int waiting() const { return static_cast<int>(waiting_.size()); }
  int running() const { return static_cast<int>(running_.size()); }

 private:
  struct Waiting {
    std::string id;
    control::Devices ask;
  };
  struct Running {
    int cpu_workers = 0;
    std::vector<int> gpu_ordinals;
  };

  bool Known(const std::string& id) const;
  bool Fits(const control::Devices& ask) const;
  Grant Take(const Waiting& job);

  const int gpus_;
  const int cpu_workers_;
  std::deque<Waiting> waiting_;
  absl::flat_hash_map<std::string, Running> running_;
  std::vector<bool> gpu_busy_;
  int cpu_in_use_ = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SERVE_JOB_QUEUE_H_
