// The Stage interface's defaults (see stage.h). LibTorch translation unit.
#include "engine/stage.h"

#include <ATen/cuda/CUDAContext.h>

#include "kernels/fused_backward_kernels.h"

namespace stagehand {

namespace F = torch::nn::functional;

torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  // (log_softmax's half_to_float would skip the fp32 copy of the logits, but torch 2.11's CUDA kernel
  // takes it for fp16 only: "conversion is supported for Half type only" for bf16.)
  return F::cross_entropy(logits.to(torch::kFloat32).reshape({-1, logits.size(-1)}),
                          targets.to(logits.device()).reshape({-1}));
}

bool DefersWeightGradients(const JobSpec& job) { return ModelOptionOn(job.model_spec(), "deferred_wgrad"); }

namespace {

constexpr int64_t kIgnoreIndex = -100;  // torch's cross_entropy default

// logits [N, V] bf16 contiguous on CUDA, targets [N] int64 on the same device.
class FusedCrossEntropyFunction : public torch::autograd::Function<FusedCrossEntropyFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& logits,
                               const torch::Tensor& targets) {
    const int64_t rows = logits.size(0), vocab = logits.size(1);
    torch::Tensor row_loss = torch::empty({rows}, logits.options().dtype(torch::kFloat32));
    torch::Tensor lse = torch::empty({rows}, row_loss.options());
    const cudaError_t e = CrossEntropyForward(
        reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>()), targets.data_ptr<int64_t>(),
        row_loss.data_ptr<float>(), lse.data_ptr<float>(), rows, vocab, kIgnoreIndex, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "CrossEntropyForward: ", cudaGetErrorString(e));
    // The mean over the tokens that count, as cross_entropy's: on the device, nothing waits for the host.
    const torch::Tensor count = targets.ne(kIgnoreIndex).sum().to(torch::kFloat32);
    ctx->save_for_backward({logits, targets, lse, count});
    return row_loss.sum() / count;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor &logits = s[0], &targets = s[1], &lse = s[2], &count = s[3];
    const torch::Tensor scale = (grads[0].to(torch::kFloat32) / count).contiguous();
    torch::Tensor dlogits = torch::empty_like(logits);
    const cudaError_t e = CrossEntropyBackward(
        reinterpret_cast<const uint16_t*>(logits.data_ptr<at::BFloat16>()), targets.data_ptr<int64_t>(),
        lse.data_ptr<float>(), scale.data_ptr<float>(), reinterpret_cast<uint16_t*>(dlogits.data_ptr<at::BFloat16>()),
        logits.size(0), logits.size(1), kIgnoreIndex, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "CrossEntropyBackward: ", cudaGetErrorString(e));
    return {dlogits, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor FusedLanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (!logits.is_cuda() || logits.scalar_type() != torch::kBFloat16 || logits.dim() < 2) {
    return LanguageModelLoss(logits, targets);
  }
  const torch::Tensor flat = logits.reshape({-1, logits.size(-1)}).contiguous();
  const torch::Tensor t = targets.to(logits.device(), torch::kInt64).reshape({-1}).contiguous();
  TORCH_CHECK(t.size(0) == flat.size(0), "the loss takes one target per token: ", flat.size(0), " tokens, ", t.size(0),
              " targets");
  return FusedCrossEntropyFunction::apply(flat, t);
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
  // weight gradient itself (nn/nn.h's Dense) sees that its weight's gradient is not wanted.
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
