// The profile cache (see profile_cache.h).
#include "worker/profile_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/cache_dir.h"
#include "google/protobuf/text_format.h"
#include "models/model_description.h"
#include "schedule/schedule.h"

namespace stagehand {
namespace {

// Bumped whenever ProfileModel measures differently, so that old files are not reused.
// v2: the profile carries the SM clock it was measured at (LayerProfile.clock).
constexpr char kMethodVersion[] = "profile-v2";

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ULL;
  return h;
}

std::string PathFor(const std::string& dir, const std::string& key) {
  return absl::StrFormat("%s/%016x.textproto", dir, Fnv1a(key));
}

// mkdir -p.
absl::Status MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string prefix = dir.substr(0, i);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::InternalError(absl::StrCat("mkdir ", prefix, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool ProfileChoosesPartition(const JobSpec& job) {
  const PipelineSpec& p = job.pipeline();
  if (p.partition() != "auto") return false;
  if (!p.schedule_text().empty() || p.stages() != 1) return true;
  absl::StatusOr<Schedule> s = MakeSchedule(p.inference() ? "forward" : p.schedule(), 1, p.micro_batches());
  return !s.ok() || s->num_stages != 1;  // a schedule of virtual stages on one rank still has a choice
}

std::string ProfileCacheKey(const JobSpec& job, const DeviceInfo& device) {
  std::string spec;
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);  // map entries come out sorted by key
  printer.PrintToString(job.model_spec(), &spec);
  return absl::StrCat(kMethodVersion, " model=", job.model(), " micro_batch=", MicroBatchSize(job),
                      " device=", device.name(), " memory=", device.total_bytes(), " spec={", spec, "}");
}

std::string DefaultProfileCacheDir() { return StagehandCacheDir("profiles"); }

namespace {

// The message stored under `key` (the file's first line names it), or nullopt.
template <typename Message>
std::optional<Message> ReadKeyed(const std::string& dir, const std::string& key) {
  if (dir.empty()) return std::nullopt;
  std::ifstream in(PathFor(dir, key));
  if (!in) return std::nullopt;
  std::string first;
  if (!std::getline(in, first) || first != absl::StrCat("# ", key)) return std::nullopt;  // another key's
  std::stringstream rest;
  rest << in.rdbuf();
  Message m;
  if (!google::protobuf::TextFormat::ParseFromString(rest.str(), &m)) return std::nullopt;
  return m;
}

absl::Status WriteKeyed(const std::string& dir, const std::string& key, const google::protobuf::Message& m) {
  if (dir.empty()) return absl::FailedPreconditionError("no cache directory: neither XDG_CACHE_HOME nor HOME is set");
  if (absl::Status s = MakeDirs(dir); !s.ok()) return s;
  std::string text;
  google::protobuf::TextFormat::PrintToString(m, &text);
  const std::string path = PathFor(dir, key);
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << "# " << key << "\n" << text;
    if (!out.flush()) return absl::InternalError(absl::StrCat("writing ", tmp, " failed"));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("rename ", tmp, " to ", path, ": ", error));
  }
  return absl::OkStatus();
}

std::string ClockKey(const std::string& key, const std::string& uuid) { return absl::StrCat(key, " clock gpu=", uuid); }

}  // namespace

std::optional<LayerProfile> ReadCachedProfile(const std::string& dir, const std::string& key) {
  std::optional<LayerProfile> profile = ReadKeyed<LayerProfile>(dir, key);
  if (!profile || profile->layers_size() == 0) return std::nullopt;
  return profile;
}

absl::Status WriteCachedProfile(const std::string& dir, const std::string& key, const LayerProfile& profile) {
  return WriteKeyed(dir, key, profile);
}

std::optional<LoadClock> ReadGpuClock(const std::string& dir, const std::string& key, const std::string& uuid) {
  std::optional<LoadClock> clock = ReadKeyed<LoadClock>(dir, ClockKey(key, uuid));
  if (!clock || clock->samples() <= 0 || !(clock->sm_mhz() > 0)) return std::nullopt;
  return clock;
}

absl::Status WriteGpuClock(const std::string& dir, const std::string& key, const std::string& uuid,
                           const LoadClock& clock) {
  return WriteKeyed(dir, ClockKey(key, uuid), clock);
}

}  // namespace stagehand
