// safetensors (Hugging Face's tensor file format), written and read directly, without LibTorch: an
// 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and byte range,
// then the raw little-endian tensor bytes. Checkpoint shards and exports (--export_dir) use it.
#ifndef STAGEHAND_COMMON_SAFETENSORS_H_
#define STAGEHAND_COMMON_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace stagehand {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", "F64", "I64", "I32", "U8", ...
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte range in the data section (after the header)
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;        // in data order
  std::map<std::string, std::string> metadata;  // "__metadata__": strings only, as the format says
  int64_t data_start = 0;                       // file offset of the data section
  const SafetensorsEntry* Find(const std::string& name) const;
};

// Bytes per element of a safetensors dtype; 0 for one we do not know.
int64_t SafetensorsDtypeBytes(const std::string& dtype);

// Lays `tensors` out back to back in the given order (fills begin/end from dtype and shape) and
// returns the file's first bytes: the length and the JSON, padded with spaces to 8-byte alignment.
// The tensors' bytes follow, in that order.
std::string SafetensorsPrefix(std::vector<SafetensorsEntry>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Parses the file's prefix: `prefix` holds at least the 8-byte length and the header.
// INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsPrefix(const std::string& prefix, int64_t file_size);

// Reads and checks the header of the file at `path` (byte ranges inside the file, contiguous,
// sizes matching shapes). DATA_LOSS naming the path when it is not a safetensors file.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::string& path);

// Reads one tensor's bytes into `out` (entry.end - entry.begin bytes).
absl::Status ReadSafetensorsData(const std::string& path, const SafetensorsHeader& header,
                                 const SafetensorsEntry& entry, void* out);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_SAFETENSORS_H_
