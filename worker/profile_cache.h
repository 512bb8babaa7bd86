// The layer profile a worker registers with, cached on disk per (model, sizes, micro-batch, GPU name),
// and the rule for when a job needs one at all. No LibTorch: the measuring is pipeline.h's ProfileModel.
#ifndef STAGEHAND_WORKER_PROFILE_CACHE_H_
#define STAGEHAND_WORKER_PROFILE_CACHE_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "protos/job.pb.h"

namespace stagehand {

// Whether the planner has a partition to choose for `job`: --partition=auto over more than one
// (virtual) stage, or a schedule file. A one-stage job of gpipe, 1f1b or forward has none, and then
// registers without profiling unless job.profile_single_stage().
bool ProfileChoosesPartition(const JobSpec& job);

// What a cached profile must match: the model and all its sizes and options, the micro-batch, the
// device's name and memory, and the version of the profile's method. One line of text.
std::string ProfileCacheKey(const JobSpec& job, const DeviceInfo& device);

// $XDG_CACHE_HOME/stagehand/profiles, else $HOME/.cache/stagehand/profiles; "" when neither is set.
std::string DefaultProfileCacheDir();

// The profile stored under `key` in `dir`, or nullopt (none, unreadable, or another key in the file).
std::optional<LayerProfile> ReadCachedProfile(const std::string& dir, const std::string& key);

// Stores `profile` under `key` (the directory made if need be; written to a temporary file and renamed,
// so a concurrent reader sees the old file or the new one). An error says what failed; the job goes on.
absl::Status WriteCachedProfile(const std::string& dir, const std::string& key, const LayerProfile& profile);

// This GPU's SM clock under load in its last run of a job with the same `key` (the clock-aware
// partition's speed for a rank whose profile came from the cache, measured on another GPU or at
// another time), kept beside the profiles, one small file per (key, GPU uuid). nullopt: none.
std::optional<LoadClock> ReadGpuClock(const std::string& dir, const std::string& key, const std::string& uuid);
absl::Status WriteGpuClock(const std::string& dir, const std::string& key, const std::string& uuid,
                           const LoadClock& clock);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_PROFILE_CACHE_H_
