// A model family as a worker runs it: its description (models/model_description.h: layers, presets,
// estimates) and the code that builds its stages. A worker binary registers the families it links
// before calling WorkerMain (worker_main.h); stagehand's own worker registers GPT and Llama.
#ifndef STAGEHAND_MODELS_MODEL_FAMILY_H_
#define STAGEHAND_MODELS_MODEL_FAMILY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_description.h"
#include "protos/job.pb.h"

namespace stagehand {

class Stage;
struct StageOptions;

// One kind of scaled-dot-product attention call a family's stages make on a GPU, for building cuDNN's
// kernels for it ahead of step 0 (worker/attention_prebuild.h). q is [B, heads, seq, head_dim], k and v
// [B, kv_heads, seq, head_dim], bf16, each a transposed view of [B, seq, heads, head_dim] memory, or
// with packed_qkv of one [B, seq, 3, heads, head_dim] tensor (GPT's split of its qkv projection).
struct AttentionCall {
  int64_t heads = 0, kv_heads = 0, head_dim = 0, seq = 0;
  bool causal = true;
  bool packed_qkv = false;
  bool operator==(const AttentionCall& o) const {
    return heads == o.heads && kv_heads == o.kv_heads && head_dim == o.head_dim && seq == o.seq && causal == o.causal &&
           packed_qkv == o.packed_qkv;
  }
};

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual const ModelDescription& description() const = 0;
  // Process-wide setup before any stage is built (LibTorch's attention kernel choice is global).
  virtual absl::Status Prepare(const JobSpec& job) const { return absl::OkStatus(); }
  // Layers [options.first_layer, options.last_layer) on options.device. Errors are INVALID_ARGUMENT
  // (sizes this family cannot build) or INTERNAL.
  virtual absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageOptions& options) const = 0;
  // The kinds of at::scaled_dot_product_attention call a job's stages make, for `job` with its model's
  // sizes resolved; none by default. The worker builds cuDNN's kernels for them ahead of step 0 where
  // the job runs cuDNN's attention (worker/attention_prebuild.h: not for another --attention, fp32).
  virtual std::vector<AttentionCall> AttentionCalls(const JobSpec& job) const { return {}; }
};

// Adds a family; ALREADY_EXISTS when its name or one of its presets is taken. Not thread-safe: call
// from main before WorkerMain.
absl::Status RegisterModelFamily(std::unique_ptr<ModelFamily> family);
// The family with `model` as its name or one of its presets; null if none is registered.
const ModelFamily* FindModelFamily(const std::string& model);
// Names of the registered families, for messages.
std::vector<std::string> RegisteredFamilies();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_MODEL_FAMILY_H_
