// A pipeline rank's run: builds the rank's stages through the job's model family (model_family.h),
// runs the action list the coordinator shipped in the Assignment with the executor (executor.h), and
// reports every step. Also the per-layer profile a worker measures before it registers, which the
// coordinator's planner partitions by.
#ifndef STAGEHAND_WORKER_PIPELINE_H_
#define STAGEHAND_WORKER_PIPELINE_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "protos/job.pb.h"
#include "transport/transport.h"
#include "worker/attention_prebuild.h"

namespace stagehand {

// What the coordinator answered a step's report: 0, or the step count after which every rank writes
// a checkpoint and ends its run (the launcher got SIGTERM; ReportStepResponse).
struct StepAnswer {
  int64_t checkpoint_and_stop_at = 0;
};
using PipelineStepCallback = std::function<absl::StatusOr<StepAnswer>(const StepResult&)>;

// The payload of a RunPipeline error that failed at an action: the action's index in the rank's list,
// in decimal. The worker reports it to the coordinator, which prints the grid.
inline constexpr char kFailedActionPayload[] = "stagehand.failed_action";

// Runs job.steps() steps of the assignment's schedule (training, or forward-only for inference),
// reporting each; writes the stages' parameters to the run directory if job.save_params(). `transport`
// may be null when the rank has no neighbour on another rank. On a failure inside a step, logs the
// rank-by-step grid with the failing action marked, and returns the error naming it.
// What a rank's run needs of its worker beyond the assignment: the coordinator's key-value store (rank 0
// learns there that the other ranks' checkpoint shards are written) and the worker's incarnation (a
// restarted one, above 1, continues from the run's newest complete checkpoint).
struct PipelineContext {
  KeyValueStore* kv = nullptr;
  int64_t incarnation = 1;
  // Called once, after the stages are built and before the first step (the worker finishes its
  // AttentionPrebuild there: before step 0's CUDA-graph captures).
  std::function<void()> before_first_step;
  // This host's run directory, where --save_params goes, when it is not the job's (job.run_dir(),
  // node 0's, which holds the checkpoints): a worker of an agent on another host. "": the job's.
  std::string local_dir;
};

// Runs job.steps() steps of the assignment's schedule (from the checkpoint's step when resuming),
// writing checkpoints every job.checkpoint_every() steps and at the end; with job.val_fraction(),
// evaluates job.eval_batches() held-out batches every job.eval_every() steps and at the end (the
// loss goes with that step's report). When a step's answer asks for it, writes a checkpoint after
// that many steps and returns OK there, short of job.steps().
absl::Status RunPipeline(const Assignment& assignment, Transport* transport, const PipelineStepCallback& on_step,
                         const PipelineContext& context = {});

// cuDNN's attention kernels for the job's model, built on threads of their own from now on
// (attention_prebuild.h); null where the job has prebuild_attention false, is not a model job on a GPU,
// does not run cuDNN's attention (--attention=flash or torch, fp32), or its family makes no such call.
std::unique_ptr<AttentionPrebuild> StartAttentionPrebuild(const JobSpec& job);

// The CUDA stream the pipeline communicates on (a cudaStream_t): make the NCCL transport with it.
void* PipelineCommStream();

// The model's pipeline layer count from its family's description, with zero costs: what a worker
// reports when it does not profile (the coordinator learns a user family's layers from it).
absl::StatusOr<LayerProfile> DescribeLayers(const JobSpec& job);

// Measures each pipeline layer's forward and backward time and memory on this worker's device at the
// job's micro-batch size (layers of one kind are measured once).
absl::StatusOr<LayerProfile> ProfileModel(const JobSpec& job);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_PIPELINE_H_
