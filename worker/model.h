// The reference GPT (../shared/targets.md) in LibTorch, cut into pipeline layers (gpt_layers.h): the
// token embedding, each block's attention and MLP halves, the head (final LayerNorm and the vocabulary
// projection). A stage owns a contiguous range of layers. Parameters are initialised per layer from
// (seed, layer index), so every way of cutting the model gives the same parameters as the whole.
#ifndef STAGEHAND_WORKER_MODEL_H_
#define STAGEHAND_WORKER_MODEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/gpt_layers.h"

namespace stagehand {

struct GptConfig {
  int64_t vocab = 32768;
  int64_t hidden = 2048;
  int64_t heads = 16;
  int64_t layers = 24;   // transformer blocks
  int64_t seq = 1024;
  bool bf16_autocast = true;  // bf16 autocast over fp32 parameters (CUDA); false: plain fp32
  // Under bf16 autocast on CUDA, each LayerNorm that feeds a GEMM writes its bf16 output in one kernel
  // (fused_kernels.h) instead of ATen's fp32 LayerNorm and a cast. Same values up to the rounding of the
  // fp32 sums (a bf16 ulp at most, in rare elements).
  bool fused_layernorm = true;

  int64_t pipeline_layers() const { return GptPipelineLayers(layers); }
};

// "tiny" (CPU tests: vocab 256, hidden 64, 4 heads, 4 layers, seq 32, fp32) and "gpt-1.3b" (the
// reference sizes). INVALID_ARGUMENT naming the known presets otherwise.
absl::StatusOr<GptConfig> GptPreset(const std::string& name);
// Checks sizes (positive; hidden divisible by heads). INVALID_ARGUMENT saying what to change.
absl::Status ValidateConfig(const GptConfig& config);

// One pipeline stage: layers [first, last) of the model.
class GptStageImpl : public torch::nn::Module {
 public:
  GptStageImpl(const GptConfig& config, int first, int last, uint64_t seed);

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

// Puts `kernel` first in line for scaled-dot-product attention in this process (LibTorch's choice is
// global): "cudnn" (cuDNN's fused attention; also for ""), "flash" (FlashAttention-2) or "torch" (LibTorch's own
// order: flash, memory-efficient, math, cuDNN). A kernel that cannot take given inputs (fp32, say)
// hands them to the next in line. INVALID_ARGUMENT for another name.
absl::Status SelectAttentionKernel(const std::string& kernel);

// Mean token cross-entropy in fp32. logits [B, S, V], targets [B, S] int64.
torch::Tensor LanguageModelLoss(const torch::Tensor& logits, const torch::Tensor& targets);

// Fused AdamW (ATen's _fused_adamw_) over a set of parameters; state is created on first use.
class FusedAdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, double lr = 1e-4, double beta1 = 0.9, double beta2 = 0.95,
             double eps = 1e-8, double weight_decay = 0.1);
  void Step();      // uses each parameter's .grad(); parameters without a gradient are skipped
  // Sets gradients to None; or, with set_to_none false, to zeros in place (allocating them if need be),
  // so that they keep their addresses (captured CUDA graphs accumulate into them).
  void ZeroGrad(bool set_to_none = true);

 private:
  std::vector<torch::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  double lr_, beta1_, beta2_, eps_, weight_decay_;
};

// Training data. Batch(step, index) is deterministic in (seed, step, index): the same on every rank and
// in every run, which is what lets a pipeline run be compared with a single-process one.
class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // `batch` sequences of seq+1 tokens: inputs are [:, :-1], targets [:, 1:]. int64, on the CPU.
  virtual torch::Tensor Batch(int64_t step, int64_t index, int64_t batch) const = 0;
};

// A synthetic corpus the model can learn: each sequence follows a fixed random successor table with a
// little noise, so the loss falls well below uniform guessing (ln vocab).
std::unique_ptr<TokenSource> MakeSyntheticCorpus(const GptConfig& config, uint64_t seed);
// A file of uint16 tokens (the layout nanoGPT writes); windows are drawn at offsets from the seed.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path, const GptConfig& config,
                                                           uint64_t seed);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_MODEL_H_
