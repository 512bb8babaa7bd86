// The pipeline engine: runs one rank's action list (schedule/schedule.h), exactly as the coordinator
// shipped it, over the rank's stages (engine/stage.h) and a transport. Actions are keyed by (stage,
// chunk, micro-batch); the engine knows no model family and no schedule by name. Receive buffers are
// allocated once from the shapes the stages declare; on GPUs, sends and receives run on their own
// stream and order with the compute stream through events, so that the host enqueues a whole step
// without waiting, and each micro-batch slot's forward and backward can be replayed as CUDA graphs.
#ifndef STAGEHAND_ENGINE_EXECUTOR_H_
#define STAGEHAND_ENGINE_EXECUTOR_H_

#include <ATen/cuda/CUDAGraph.h>
#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/data.h"
#include "engine/stage.h"
#include "engine/step_timer.h"
#include "nn/nn.h"
#include "protos/job.pb.h"
#include "schedule/schedule.h"
#include "transport/transport.h"

namespace stagehand {

struct StepResult {
  int64_t step = 0;
  bool has_loss = false;  // on the rank holding the last stage
  double loss = 0;        // mean over the step's micro-batches
  double seconds = 0;
  int64_t tokens = 0;  // tokens through the whole pipeline this step (all its replicas)
  int64_t peak_memory_bytes = 0;
  StepTiming timing;  // where the step's time went on this rank (actions empty when timing is off)
  // Filled by the pipeline's loop (pipeline.cc), not by Step: an evaluation after this step, and the
  // parameters of this rank's stages.
  bool has_val_loss = false;
  double val_loss = 0;
  int64_t parameters = 0;
};

struct ExecutorOptions {
  int rank = 0;
  Schedule schedule;        // ranks[rank] is this rank's list; the other ranks' lists may be empty
  int64_t micro_batch = 1;  // sequences per micro-batch
  int64_t seq = 1;          // tokens per sequence (the batch's inputs; targets are shifted by one)
  double lr = 1e-4;
  double weight_decay = 0.1;  // AdamW's
  // AdamW in our one-launch kernel that also writes the linear layers' bf16 copies and zeroes the
  // gradients (FusedAdamW; --model_option=fused_optimizer=false: ATen's _fused_adamw_ and separate passes).
  bool fused_optimizer = true;
  double grad_clip = 0;  // > 0: the global gradient norm (every rank's, over the transport) is clipped to it
  bool timing = true;
  bool cuda_graphs = true;  // on GPUs: replay captured graphs from step 1 where the list allows it
  torch::Device device = torch::kCPU;
  // Data parallelism: the step's global batch has replicas x micro-batches x micro_batch sequences;
  // this rank's pipeline runs replica `replica`'s consecutive share of them.
  int replicas = 1;
  int replica = 0;
  // Forward-only lists: the last stage computes the loss on the targets too (a model with weights).
  bool inference_loss = false;
};

// What data parallelism (worker/data_parallel.h) needs of the engine: to hear when a chunk's gradients
// of the step are complete (after its last backward in the list), to run the optimizer step, and to
// make the loss the mean over the replicas.
class ReplicaSync {
 public:
  virtual ~ReplicaSync() = default;
  virtual void GradientsReady(int chunk) = 0;
  // Waits for the reductions and applies `optimizer` (or, sharded, an optimizer of its own).
  virtual absl::Status Step(FusedAdamW& optimizer) = 0;
  virtual absl::StatusOr<double> MeanLoss(const torch::Tensor& loss) = 0;
  // Whether this replica reports the (mean) loss: one of them does.
  virtual bool ReportsLoss() const = 0;
};

// One micro-batch's forward (and for training its backward) through a stage, captured as CUDA graphs
// and replayed for every micro-batch that the list puts in this slot. The graphs read and write only the
// slot's own tensors (and the parameters, their gradients and derived copies, all of fixed address).
struct GraphSlot {
  at::cuda::CUDAGraph forward, backward;
  torch::Tensor input;        // tokens (first stage) or the received input, a leaf
  torch::Tensor targets;      // the last stage's targets (training)
  torch::Tensor output;       // the stage's output, or the micro-batch's loss (training, last stage)
  torch::Tensor grad_output;  // the gradient received for `output` (training, not the last stage)
  torch::Tensor grad_input;   // input.grad after the backward (training, not the first stage)
};

// Captures `stage`'s forward (and backward unless `inference`) for a micro-batch of `batch` sequences
// of `seq` tokens on the current stream, in a memory pool of its own. `first`/`last`: whether the stage takes tokens /
// computes the loss, which is divided by `loss_divisor`. The stage must have been run once eagerly
// (warmed-up kernels, gradients allocated: the graphs accumulate into them in place).
std::unique_ptr<GraphSlot> CaptureSlot(Stage& stage, int64_t batch, int64_t seq, bool first, bool last, bool inference,
                                       int loss_divisor, const torch::Device& device);

class Executor {
 public:
  // `chunks[c]` is the stage this rank holds as its chunk c. `transport` may be null when every
  // neighbour stage is on this rank. `data` gives the tokens to ranks that hold the first or last stage.
  Executor(ExecutorOptions options, std::vector<std::unique_ptr<Stage>> chunks, const TokenSource* data,
           Transport* transport, Streams* streams);
  ~Executor();

