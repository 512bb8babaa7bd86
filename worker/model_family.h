// A model family as a worker runs it: its description (models/model_description.h: layers, presets,
// estimates) and the code that builds its stages. A worker binary registers the families it links
// before calling WorkerMain (worker_main.h); stagehand's own worker registers GPT and Llama.
#ifndef STAGEHAND_WORKER_MODEL_FAMILY_H_
#define STAGEHAND_WORKER_MODEL_FAMILY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/model_description.h"
#include "protos/job.pb.h"

namespace stagehand {

class Stage;
struct StageOptions;

class ModelFamily {
 public:
  virtual ~ModelFamily() = default;
  virtual const ModelDescription& description() const = 0;
  // Process-wide setup before any stage is built (LibTorch's attention kernel choice is global).
  virtual absl::Status Prepare(const JobSpec& job) const { return absl::OkStatus(); }
  // Layers [options.first_layer, options.last_layer) on options.device. Errors are INVALID_ARGUMENT
  // (sizes this family cannot build) or INTERNAL.
  virtual absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageOptions& options) const = 0;
};

// Adds a family; ALREADY_EXISTS when its name or one of its presets is taken. Not thread-safe: call
// from main before WorkerMain.
absl::Status RegisterModelFamily(std::unique_ptr<ModelFamily> family);
// The family with `model` as its name or one of its presets; null if none is registered.
const ModelFamily* FindModelFamily(const std::string& model);
// Names of the registered families, for messages.
std::vector<std::string> RegisteredFamilies();

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_MODEL_FAMILY_H_
