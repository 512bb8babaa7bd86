// The pipeline engine's view of a model: a Stage holds a contiguous range of a model's pipeline
// layers on one device and knows the tensors it takes and gives. The engine (executor.h) runs stages
// and never a model family; GPT and Llama (models/) implement this interface, and so can a user's own
// model in a worker binary of their own (docs/custom_model.md).
#ifndef STAGEHAND_ENGINE_STAGE_H_
#define STAGEHAND_ENGINE_STAGE_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/model_options.h"
#include "protos/job.pb.h"

namespace stagehand {

// The shape and dtype of a tensor a stage takes or gives, for the engine's receive buffers.
struct TensorSpec {
  std::vector<int64_t> sizes;
  torch::Dtype dtype = torch::kFloat32;
};

// What a family gets to build a stage.
struct StageOptions {
  const JobSpec* job = nullptr;  // resolved: job->model_spec() holds every size
  int first_layer = 0;           // pipeline layers [first_layer, last_layer) of the model
  int last_layer = 0;
  int num_layers = 0;  // the model's pipeline layers in all
  torch::Device device = torch::kCPU;
  uint64_t seed = 0;  // parameters must depend on (seed, layer) only, never on the partition
  // On a CUDA device: draw the parameters there (LayerGenerator(seed, layer, device), other numbers than
  // the CPU's) instead of on the CPU and copying them over. JobSpec.init_on_device; false: the CPU draws.
  bool init_on_device = false;

  bool first() const { return first_layer == 0; }
  bool last() const { return last_layer == num_layers; }
  // Where parameters are made and drawn.
  torch::Device init_device() const { return init_on_device && device.is_cuda() ? device : torch::Device(torch::kCPU); }
};

class Stage {
 public:
  virtual ~Stage() = default;

  // What Forward takes for a micro-batch of `batch` sequences: token ids [batch, seq] int64 on the
  // first stage, else what the previous stage's Output gives.
  virtual TensorSpec Input(int64_t batch) const = 0;
  // What Forward gives. On the last stage: the logits that Loss takes (never sent anywhere).
  virtual TensorSpec Output(int64_t batch) const = 0;

  // Runs the stage's layers. May throw c10::Error (the engine turns it into a Status naming the action).
  virtual torch::Tensor Forward(const torch::Tensor& input) = 0;
  // The last stage's loss: mean over the tokens of `output` against `targets` [batch, seq] int64, an
  // fp32 scalar. The default is the language-model cross-entropy.
  virtual torch::Tensor Loss(const torch::Tensor& output, const torch::Tensor& targets);
  // Accumulates the parameters' gradients of `output` (the loss on the last stage, with an undefined
  // `grad_output`). The default is autograd's.
  virtual void Backward(const torch::Tensor& output, const torch::Tensor& grad_output);
  // The zero-bubble split of Backward (schedule actions I and W), for the same (output, grad_output).
  // BackwardInput gives the gradient w.r.t. `input` (the leaf Forward took; undefined on the first
  // stage, whose input is tokens: it is called there too) and keeps what BackwardWeight needs;
  // BackwardWeight, later, accumulates the rest of the parameters' gradients and releases what was
  // kept. Together they accumulate exactly what Backward does. The defaults are autograd's: the
  // input's gradient with the graph retained (no parameter gradient), then a backward restricted to
  // Parameters(), which computes the stage's inner activation gradients a second time (correct, not
  // cheap). GPT and Llama instead defer only their linear layers' weight GEMMs to W (nn.h's
  // DeferredSplitBackward; --model_option=deferred_wgrad=false runs these defaults).
  virtual torch::Tensor BackwardInput(const torch::Tensor& input, const torch::Tensor& output,
                                      const torch::Tensor& grad_output);
  virtual void BackwardWeight(const torch::Tensor& output, const torch::Tensor& grad_output);

  virtual std::vector<torch::Tensor> Parameters() = 0;
  // By name, for checkpoints and exports: names are the model's, independent of the partition.
  virtual std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() = 0;

  // Inference (eval) or training mode.
  virtual void SetTraining(bool training) {}
  // Brings state derived from the parameters (bf16 weight copies) up to date now: CUDA graphs read it
  // without running the code that refreshes it. Called before capturing and before every replayed step.
  virtual void PrepareForGraphs() {}
};

// Whether a family's split backward defers its weight gradients (DeferredSplitBackward): the model
// option deferred_wgrad, on unless "false".
bool DefersWeightGradients(const JobSpec& job);

// Mean token cross-entropy in fp32. logits [B, S, V], targets [B, S] int64.
torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

// The same loss over bf16 logits on CUDA without an fp32 copy of them (fused_backward_kernels.h): the
// log-sum-exp per token in one pass in the forward, the bf16 gradient in one pass in the backward, where
// LanguageModelLoss upcasts the logits, keeps an fp32 log-softmax for its backward and writes an fp32
// gradient that the cast's backward rounds to bf16 again. The same value (fp32 arithmetic, another
// summation order) and the same gradient up to that rounding. Other inputs (fp32 logits, the CPU): the
// same as LanguageModelLoss.
torch::Tensor FusedLanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_STAGE_H_
