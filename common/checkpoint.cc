// Checkpoints on disk (see checkpoint.h).
#include "common/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/input_file.h"
#include "google/protobuf/text_format.h"

namespace stagehand {
namespace {

std::string Parent(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

absl::Status SyncDir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || fsync(fd.get()) != 0) {
    return absl::InternalError(absl::StrCat("fsync of ", dir, ": ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Step numbers of the step_<N> directories under `dir`, newest first.
std::vector<int64_t> Steps(const std::string& dir) {
  std::vector<int64_t> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    int64_t step;
    if (absl::ConsumePrefix(&name, "step_") && absl::SimpleAtoi(name, &step) && step >= 0) out.push_back(step);
  }
  closedir(d);
  std::sort(out.rbegin(), out.rend());
  return out;
}

absl::Status RemoveTree(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::InternalError(absl::StrCat("removing ", dir, ": ", ErrnoText(errno)));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  // The manifest first: a checkpoint half removed must read as incomplete, never as whole.
  std::stable_partition(names.begin(), names.end(), [](const std::string& n) { return n == kManifestName; });
  for (const std::string& n : names) {
    if (unlink((dir + "/" + n).c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("removing ", dir, "/", n, ": ", ErrnoText(errno)));
    }
  }
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT)
    return absl::InternalError(absl::StrCat("removing ", dir, ": ", ErrnoText(errno)));
  return absl::OkStatus();
}

// The checkpoints directory `path` names (see NewestCheckpoint), or "" when `path` is one checkpoint.
std::string ListingDir(const std::string& path) {
  if (IsDir(path + "/checkpoints")) return path + "/checkpoints";
  if (access((path + "/" + kManifestName).c_str(), F_OK) == 0) return "";
  const std::string base = path.substr(path.rfind('/') + 1);
  if (absl::StartsWith(base, "step_")) return "";
  return path;
}

absl::Status CheckShardsPresent(const std::string& dir, const CheckpointManifest& m) {
  for (const CheckpointShard& s : m.shards()) {
    struct stat st;
    const std::string p = dir + "/" + s.file();
    if (stat(p.c_str(), &st) != 0) {
      return absl::DataLossError(absl::StrCat("checkpoint shard ", p, " is missing (", ErrnoText(errno),
                                              "); refusing the checkpoint: remove ", dir,
                                              " to resume from an older one"));
    }
    if (st.st_size != s.bytes()) {
      return absl::DataLossError(
          absl::StrCat("checkpoint shard ", p, " has ", st.st_size, " bytes but its manifest says ", s.bytes(),
                       "; refusing the corrupt checkpoint: remove ", dir, " to resume from an older one"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointsDir(const std::string& run_dir) { return run_dir + "/checkpoints"; }
std::string CheckpointDir(const std::string& run_dir, int64_t step) {
  return absl::StrFormat("%s/step_%08d", CheckpointsDir(run_dir), step);
}
std::string ShardName(int rank) { return absl::StrCat("rank", rank, ".safetensors"); }

absl::StatusOr<DurableFile> DurableFile::Create(const std::string& path) {
  UniqueFd fd(::open((path + ".tmp").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("creating ", path, ".tmp: ", ErrnoText(errno)));
  return DurableFile(path, std::move(fd));
}

DurableFile::~DurableFile() {
  if (fd_.valid() && !committed_) unlink((path_ + ".tmp").c_str());
}

absl::Status DurableFile::Append(const void* data, size_t n) {
  sha_->Update(data, n);
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_.get(), p, std::min<size_t>(n, size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return absl::InternalError(absl::StrCat("writing ", path_, ".tmp: ", ErrnoText(errno)));
    p += w;
    n -= static_cast<size_t>(w);
    bytes_ += w;
  }
  return absl::OkStatus();
}

absl::StatusOr<DurableFile::Committed> DurableFile::Commit() {
  if (fsync(fd_.get()) != 0) return absl::InternalError(absl::StrCat("fsync of ", path_, ".tmp: ", ErrnoText(errno)));
  fd_.reset();
  if (rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("renaming ", path_, ".tmp: ", ErrnoText(errno)));
  }
  committed_ = true;
  if (absl::Status s = SyncDir(Parent(path_)); !s.ok()) return s;
  return Committed{bytes_, HexDigest(sha_->Final())};
}

absl::Status WriteFileDurably(const std::string& path, const std::string& data) {
  absl::StatusOr<DurableFile> f = DurableFile::Create(path);
  if (!f.ok()) return f.status();
  if (absl::Status s = f->Append(data.data(), data.size()); !s.ok()) return s;
  return f->Commit().status();
}

absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(manifest, &text);
  return WriteFileDurably(absl::StrCat(dir, "/", kManifestName), text);
}

absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestName);
  // A regular file only: a FIFO in its place must not hang the launcher (common/input_file.h).
  absl::StatusOr<std::string> text = ReadRegularFile(path, path, int64_t{64} << 20);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) return text.status();
    return absl::DataLossError(
        absl::StrCat(text.status().message(), "; remove ", dir, " to resume from an older checkpoint"));
  }
  CheckpointManifest m;
  if (!google::protobuf::TextFormat::ParseFromString(*text, &m) || m.format() != 1 || m.shards_size() == 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a checkpoint manifest of format 1; remove ", dir,
                                            " to resume from an older checkpoint"));
  }
  return m;
}

absl::StatusOr<FoundCheckpoint> NewestCheckpoint(const std::string& path) {
  FoundCheckpoint found;
  const std::string listing = ListingDir(path);
  if (listing.empty()) {
    absl::StatusOr<CheckpointManifest> m = ReadManifest(path);
    if (!m.ok()) return m.status();
    if (absl::Status s = CheckShardsPresent(path, *m); !s.ok()) return s;
    found.dir = path;
    found.manifest = *std::move(m);
    return found;
  }
  for (int64_t step : Steps(listing)) {
    const std::string dir = absl::StrFormat("%s/step_%08d", listing, step);
    if (access((dir + "/" + kManifestName).c_str(), F_OK) != 0) {
      found.skipped.push_back(dir);  // cut short before its manifest: never loaded
      continue;
    }
    absl::StatusOr<CheckpointManifest> m = ReadManifest(dir);
    if (!m.ok()) return m.status();
    if (absl::Status s = CheckShardsPresent(dir, *m); !s.ok()) return s;
    found.dir = dir;
    found.manifest = *std::move(m);
    return found;
  }
  return absl::NotFoundError(
      absl::StrCat("no complete checkpoint under ", listing,
                   found.skipped.empty() ? "" : absl::StrCat(" (", found.skipped.size(), " without a manifest)")));
}

absl::Status VerifyShard(const std::string& dir, const CheckpointShard& shard) {
  const std::string path = dir + "/" + shard.file();
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, absl::StrCat("checkpoint shard ", path));
  if (!file.ok()) return absl::DataLossError(file.status().message());
  UniqueFd fd = std::move(file->fd);
  Sha256Stream sha;
  std::vector<char> buf(size_t{8} << 20);
  int64_t bytes = 0;
  for (;;) {
    ssize_t n = ::read(fd.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::DataLossError(absl::StrCat("checkpoint shard ", path, ": ", ErrnoText(errno)));
    if (n == 0) break;
    sha.Update(buf.data(), static_cast<size_t>(n));
    bytes += n;
  }
  if (bytes != shard.bytes() || HexDigest(sha.Final()) != shard.sha256()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint shard ", path, " does not match its manifest (", bytes != shard.bytes() ? "size" : "SHA-256",
        "): refusing the corrupt checkpoint; remove ", dir, " to resume from an older one"));
  }
  return absl::OkStatus();
}

absl::Status PruneCheckpoints(const std::string& run_dir, int keep) {
  const std::string listing = CheckpointsDir(run_dir);
  int complete = 0;
  for (int64_t step : Steps(listing)) {
    const std::string dir = absl::StrFormat("%s/step_%08d", listing, step);
    const bool whole = access((dir + "/" + kManifestName).c_str(), F_OK) == 0;
    if (whole && ++complete <= keep) continue;
    if (!whole && complete == 0) continue;  // newer than every complete one: may still be being written
    if (absl::Status s = RemoveTree(dir); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace stagehand
