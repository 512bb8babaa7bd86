// Exported weights (--export_dir, --init_from) without LibTorch: the names, shapes and config.json of
// an export of a built-in family, and the reading and checking of an export directory. Llama's is
// Hugging Face's LlamaForCausalLM layout; GPT's is the layout tools/peer/gpt_peer.py loads
// (docs/export.md). Both: safetensors of fp32 tensors, model.safetensors from one rank or HF's sharded
// form (model-0000r-of-0000n.safetensors and model.safetensors.index.json) from several.
#ifndef STAGEHAND_MODELS_EXPORT_LAYOUT_H_
#define STAGEHAND_MODELS_EXPORT_LAYOUT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/safetensors.h"
#include "protos/job.pb.h"

namespace stagehand {

inline constexpr char kExportConfig[] = "config.json";
inline constexpr char kExportSingleFile[] = "model.safetensors";
inline constexpr char kExportIndex[] = "model.safetensors.index.json";

// The file rank `rank` of `ranks` writes: model.safetensors alone, else HF's shard names.
std::string ExportShardName(int rank, int ranks);

// The exported name of a parameter that a stage names `internal` (Stage::NamedParameters): Llama's
// are HF's already; GPT's "layers.3.fc1.weight" is "blocks.1.fc1.weight". Families other than gpt
// and llama: the name as it is.
std::string ExportName(const ModelSpec& spec, const std::string& internal);

struct ExportTensor {
  std::string name;
  std::vector<int64_t> shape;
};
// Every tensor an export of this (resolved) spec holds, in model order; NOT_FOUND for a family
// other than gpt and llama (a user's family: its worker checks what it loads).
absl::StatusOr<std::vector<ExportTensor>> ExportedTensors(const ModelSpec& spec);

// config.json for a resolved spec of preset `model`.
std::string ExportConfigJson(const std::string& model, const ModelSpec& spec);

// An export directory read: its tensors by name, each with the file that holds it.
struct ExportDirectory {
  std::string dir;
  std::string config_json;
  std::vector<std::string> files;                                // the safetensors files, in order
  std::vector<SafetensorsHeader> headers;                        // headers[i] is files[i]'s
  std::map<std::string, std::pair<int, int>> where;              // name -> (file index, index in its header)
  const SafetensorsEntry& Entry(const std::string& name) const;  // one that `where` has
};
// Reads config.json, the index (or model.safetensors) and every file's header. INVALID_ARGUMENT with
// one line naming the file when something is missing or not what it should be (a file cut short, a
// header that does not parse, a tensor the index puts in another file).
absl::StatusOr<ExportDirectory> ReadExportDirectory(const std::string& dir);

// config.json against the job's model (family and every size), then every tensor against
// ExportedTensors: INVALID_ARGUMENT with one line naming the tensor or field, its file and what to
// change. For a family without ExportedTensors only the config's sizes are checked.
absl::Status CheckExportMatches(const ExportDirectory& e, const ModelSpec& spec);

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_EXPORT_LAYOUT_H_
