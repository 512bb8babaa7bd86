// What the launcher and the worker know of a model family without LibTorch: presets, validation of
// sizes, the pipeline layers and their kinds, analytic costs and memory, FLOPs. The launcher plans and
// checks jobs with it before any worker starts; a worker's ModelFamily (models/model_family.h) pairs
// it with the LibTorch code that builds stages.
#ifndef STAGEHAND_MODELS_MODEL_DESCRIPTION_H_
#define STAGEHAND_MODELS_MODEL_DESCRIPTION_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protos/job.pb.h"

namespace stagehand {

class ModelDescription {
 public:
  virtual ~ModelDescription() = default;

  virtual std::string family() const = 0;                // "gpt"
  virtual std::vector<std::string> presets() const = 0;  // "tiny", "gpt-1.3b"

  // `overrides` with every unset (zero) size taken from `preset` ("" or the family's name: its default
  // preset), checked: INVALID_ARGUMENT saying what to change. The result has family and preset set.
  virtual absl::StatusOr<ModelSpec> Resolve(const std::string& preset, const ModelSpec& overrides) const = 0;

  // The pipeline layers a partition cuts between, in order, and their kinds: layers of one kind have
  // the same shapes and cost (a worker profiles one of each).
  virtual int NumLayers(const ModelSpec& spec) const = 0;
  virtual int NumLayerKinds() const = 0;
  virtual int LayerKind(const ModelSpec& spec, int layer) const = 0;
  virtual std::string LayerKindName(int kind) const = 0;
  // The layers in words, for messages: "the embedding, 24 blocks of two halves, the head".
  virtual std::string DescribeLayers(const ModelSpec& spec) const = 0;

  // Analytic costs per pipeline layer at `micro_batch` sequences: time proportional to FLOPs at an
  // assumed rate, memory from the shapes. For the memory check before spawning and as the plan when no
  // worker profiled.
  virtual LayerProfile Estimate(const ModelSpec& spec, int64_t micro_batch) const = 0;

  // Model FLOPs of one training step over `sequences` (forward and backward; a third for inference),
  // the way the field counts them (matmuls and attention).
  virtual double FlopsPerStep(const ModelSpec& spec, int64_t sequences, bool inference) const = 0;

  virtual int64_t ParameterCount(const ModelSpec& spec) const = 0;
};

// The one job that runs no model: a checked all-reduce per step (the transport's own test).
inline constexpr char kAllReduceModel[] = "allreduce";
// A program job (JobSpec.program, the user's own program as the workers) is neither.
inline bool IsModelJob(const JobSpec& job) { return job.program_size() == 0 && job.model() != kAllReduceModel; }

// Sequences per micro-batch: global_batch over the replicas' micro-batches.
inline int64_t MicroBatchSize(const JobSpec& job) {
  const int m = job.pipeline().micro_batches();
  const int d = job.data_parallel();
  return job.pipeline().global_batch() / ((m > 0 ? m : 1) * (d > 0 ? d : 1));
}

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_MODEL_DESCRIPTION_H_
