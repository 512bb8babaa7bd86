// A rank's side of checkpoints (the format is common/checkpoint.h): Save copies the executor's
// parameters and AdamW state, by the model's parameter names, to host memory and writes them from a
// thread of its own while training goes on; rank 0 writes the manifest once every rank's shard is on
// disk (they tell it through the coordinator's key-value store). Restore loads, by name, whatever its
// stages need from every shard of a checkpoint, whatever the partition that wrote it.
#ifndef STAGEHAND_WORKER_CHECKPOINT_H_
#define STAGEHAND_WORKER_CHECKPOINT_H_

#include <torch/torch.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "protos/job.pb.h"
#include "transport/transport.h"

namespace stagehand {

struct CheckpointWriterOptions {
  const JobSpec* job = nullptr;  // resolved: run_dir, model, model_spec, keep_checkpoints
  std::string job_id;
  int64_t incarnation = 1;
  int rank = 0;
  int world_size = 1;
  int first_layer = 0, last_layer = 0;
  std::vector<int> layers_per_stage;
  KeyValueStore* kv = nullptr;  // needed when world_size > 1
};

class CheckpointWriter {
 public:
  explicit CheckpointWriter(CheckpointWriterOptions options);
  ~CheckpointWriter();  // waits for the write in flight (a wait for other ranks ends at once)

  // The state after `steps_done` steps: waits for the previous write (and returns its error), copies
  // to host memory (on GPUs: into pinned buffers kept between checkpoints, on the current stream),
  // and hands the copy to the writing thread.
  absl::Status Save(int64_t steps_done, const Executor& executor);
  // Waits for the write in flight; its error.
  absl::Status Finish();

 private:
  struct Snapshot;
  absl::Status Write(const Snapshot& s);
  absl::Status CollectShards(int64_t step, std::vector<std::string>& shards);
  void Join();

  const CheckpointWriterOptions o_;
  std::vector<torch::Tensor> host_;  // reused between checkpoints (pinned on GPUs)
  std::thread thread_;
  absl::Status last_;  // the finished write's result (read after the join)
  std::atomic<bool> cancel_{false};
};

// Loads every parameter of the executor's stages (and with it the optimizer's state, when training)
// from the checkpoint in `dir`, by name, verifying each shard it reads against the manifest, and this
// rank's CPU generator when the checkpoint has one for it. Returns the steps the checkpoint had done.
// FAILED_PRECONDITION naming a parameter the checkpoint lacks or holds in another shape; DATA_LOSS
// naming a corrupt shard.
absl::StatusOr<int64_t> RestoreCheckpoint(const std::string& dir, const Executor& executor, int rank,
                                          bool with_optimizer);

// --export_dir (models/export_layout.h): every rank writes its stages' parameters, fp32, by their
// exported names into <export_dir>.partial-<job>-<incarnation>/ (its shard, durably), tells rank 0
// through the key-value store, and rank 0 writes the index (several ranks) and config.json and renames
// the directory to export_dir: the final name only ever holds a whole export. On an error rank 0
// removes the temporary directory.
absl::Status WriteExport(const CheckpointWriterOptions& options, const Executor& executor);

// --init_from: loads each of `params` (a stage's or executor's names) from the export in `dir` by its
// exported name, converting to the parameter's dtype and device. FAILED_PRECONDITION naming the
// tensor and the directory for one the export lacks or holds in another shape.
absl::Status ImportWeights(const std::string& dir, const ModelSpec& spec,
                           const std::vector<std::pair<std::string, torch::Tensor>>& params);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_CHECKPOINT_H_
