// The pipeline engine: runs one rank's schedule (schedule.h) over its model stage (model.h) and a
// transport. Buffers for received activations and gradients are allocated once; on GPUs, sends and
// receives run on their own stream and order with the compute stream through events, so that the
// host enqueues a whole step without waiting. Also the per-layer profile the planner partitions by.
#ifndef STAGEHAND_WORKER_PIPELINE_H_
#define STAGEHAND_WORKER_PIPELINE_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "protos/job.pb.h"
#include "worker/schedule.h"
#include "worker/transport.h"

namespace stagehand {

struct StepResult {
  int64_t step = 0;
  bool has_loss = false;  // on the rank holding the head
  double loss = 0;        // mean over the step's micro-batches
  double seconds = 0;
  int64_t tokens = 0;     // tokens through the whole pipeline this step
  int64_t peak_memory_bytes = 0;
  StepTiming timing;      // where the step's time went on this rank (actions empty when timing is off)
};

using PipelineStepCallback = std::function<absl::Status(const StepResult&)>;

// Builds the assignment's stage, runs job.steps() steps of its schedule (training, or forward-only for
// inference), reporting each; writes the stage's parameters to the run directory if job.save_params().
// `transport` may be null for a single-stage job.
absl::Status RunPipeline(const Assignment& assignment, Transport* transport, const PipelineStepCallback& on_step);

// The CUDA stream the pipeline communicates on (a cudaStream_t): make the NCCL transport with it.
void* PipelineCommStream();

// Measures each pipeline layer's forward and backward time and memory on this worker's device at the
// job's micro-batch size (identical blocks are measured once).
absl::StatusOr<LayerProfile> ProfileModel(const JobSpec& job);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_PIPELINE_H_
