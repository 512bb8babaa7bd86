// The Stage interface's defaults (see stage.h). LibTorch translation unit.
#include "worker/stage.h"

namespace stagehand {

namespace F = torch::nn::functional;

torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // (log_softmax's half_to_float would skip the fp32 copy of the logits, but torch 2.11's CUDA kernel
  // takes it for fp16 only: "conversion is supported for Half type only" for bf16.)
  return F::cross_entropy(logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
                          targets.to(logits.device()).reshape({-1}));
}

bool DefersWeightGradients(const JobSpec& job) {
  const auto& options = job.model_spec().options();
  auto it = options.find("deferred_wgrad");
  return it == options.end() || it->second != "false";
}

torch::Tensor Stage::Loss(const torch::Tensor& output, const torch::Tensor& targets) {
  return LanguageModelLoss(output, targets);
}

void Stage::Backward(const torch::Tensor& output, const torch::Tensor& grad_output) {
  if (grad_output.defined()) {
    torch::autograd::backward({output}, {grad_output});
  } else {
    torch::autograd::backward({output});
  }
}

torch::Tensor Stage::BackwardInput(const torch::Tensor& input, const torch::Tensor& output,
                                   const torch::Tensor& grad_output) {
  if (!input.defined() || !input.requires_grad()) return torch::Tensor();  // tokens: nothing upstream
  torch::autograd::variable_list grad_outputs;
  if (grad_output.defined()) grad_outputs.push_back(grad_output);
  // Only the input's gradient: autograd runs the nodes on the way to it, and a node that would add a
  // weight gradient itself (worker/nn.h's Dense) sees that its weight's gradient is not wanted.
  return torch::autograd::grad({output}, {input}, grad_outputs, /*retain_graph=*/true)[0];
}

void Stage::BackwardWeight(const torch::Tensor& output, const torch::Tensor& grad_output) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : Parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  torch::autograd::variable_list grads;
  if (grad_output.defined()) grads.push_back(grad_output);
  torch::autograd::backward({output}, grads, /*retain_graph=*/false, /*create_graph=*/false, params);
}

}  // namespace stagehand
