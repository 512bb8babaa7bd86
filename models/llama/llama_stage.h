// Llama (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, no biases, untied head) in
// LibTorch, cut into the decoder's pipeline layers (models/decoder_layers.h). LlamaStage holds a
// contiguous range of them; MakeLlamaFamily() is the family a worker registers, built only on the
// engine's public interface (engine/stage.h, models/model_family.h, nn/nn.h).
#ifndef STAGEHAND_MODELS_LLAMA_LLAMA_STAGE_H_
#define STAGEHAND_MODELS_LLAMA_LLAMA_STAGE_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/decoder_layers.h"
#include "models/model_family.h"
#include "protos/job.pb.h"

namespace stagehand {

struct LlamaConfig {
  int64_t vocab = 32000;
  int64_t hidden = 2048;
  int64_t heads = 32;    // query heads
  int64_t kv_heads = 4;  // key/value heads, each shared by heads / kv_heads query heads
  int64_t ffn_hidden = 5632;
  int64_t layers = 22;  // transformer blocks
  int64_t seq = 1024;   // the longest sequence: the rotary tables' length
  double rope_theta = 10000;
  double norm_eps = 1e-5;
  bool bf16_autocast = true;  // bf16 autocast over fp32 parameters (CUDA); false: plain fp32
  // Under bf16 autocast on CUDA, each RMSNorm (all feed a GEMM) writes its bf16 output in one kernel
  // (kernels/fused_kernels.h) instead of ATen's fp32 ops and a cast; rows of a multiple of 128 up to
  // 4096 elements, else the ATen path. false: spec.fused_layernorm() is false.
  bool fused_rmsnorm = true;
  // The norms' backward takes their bf16 output gradient in one kernel (kernels/fused_backward_kernels.h)
  // instead of an fp32 upcast and ATen's backward (--model_option=fused_norm_backward=false: ATen's).
  bool fused_norm_backward = true;
  // The loss over the bf16 logits without an fp32 copy (FusedLanguageModelLoss in engine/stage.h;
  // --model_option=fused_cross_entropy=false: the fp32 upcast and torch's cross_entropy).
  bool fused_cross_entropy = true;
  // The residual stream's gradient is added to each norm's dx inside the fused norm backward
  // (--model_option=fused_residual_grad=false: autograd's add).
  bool fused_residual_grad = true;
  // Rotary embeddings and SwiGLU in one bf16 kernel each way (kernels/fused_elementwise_kernels.h;
  // --model_option=fused_rotary=false / fused_swiglu=false: the ATen ops).
  bool fused_rotary = true;
  bool fused_swiglu = true;
  // o_proj's and down_proj's residual adds inside their GEMMs (DenseImpl::ForwardResidual;
  // --model_option=fused_residual_gemm=false: autograd's add of the bf16 branch): on an sm_90 GPU our
  // CUTLASS kernel, else, or with --model_option=cutlass_residual_gemm=false, cuBLASLt's.
  bool fused_residual_gemm = true;
  bool cutlass_residual_gemm = true;
  // The embedding's backward adds into the table's .grad only the rows the batch used (EmbeddingLookup,
  // nn/nn.h; --model_option=fused_embedding_grad=false: ATen's dense gradient and autograd's add).
  bool fused_embedding_grad = true;

  int64_t head_dim() const { return hidden / heads; }
  int64_t pipeline_layers() const { return DecoderPipelineLayers(layers); }
};

// The sizes of a resolved ModelSpec (LlamaDescription().Resolve).
LlamaConfig LlamaConfigFromSpec(const ModelSpec& spec);

// One pipeline stage: layers [first, last) of the model. Parameters depend on (seed, layer) only.
class LlamaStageImpl : public torch::nn::Module {
 public:
  // `init_device`: where the parameters are made and drawn (nn/nn.h LayerGenerator: a CUDA device
  // draws other numbers than the CPU); the module is moved to its run device afterwards either way.
  LlamaStageImpl(const LlamaConfig& config, int first, int last, uint64_t seed,
                 const torch::Device& init_device = torch::kCPU);

  // input: token ids [B, S] (int64, S <= seq) when the stage holds layer 0, else hidden states
  // [B, S, H] (fp32). Returns hidden states [B, S, H] (fp32), or logits [B, S, V] when the stage holds
  // the head (bf16 under autocast). Throws c10::Error for inputs of another shape or dtype.
  torch::Tensor forward(const torch::Tensor& input);

  // The parameters under Hugging Face's LlamaForCausalLM names ("model.layers.3.mlp.up_proj.weight"),
  // block indices counted from 0 over the whole model, in pipeline-layer order.
  std::vector<std::pair<std::string, torch::Tensor>> NamedParametersHf();

  // Brings the bf16 copies of the linear layers' weights up to date now (before CUDA graphs).
  void RefreshCasts();

  bool has_embedding() const { return first_ == 0; }
  bool has_head() const { return last_ == config_.pipeline_layers(); }
  int first() const { return first_; }
  int last() const { return last_; }
  const LlamaConfig& config() const { return config_; }

 private:
  LlamaConfig config_;
  int first_, last_;
  torch::nn::ModuleList layers_{nullptr};
  // Rotary tables [seq, head_dim] in fp32, computed once here and moved with the stage by .to().
  torch::Tensor rope_cos_, rope_sin_;
};
TORCH_MODULE(LlamaStage);

std::unique_ptr<ModelFamily> MakeLlamaFamily();

}  // namespace stagehand

#endif  // STAGEHAND_MODELS_LLAMA_LLAMA_STAGE_H_
