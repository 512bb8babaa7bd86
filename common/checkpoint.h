// Checkpoints on disk, without LibTorch: <run_dir>/checkpoints/step_<N>/ holds one shard per rank
// (safetensors, written by the worker) and MANIFEST, written last, naming every shard with its size
// and SHA-256. Every file goes under a temporary name, is fsync'd and renamed, and the directory is
// fsync'd, so a crash leaves a checkpoint whole or without its manifest; one without is never loaded.
#ifndef STAGEHAND_COMMON_CHECKPOINT_H_
#define STAGEHAND_COMMON_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/crypto.h"
#include "common/fd.h"
#include "protos/checkpoint.pb.h"

namespace stagehand {

inline constexpr char kManifestName[] = "MANIFEST";

std::string CheckpointsDir(const std::string& run_dir);               // <run_dir>/checkpoints
std::string CheckpointDir(const std::string& run_dir, int64_t step);  // .../step_00000012
std::string ShardName(int rank);                                      // rank0.safetensors

// A file written under `path`.tmp, hashed as it goes, and renamed to `path` on Commit (after fsync;
// the directory is fsync'd too). Destroyed uncommitted, it removes the temporary file.
class DurableFile {
 public:
  static absl::StatusOr<DurableFile> Create(const std::string& path);
  DurableFile(DurableFile&&) = default;
  ~DurableFile();
  absl::Status Append(const void* data, size_t n);
  struct Committed {
    int64_t bytes = 0;
    std::string sha256;
  };
  absl::StatusOr<Committed> Commit();

 private:
  DurableFile(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
  std::unique_ptr<Sha256Stream> sha_ = std::make_unique<Sha256Stream>();
  int64_t bytes_ = 0;
  bool committed_ = false;
};

// Writes `data` to `path` durably (DurableFile).
absl::Status WriteFileDurably(const std::string& path, const std::string& data);

// The manifest, written last (text format).
absl::Status WriteManifest(const std::string& dir, const CheckpointManifest& manifest);
absl::StatusOr<CheckpointManifest> ReadManifest(const std::string& dir);

struct FoundCheckpoint {
  std::string dir;
  CheckpointManifest manifest;
  std::vector<std::string> skipped;  // newer directories that were incomplete (no manifest)
};

// The newest complete checkpoint under `path`: a run directory, its checkpoints/ directory, or one
// checkpoint's directory. A directory without a manifest is skipped (a write that was cut short);
// one whose manifest names a missing shard or one of another size is DATA_LOSS naming the file.
// NOT_FOUND when there is none.
absl::StatusOr<FoundCheckpoint> NewestCheckpoint(const std::string& path);

// Reads the shard whole and compares its size and SHA-256 with the manifest's: DATA_LOSS naming the
// file ("refusing a corrupt checkpoint") when they differ.
absl::Status VerifyShard(const std::string& dir, const CheckpointShard& shard);

// Removes all but the newest `keep` complete checkpoints of the run, and incomplete ones older than
// the newest complete one (they can never complete).
absl::Status PruneCheckpoints(const std::string& run_dir, int keep);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_CHECKPOINT_H_