  // INVALID_ARGUMENT naming the first action of the list that this engine does not run (before any
  // step), or a list that does not fit the chunks it was given.
  absl::Status Check() const;

  // One step of the list. An error names the rank and the action it came from ("rank 1, 1B3: ...");
  // failed_action() then says which one, for the grid in the log.
  absl::StatusOr<StepResult> Step(int64_t step);
  int failed_action() const { return failed_action_; }

  // Evaluation between steps: `batches` global batches of `val` (batch b is val.Batch(0, b, ...))
  // forward only, without gradients, through the forward part of this rank's list (ForwardPart, the
  // same placement and transfers). Every rank of the pipeline calls it at the same step boundary.
  // The rank holding the last stage gets the mean token loss over the batches (each micro-batch's
  // mean loss, averaged: micro-batches hold equal tokens); the others nullopt.
  absl::StatusOr<std::optional<double>> Evaluate(const TokenSource& val, int batches);

  std::vector<torch::Tensor> Parameters() const;
  // The chunks' parameters by the model's names (independent of the partition), in Parameters() order.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() const;
  // Null for inference. Its parameter i is Parameters()[i].
  FusedAdamW* optimizer() const { return optimizer_.get(); }
  // The learning rate of the steps from now on (the schedule's, set before each step).
  void SetLearningRate(double lr) {
    if (optimizer_) optimizer_->set_lr(lr);
  }
  // The parameters of this rank's chunk `chunk` (the stage chunk_stages()[chunk]).
  std::vector<torch::Tensor> Parameters(int chunk) const;
  const std::vector<int>& chunk_stages() const { return chunk_stage_; }
  // Each chunk's parameters (in the order Parameters() lists them).
  std::vector<std::vector<torch::Tensor>> ChunkParameters() const;
  // Data parallelism's hooks (null: none); it must outlive the executor's steps.
  void SetReplicaSync(ReplicaSync* sync) { sync_ = sync; }

 private:
  struct Slot;  // per (chunk, micro-batch) state within a step
  absl::Status Run(size_t& i);
  absl::Status Compute(const Action& a);
  absl::Status Communicate(const std::vector<Action>& group);
  absl::Status ClipGradients();
  void NotifyGradients(size_t from, size_t to);
  void Forward(const Action& a);
  void Backward(const Action& a);  // B, or the split's I and W
  void AddInferenceLoss(Stage& stage, const torch::Tensor& logits, int mb);
  void Capture();
  torch::Tensor Tokens(int mb, bool targets);
  void LoadBatch(const TokenSource& from, int64_t step, int64_t index, bool targets);
  torch::Tensor FetchBatch(const TokenSource& from, int64_t step, int64_t index) const;
  void PrefetchBatch(const TokenSource& from, int64_t step, int64_t index);
  Slot& At(int chunk, int mb);
  bool First(int chunk) const;
  bool Last(int chunk) const;

  const ExecutorOptions o_;
  const std::vector<Action>& actions_;
  const std::vector<Action> eval_actions_;  // ForwardPart of the list
  const std::vector<Action>* running_;      // actions_, or eval_actions_ while evaluating
  bool evaluating_ = false;
  std::vector<std::unique_ptr<Stage>> chunks_;
  std::vector<int> chunk_stage_;  // chunk -> virtual stage
  const TokenSource* data_;
  Transport* transport_;
  Streams* streams_;
  const int m_;
  const bool training_;
  int64_t step_ = 0;
  int64_t steps_run_ = 0;  // by this executor: a resumed run's first step is eager too
  std::unique_ptr<FusedAdamW> optimizer_;
  std::vector<Slot> slots_;  // [chunk * m + mb]
  torch::Tensor loss_sum_;
  torch::Tensor batch_;  // the step's global batch of tokens, on the device
  // The next step's batch, fetched while the GPU still ran this step's kernels (PrefetchBatch), and
  // which (source, step, index) it is.
  torch::Tensor next_batch_;
  const TokenSource* next_from_ = nullptr;
  int64_t next_step_ = -1, next_index_ = -1;
  StepTimer timer_;
  bool graphs_ = false;  // CUDA graphs wanted; captured at the start of step 1 (step 0 warms up)
  bool captured_ = false;
  std::vector<std::unique_ptr<GraphSlot>> graph_slots_;
  std::vector<int> graph_slot_of_;  // micro-batch -> graph slot (one chunk per rank)
  int failed_action_ = -1;
  ReplicaSync* sync_ = nullptr;
  std::vector<int> last_backward_;  // per chunk: where its gradients are complete (NotifyGradients)
};

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_EXECUTOR_H_
