// The reference GPT (../shared/targets.md) in LibTorch, cut into the decoder's pipeline layers
// (models/decoder_layers.h): the token embedding, each block's attention and MLP halves, the head (final
// LayerNorm and the vocabulary projection). GptStage holds a contiguous range of them; MakeGptFamily()
// is the family a worker registers, built on the engine's public interface (engine/stage.h).
#ifndef STAGEHAND_MODELS_GPT_GPT_STAGE_H_
#define STAGEHAND_MODELS_GPT_GPT_STAGE_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>

#include "models/decoder_layers.h"
#include "models/model_family.h"
#include "protos/job.pb.h"

namespace stagehand {

struct GptConfig {
  int64_t vocab = 32768;
  int64_t hidden = 2048;
  int64_t heads = 16;
  int64_t layers = 24;  // transformer blocks
  int64_t seq = 1024;
  bool bf16_autocast = true;  // bf16 autocast over fp32 parameters (CUDA); false: plain fp32
  // Under bf16 autocast on CUDA, each LayerNorm that feeds a GEMM writes its bf16 output in one kernel
  // (kernels/fused_kernels.h) instead of ATen's fp32 LayerNorm and a cast. Same values up to the rounding of the
  // fp32 sums (a bf16 ulp at most, in rare elements).
  bool fused_layernorm = true;
  // The attention's q, k, v gradients are written into the qkv projection's gradient in one pass
  // (--model_option=fused_qkv_grad=false: autograd's unbind and permute backward, two passes).
  bool fused_qkv_grad = true;
  // The norms' backward takes their bf16 output gradient in one kernel (kernels/fused_backward_kernels.h)
  // instead of an fp32 upcast and ATen's backward (--model_option=fused_norm_backward=false: ATen's).
  bool fused_norm_backward = true;
  // The loss over the bf16 logits without an fp32 copy (FusedLanguageModelLoss in engine/stage.h;
  // --model_option=fused_cross_entropy=false: the fp32 upcast and torch's cross_entropy).
  bool fused_cross_entropy = true;
  // The residual stream's gradient is added to each norm's dx inside the fused norm backward
  // (NormForGemmWithSkip; --model_option=fused_residual_grad=false: autograd's add).
  bool fused_residual_grad = true;
  // The MLP's fc1 and GELU as one autograd function (DenseImpl::ForwardGelu): the GELU's backward and
  // fc1's bias gradient in one kernel, and under bf16 autocast on an sm_90 GPU the forward as one GEMM
  // with the bias and GELU in its epilogue (--model_option=fused_gelu=false: at::gelu(fc1(x)));
  // fused_gelu_gemm=false keeps the fused backward with at::linear + at::gelu forward.
  bool fused_gelu = true;
  bool fused_gelu_gemm = true;
  // The residual adds inside the GEMMs that feed them: "x + proj(h)" and "x + fc2(h)" as one product
  // with the fp32 stream as its addend (DenseImpl::ForwardResidual; off:
  // --model_option=fused_residual_gemm=false): on an sm_90 GPU our CUTLASS kernel (gemm_residual.h),
  // else, or with --model_option=cutlass_residual_gemm=false, cuBLASLt's.
  bool fused_residual_gemm = true;
  bool cutlass_residual_gemm = true;
  // The linear layers' bias gradients are summed in the pass that makes their bf16 dy: the qkv
  // projection's in the assembly of the q, k, v gradients (DenseImpl::ForwardHeads), proj's and fc2's
  // with the cast of the residual stream's fp32 gradient (CastWithColumnSums), and fc1's by ColumnSums
  // where fused_gelu is off (with it on, the GELU backward kernel sums it, whatever this says)
  // (--model_option=fused_bias_grad=false: ATen's copies, cast and reduce).
  bool fused_bias_grad = true;
  // The embedding's backward adds into the table's .grad only the rows the batch used (EmbeddingLookup,
  // nn/nn.h; --model_option=fused_embedding_grad=false: ATen's dense gradient and autograd's add).
  bool fused_embedding_grad = true;

  int64_t pipeline_layers() const { return DecoderPipelineLayers(layers); }
};

// The sizes of a resolved ModelSpec (GptDescription().Resolve).
GptConfig GptConfigFromSpec(const ModelSpec& spec);

// One pipeline stage: layers [first, last) of the model.
class GptStageImpl : public torch::nn::Module {
 public:
  // `init_device`: where the parameters are made and drawn (nn/nn.h LayerGenerator: a CUDA device
  // draws other numbers than the CPU); the module is moved to its run device afterwards either way.
  GptStageImpl(const GptConfig& config, int first, int last, uint64_t seed,
               const torch::Device& init_device = torch::kCPU);

  // input: token ids [B, S] (int64) when the stage holds layer 0, else hidden states [B, S, H] (fp32).
  // Returns hidden states [B, S, H] (fp32), or logits [B, S, V] when the stage holds the head.
  torch::Tensor forward(const torch::Tensor& input);

  // Brings the bf16 copies of the linear layers' weights up to date with the fp32 parameters now (they
  // are otherwise refreshed at the next forward): before capturing or replaying a CUDA graph, which
  // reads the copies without running the code that refreshes them.
  void RefreshCasts();

  bool has_embedding() const { return first_ == 0; }
  bool has_head() const { return last_ == config_.pipeline_layers(); }
  int first() const { return first_; }
  int last() const { return last_; }

 private:
  GptConfig config_;
  int first_, last_;
  torch::nn::ModuleList layers_{nullptr};
};
TORCH_MODULE(GptStage);

std::unique_ptr<ModelFamily> MakeGptFamily();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_GPT_GPT_STAGE_H_
