// The device queue (see job_queue.h).
#include "launcher/serve/job_queue.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

std::string Count(int n, const char* one, const char* many) { return absl::StrCat(n, " ", n == 1 ? one : many); }

}  // namespace

DeviceQueue::DeviceQueue(int gpus, int cpu_workers)
    : gpus_(std::max(gpus, 0)), cpu_workers_(std::max(cpu_workers, 0)), gpu_busy_(gpus_, false) {}

absl::Status DeviceQueue::CanEverFit(const control::Devices& ask) const {
  if (ask.gpus() < 0 || ask.cpu_workers() < 0) {
    return absl::InvalidArgumentError(absl::StrCat("asks for ", ask.gpus(), " GPUs and ", ask.cpu_workers(),
                                                   " CPU workers; pass a positive --workers"));
  }
  if (ask.gpus() == 0 && ask.cpu_workers() == 0) {
    return absl::InvalidArgumentError("asks for no workers; pass --workers=1 or more");
  }
  const std::string gpus = Count(ask.gpus(), "GPU", "GPUs");
  if (ask.gpus() > gpus_ && gpus_ == 0) {
    return absl::InvalidArgumentError(absl::StrCat("asks for ", gpus, " but this server has none; pass --device=cpu"));
  }
  if (ask.gpus() > gpus_) {
    return absl::InvalidArgumentError(
        absl::StrCat("asks for ", gpus, " but this server has ", gpus_, "; pass --gpus=", gpus_, " or fewer"));
  }
  const std::string cpus = Count(ask.cpu_workers(), "CPU worker", "CPU workers");
  if (ask.cpu_workers() > cpu_workers_ && cpu_workers_ == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("asks for ", cpus,
                     " but this server runs none (--max_cpu_workers=0); pass --device=cuda or use another server"));
  }
  if (ask.cpu_workers() > cpu_workers_) {
    return absl::InvalidArgumentError(absl::StrCat("asks for ", cpus, " but this server runs at most ", cpu_workers_,
                                                   " at once (--max_cpu_workers); pass --workers=", cpu_workers_,
                                                   " or fewer"));
  }
  return absl::OkStatus();
}

bool DeviceQueue::Known(const std::string& id) const {
  if (running_.contains(id)) return true;
  return std::any_of(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == id; });
}

absl::Status DeviceQueue::Enqueue(const std::string& id, const control::Devices& ask) {
  if (absl::Status s = CanEverFit(ask); !s.ok()) return s;
  if (Known(id)) return absl::AlreadyExistsError(absl::StrCat("job ", id, " is already queued or running"));
  control::Devices counts;  // ordinals are ours to give
  counts.set_gpus(ask.gpus());
  counts.set_cpu_workers(ask.cpu_workers());
  waiting_.push_back({id, std::move(counts)});
  return absl::OkStatus();
}

absl::Status DeviceQueue::Remove(const std::string& id) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(), [&](const Waiting& w) { return w.id == id; });
  if (it != waiting_.end()) {
    waiting_.erase(it);
    return absl::OkStatus();
  }
  if (running_.contains(id)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " is running, not waiting; Release it once it ends"));
  }
  return absl::NotFoundError(absl::StrCat("job ", id, " is not in the queue"));
}

int DeviceQueue::free_gpus() const { return static_cast<int>(std::count(gpu_busy_.begin(), gpu_busy_.end(), false)); }

bool DeviceQueue::Fits(const control::Devices& ask) const {
  return ask.gpus() <= free_gpus() && ask.cpu_workers() <= free_cpu_workers();
}

// Lowest free ordinals first, so that a lone job always runs on GPU 0 (what a foreground run uses).
Grant DeviceQueue::Take(const Waiting& job) {
  Grant grant{job.id, {}};
  for (int g = 0; g < gpus_ && static_cast<int>(grant.gpu_ordinals.size()) < job.ask.gpus(); ++g) {
    if (gpu_busy_[g]) continue;
    gpu_busy_[g] = true;
    grant.gpu_ordinals.push_back(g);
  }
  cpu_in_use_ += job.ask.cpu_workers();
  running_[job.id] = Running{job.ask.cpu_workers(), grant.gpu_ordinals};
  return grant;
}

std::vector<Grant> DeviceQueue::Schedule() {
  std::vector<Grant> grants;
  while (!waiting_.empty() && Fits(waiting_.front().ask)) {
    grants.push_back(Take(waiting_.front()));
    waiting_.pop_front();
  }
  return grants;
}

absl::Status DeviceQueue::Release(const std::string& id) {
  auto it = running_.find(id);
  if (it == running_.end()) return absl::NotFoundError(absl::StrCat("job ", id, " is not running"));
  for (int g : it->second.gpu_ordinals) gpu_busy_[g] = false;
  cpu_in_use_ -= it->second.cpu_workers;
  running_.erase(it);
  return absl::OkStatus();
}

int DeviceQueue::Position(const std::string& id) const {
  for (size_t i = 0; i < waiting_.size(); ++i) {
    if (waiting_[i].id == id) return static_cast<int>(i) + 1;
  }
  return 0;
}

absl::Status DeviceQueue::Restore(const std::string& id, const control::Devices& ask,
                                  const std::vector<int>& gpu_ordinals) {
  if (Known(id)) return absl::AlreadyExistsError(absl::StrCat("job ", id, " is already queued or running"));
  if (static_cast<int>(gpu_ordinals.size()) != ask.gpus()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job ", id, " asks for ", ask.gpus(), " GPUs but was given ", gpu_ordinals.size()));
  }
  std::vector<int> sorted = gpu_ordinals;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= gpus_ || (i > 0 && sorted[i] == sorted[i - 1])) {
      return absl::InvalidArgumentError(
          absl::StrCat("job ", id, ": GPU ordinal ", sorted[i], " is repeated or not among this server's ", gpus_));
    }
    if (gpu_busy_[sorted[i]]) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, ": GPU ", sorted[i], " is taken by another job"));
    }
  }
  if (ask.cpu_workers() > free_cpu_workers()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id, " needs ", ask.cpu_workers(), " CPU workers; ", free_cpu_workers(), " are free"));
  }
  for (int g : sorted) gpu_busy_[g] = true;
  cpu_in_use_ += ask.cpu_workers();
  running_[id] = Running{ask.cpu_workers(), sorted};
  return absl::OkStatus();
}

}  // namespace stagehand
