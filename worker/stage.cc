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

}  // namespace stagehand
