// Building blocks for model families' stages (LibTorch): linear layers whose bf16 weight copies are
// cast once per optimizer step and whose weight gradients accumulate into fp32 in the GEMM, a fused
// LayerNorm-to-bf16 for norms that feed a GEMM, bf16 autocast, per-layer generators, the choice of
// attention kernel, and fused AdamW. GPT and Llama use them; a user's family may.
#ifndef STAGEHAND_NN_NN_H_
#define STAGEHAND_NN_NN_H_

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "protos/job.pb.h"

namespace stagehand {

// The generator of pipeline layer `layer`: parameters drawn from it depend on (seed, layer) alone,
// never on the partition, so every way of cutting a model gives the same parameters as the whole.
// On a CUDA device it is a device generator with the same seed: parameters are drawn where they live,
// in milliseconds instead of seconds of serial CPU draws and a copy (gpt-1.3b: 5.2 GB). Its numbers are
// not the CPU generator's, and depend on (seed, layer) and the kind of GPU (the kernel's grid follows
// the multiprocessor count); they still do not depend on the partition.
at::Generator LayerGenerator(uint64_t seed, int layer, const torch::Device& device = torch::kCPU);

// A parameter in a compute dtype, cast again only when the parameter changed: its version counter
// moves with every in-place update (the optimizer's step included) and its storage with .to(device).
// Parameters must be changed in place or replaced, not written through .data(), which would bypass
// the version counter. A fresh cast goes into the same buffer, so a captured CUDA graph that reads the
// copy sees it.
// A bf16 cast is also known by its parameter (CastCopyOf), so that the optimizer can write the new
// copy in the pass that updates the parameter (FusedAdamW::Step) and mark it fresh.
class CastCache {
 public:
  CastCache() = default;
  CastCache(const CastCache&) {}  // a copy starts empty: a parameter's registered copy has one owner
  CastCache& operator=(const CastCache&);
  ~CastCache();
  const torch::Tensor& Get(const torch::Tensor& param, at::ScalarType dtype) {
    if (!cast_.defined() || version_ != param._version() || source_ != param.data_ptr() ||
        cast_.scalar_type() != dtype) {
      torch::NoGradGuard no_grad;
      if (cast_.defined() && cast_.scalar_type() == dtype && cast_.device() == param.device() &&
          cast_.sizes() == param.sizes()) {
        cast_.copy_(param);
      } else {
        cast_ = param.detach().to(dtype);
        if (dtype == at::kBFloat16 && param.scalar_type() != dtype) Register(param);
      }
      version_ = param._version();
      source_ = param.data_ptr();
    }
    return cast_;
  }
  // The bf16 copy of `param` (current or stale) as a contiguous buffer of its shape, for the optimizer
  // to write in place; nullptr when there is none.
  torch::Tensor* CopyBuffer(const torch::Tensor& param) {
    const bool ok = cast_.defined() && cast_.scalar_type() == at::kBFloat16 && source_ == param.data_ptr() &&
                    cast_.device() == param.device() && cast_.sizes() == param.sizes() && cast_.is_contiguous();
    return ok ? &cast_ : nullptr;
  }
  // The buffer a fresh cast of `param` would be copied into, when it is stale and the buffer can take it
  // (same dtype, device and sizes): RefreshDenseCasts copies all of those in one multi-tensor launch and
  // then marks them fresh. nullptr when the cast is current or needs a new buffer (Get makes that one).
  torch::Tensor* StaleBuffer(const torch::Tensor& param, at::ScalarType dtype) {
    const bool stale =
        !cast_.defined() || version_ != param._version() || source_ != param.data_ptr() || cast_.scalar_type() != dtype;
    const bool reusable = cast_.defined() && cast_.scalar_type() == dtype && cast_.device() == param.device() &&
                          cast_.sizes() == param.sizes();
    return stale && reusable && param.scalar_type() != dtype ? &cast_ : nullptr;
  }
  void MarkFresh(const torch::Tensor& param) {
    version_ = param._version();
    source_ = param.data_ptr();
  }

 private:
  void Register(const torch::Tensor& param);
  torch::Tensor cast_;
  int64_t version_ = -1;
  const void* source_ = nullptr;
};

// Casts to refresh together: (buffer, parameter) pairs copied by one at::_foreach_copy_, then marked
// fresh in their caches. One launch per chunk of tensors instead of one copy_ per parameter: as copy_s,
// gpt-1.3b's 193 casts are 2.0 ms of kernels and about 3 ms of gaps between them (each copy_ ~16 us of
// host time while the GPU waits; an H200 trace, bench/results/2026-12-01-one-gpu-speed-4.md).
struct CastBatch {
  std::vector<torch::Tensor> buffers, params;
  std::vector<CastCache*> caches;
  // Get(param) at once where the buffer cannot be reused (or the cast is current); queued otherwise.
  void Add(CastCache& cache, const torch::Tensor& param, at::ScalarType dtype);
  void Run();
};

// How DenseImpl::ForwardResidual computes skip + x W^T + b: as the two ops autocast runs (kOff), or as one
// GEMM with the fp32 stream as its addend: cuBLASLt's (kCublasLt, lt_gemm.h) or ours in CUTLASS where it
// takes the operands (kCutlass, gemm_residual.h; cuBLASLt's otherwise).
enum class ResidualGemm { kOff, kCublasLt, kCutlass };

// What --model_option=fused_residual_gemm and cutlass_residual_gemm select.
inline ResidualGemm ResidualGemmOf(bool fused, bool cutlass) {
  return !fused ? ResidualGemm::kOff : cutlass ? ResidualGemm::kCutlass : ResidualGemm::kCublasLt;
}

// y = x W^T (+ b). The weight is drawn by the owner, in the owner's fixed order.
//
// Under bf16 autocast a plain at::linear casts the fp32 weight to bf16 on every call, once per
// micro-batch, and autograd then upcasts each micro-batch's bf16 weight gradient and adds it to .grad:
// tens of bytes of memory traffic per parameter per micro-batch (gpt-1.3b, 1F1B over 8 micro-batches
// on 2 x H200: 0.3731 s per step with autocast's casts, 0.3412 s without them). Here, as Megatron-LM's
// gradient-accumulation fusion does, the bf16 copy is made once per optimizer step (CastCache) and the backward
// accumulates dy^T x into the fp32 .grad with one GEMM. The forward and dx are what autocast computes; the weight
// gradient is summed in fp32 instead of being rounded to bf16 per micro-batch first. Without autocast (fp32, the CPU
// tests) the same function runs with the parameters themselves.
class DenseImpl : public torch::nn::Module {
 public:
  // `device`: where the parameters are made (and drawn, by a generator on the same device).
  DenseImpl(int64_t in, int64_t out, bool bias, const torch::Device& device = torch::kCPU) {
    const auto options = torch::TensorOptions().device(device);
    weight = register_parameter("weight", torch::empty({out, in}, options));
    if (bias) this->bias = register_parameter("bias", torch::zeros({out}, options));
  }
  void InitWeight(double std, at::Generator& gen) {
    torch::NoGradGuard no_grad;
    weight.normal_(0.0, std, gen);
  }
  torch::Tensor forward(const torch::Tensor& x);
  // gelu(forward(x)) with the exact (erf) GELU, as at::gelu. With `fused` (and a bias) one autograd
  // function whose backward computes the GELU's gradient and the bias's in one kernel (gelu_kernels.h)
  // before the same dx and weight gradient as forward's (deferred W included); under bf16 autocast on an
  // sm_90 GPU the forward is one GEMM whose epilogue adds the bias and applies the GELU (gemm_gelu.h).
  // Otherwise (CPU, fp32, shapes the kernels do not take) the same values from ATen's kernels
  // (--model_option=fused_gelu=false: at::gelu(forward(x)) as it stood). `gemm` false keeps the fused
  // backward but runs the forward as at::linear and at::gelu (--model_option=fused_gelu_gemm=false).
  torch::Tensor ForwardGelu(const torch::Tensor& x, bool fused, bool gemm = true);
  // skip + forward(x), the residual stream's update: skip is the fp32 stream, x the branch's input.
  // Unless `gemm` is kOff, under bf16 autocast on CUDA one GEMM computes it (bf16 x and weight, the
  // fp32 bias and stream, accumulated and written in fp32), without the branch's bf16 output and a
  // separate add: with kCutlass ours on an sm_90 GPU (gemm_residual.h), else cuBLASLt's (lt_gemm.h);
  // its backward passes the gradient to skip unchanged. Otherwise (kOff, CPU, fp32, no cuBLASLt) the
  // two ops as written.
  torch::Tensor ForwardResidual(const torch::Tensor& x, const torch::Tensor& skip, ResidualGemm gemm);
  // forward(x) viewed as attention's q, k, v [B, NH, S, D] (the output [B, S, 3H] split as
  // [B, S, 3, NH, D]), for x [B, S, H'] and out = 3H. Its backward writes the three gradients into dy
  // [B, S, 3H] and sums the bias's gradient in the same pass (AssembleHeadsGrad), then forms dx and the
  // weight's gradient (queued under DeferWeightGrads) as forward's backward does. Without grad mode, or
  // when nothing needs a gradient, the plain views of forward(x).
  std::vector<torch::Tensor> ForwardHeads(const torch::Tensor& x, int64_t heads);
  // Whether the backward makes the bias's gradient with the cast of dy to bf16 or in its own kernel
  // (CastWithColumnSums, ColumnSums) rather than ATen's cast and reduce (--model_option=fused_bias_grad).
  void set_fused_bias_grad(bool on) { fused_bias_grad_ = on; }
  // Brings the cast copies up to date now rather than at the next forward.
  void RefreshCasts(at::ScalarType dtype) {
    CastBatch batch;
    AddCasts(dtype, batch);
    batch.Run();
  }
  // The weight's and bias's casts, into `batch` (RefreshDenseCasts batches every layer's).
  void AddCasts(at::ScalarType dtype, CastBatch& batch) {
    batch.Add(weight_cast_, weight, dtype);
    if (bias.defined()) batch.Add(bias_cast_, bias, dtype);
  }

  torch::Tensor weight, bias;

 private:
  // x, the weight and the bias in the compute dtype (autocast's, else the weight's): the parameters
  // themselves where they already are in it, else their cached casts; bias_param the bias parameter.
  struct Operands {
    torch::Tensor x, w;
    std::optional<torch::Tensor> b, bias_param;
  };
  Operands InComputeDtype(const torch::Tensor& x);

  CastCache weight_cast_, bias_cast_;
  CastCache bias_f32_cast_;  // ForwardResidual's fp32 bias where inference lowered the bias to bf16
  bool fused_bias_grad_ = true;
};
TORCH_MODULE(Dense);

// Sets the fused bias gradient (DenseImpl::set_fused_bias_grad) of every Dense under `root`.
void SetDenseFusedBiasGrad(torch::nn::Module& root, bool on);

// The bias gradient's column sums (bias_grad_kernels.h), deterministic, in fp32. For 2-D [rows, cols]
// contiguous, 16-byte aligned CUDA inputs with cols a multiple of 8; anything else goes to ATen.
// ColumnSums: x bf16 -> x.sum(0) in fp32.
// `into` (may be null): the parameter whose gradient the sums are. Where the kernel runs and the
// parameter is a CUDA fp32 leaf that needs a gradient, the kernel adds the sums into its .grad itself
// (autograd's add into .grad, without that kernel; a missing .grad is made) and the sums come back
// undefined, so the caller returns no gradient for it; otherwise the sums come back.
torch::Tensor ColumnSums(const torch::Tensor& x_bf16_2d, const torch::Tensor* into = nullptr);
// {bf16 copy of g, column sums of that copy in fp32}: the cast a bf16 GEMM's backward makes of an fp32
// gradient (the residual stream's) and its bias's gradient, in one pass. `into` as ColumnSums'.
std::pair<torch::Tensor, torch::Tensor> CastWithColumnSums(const torch::Tensor& g_fp32,
                                                           const torch::Tensor* into = nullptr);
// {dqkv [B, S, 3H], its column sums in fp32 (undefined unless `sums`)}: attention's q, k, v gradients
// [B, NH, S, D] written into the gradient of the qkv projection's output [B, S, 3H] (viewed as
// [B, S, 3, NH, D]) in one vectorised pass that also sums the bias's gradient, for bf16 gradients with
// a contiguous last dimension on CUDA; otherwise three strided copies (an undefined gradient: zeros)
// and ATen's sum. `into` as ColumnSums'.
std::pair<torch::Tensor, torch::Tensor> AssembleHeadsGrad(const torch::Tensor& dq, const torch::Tensor& dk,
                                                          const torch::Tensor& dv, bool sums,
                                                          const torch::Tensor* into = nullptr);

// Deferred weight gradients (zero-bubble's W, as Megatron-LM's deferred wgrad and torch.distributed.
// pipelining's stage_backward_weight): while a DeferWeightGrads scope is alive, every Dense backward in
// this process computes its input gradient (and its bias's) as usual but queues (weight, dy, x) here
// instead of adding dy^T x into the weight's .grad; Apply() does those GEMMs later. What a queue holds
// (x and dy of every linear layer of a micro-batch) is the memory a split backward keeps from I to W.
class WeightGradQueue {
 public:
  void Push(torch::Tensor weight, torch::Tensor dy, torch::Tensor x);  // any thread (autograd's)
  // weight.grad += dy^T x for each entry, in the order they came (as a full backward adds them), then
  // empties the queue.
  void Apply();
  size_t size() const;
  int64_t bytes() const;  // of the queued dy and x

 private:
  struct Entry {
    torch::Tensor weight, dy, x;
  };
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
};

// Routes the process's Dense weight gradients into `queue` while alive (the autograd engine runs a CUDA
// backward on a device thread of its own, so the route is process-wide, not thread-local). Scopes nest.
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WeightGradQueue* queue);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradQueue* previous_;
};

// A stage's split backward (schedule actions I and W) with deferred weight gradients, for families whose
// large weights are Dense layers (GPT, Llama). BackwardInput runs the micro-batch's whole backward once:
// the input's gradient, the cheap parameters' gradients (norms, biases, embeddings) and, queued, every
// Dense weight's (x, dy), and releases the graph. BackwardWeight forms the queued dy^T x. I + W adds
// exactly what one full backward adds; W is one GEMM per linear layer and recomputes nothing.
// Micro-batches are told apart by their output tensor (the engine passes the same one to I and W).
class DeferredSplitBackward {
 public:
  // The gradient w.r.t. `input` (undefined when `input` is: the first stage's tokens).
  torch::Tensor BackwardInput(const torch::Tensor& input, const torch::Tensor& output,
                              const torch::Tensor& grad_output);
  // False when no BackwardInput of `output` is pending (the caller then runs a full backward).
  bool BackwardWeight(const torch::Tensor& output);
  // Micro-batches between their I and their W, and the bytes their queues hold.
  size_t pending() const { return pending_.size(); }
  int64_t pending_bytes() const;

 private:
  std::map<const void*, WeightGradQueue> pending_;  // by the output's TensorImpl
};

// torch::embedding(weight, tokens). With `fused`, for an fp32 table on CUDA that needs a gradient, an
// autograd function whose backward adds the gradient into weight's .grad itself, only in the rows the
// batch used (the ids sorted, each id's rows summed in position order: deterministic; embedding_kernels.h).
// ATen's backward instead zero-fills a dense [vocab, H] gradient, scatters into it, and autograd then adds
// all of it to .grad: for gpt-1.3b's 50304 x 2048 table 0.5 ms per micro-batch of 8 x 1024 tokens (an
// H200 trace), of which the rows used are at most 8192. Otherwise (CPU, bf16, fused false:
// --model_option=fused_embedding_grad=false) torch::embedding.
// A run dominated by one id (a batch of mostly padding) is summed by one block: correct, but slower than
// ATen's (up to ~0.3 ms for 8192 equal ids of 2048 columns, an estimate).
torch::Tensor EmbeddingLookup(const torch::Tensor& weight, const torch::Tensor& tokens, bool fused);

// Brings the bf16 copies of every Dense under `root` (its children: not root itself) up to date, in one
// multi-tensor copy (before CUDA graphs replay them).
void RefreshDenseCasts(torch::nn::Module& root, at::ScalarType dtype);

// A contract of the fused backward paths here (the linear weights', and with fused_bias_grad,
// fused_norm_backward, fused_gelu and fused_embedding_grad the biases', norms' and embedding's): they
// add a parameter's gradient into its .grad themselves and return none to autograd. So
// torch::autograd::grad with respect to such a parameter finds no gradient, and tensor or
// post-accumulate hooks on it do not fire; the engine (executor, data parallelism) reads .grad after
// the backward and needs neither.

// For inference under autocast: the weight and bias of every CUDA Dense under `root` become `dtype`
// tensors in place of the fp32 ones (set_data: the same parameters, now in the compute dtype), so that
// the forward uses them as they are and holds no fp32 master beside its cast copy (gpt-1.3b: 7.8 GB of
// weights become 2.6). The outputs are the same: the forward cast them to `dtype` anyway. Nothing may
// train them afterwards; what reads them (a checkpoint's restore copies into them) sees `dtype`.
void LowerDenseWeights(torch::nn::Module& root, at::ScalarType dtype);

// Whether a stage should LowerDenseWeights: an inference job (forward only) under bf16 autocast on
// CUDA that does not save its parameters (they would come out in bf16), and the model option
// inference_bf16_weights not "false".
bool LowersDenseWeights(const JobSpec& job, const torch::Device& device, bool bf16_autocast);

// ln(x) as the input of a GEMM: with `fused` under bf16 autocast on CUDA, fused with the cast to bf16
// that the GEMM would make; otherwise (CPU, fp32, inputs the kernel does not take) the LayerNorm module.
// With `fused_backward` its backward takes the bf16 gradient as it comes (NormBackwardFromBf16) instead of
// upcasting it and running ATen's LayerNorm backward (--model_option=fused_norm_backward=false: ATen's).
torch::Tensor NormForGemm(torch::nn::LayerNorm& ln, const torch::Tensor& x, bool fused, bool fused_backward = true);

// {ln(x), x} for a residual block x + f(ln(x)) that adds f to the second: with `fused_skip` (and the
// fused forward and backward) the second is x passed through the norm's autograd function, so that the
// residual stream's gradient is added to the norm's dx in the fused backward's pass rather than by
// autograd's separate fp32 add (--model_option=fused_residual_grad=false: {ln(x), x} as they are).
std::pair<torch::Tensor, torch::Tensor> NormForGemmWithSkip(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                                                            bool fused, bool fused_backward, bool fused_skip);

// The backward of a LayerNorm (mean defined) or RMSNorm (mean undefined) of fp32 rows x [..., cols] with
// an fp32 weight, from the bf16 gradient dy of its output, in one kernel (fused_backward_kernels.h):
// {dx (fp32), dweight, dbias (undefined for RMSNorm)}; mean and rstd are the forward's, one per row.
// `residual` (fp32, x's shape; may be undefined) is added to dx in the same pass.
// Empty when the kernel does not take the inputs (dy not bf16, contiguous and aligned on CUDA, a row
// length LayerNormToBf16 does not take): the caller then runs its own backward. weight_param and
// bias_param (may be null): the norm's parameters, whose gradients go into their .grad as ColumnSums'
// `into` says (then dweight, dbias come back undefined).
std::vector<torch::Tensor> NormBackwardFromBf16(const torch::Tensor& dy, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& mean,
                                                const torch::Tensor& rstd,
                                                const torch::Tensor& residual = torch::Tensor(),
                                                const torch::Tensor* weight_param = nullptr,
                                                const torch::Tensor* bias_param = nullptr);

// bf16 autocast on CUDA for one forward, restoring what was there before. Like Python's
// torch.autocast, the cache of cast weights is dropped when the outermost region ends: a cached bf16
// copy would go stale once the optimizer updates the fp32 weight in place.
class CudaBf16Autocast {
 public:
  CudaBf16Autocast()
      : was_enabled_(at::autocast::is_autocast_enabled(at::kCUDA)),
        old_dtype_(at::autocast::get_autocast_dtype(at::kCUDA)) {
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~CudaBf16Autocast() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, was_enabled_);
    at::autocast::set_autocast_dtype(at::kCUDA, old_dtype_);
  }
  CudaBf16Autocast(const CudaBf16Autocast&) = delete;
  CudaBf16Autocast& operator=(const CudaBf16Autocast&) = delete;

 private:
  bool was_enabled_;
  at::ScalarType old_dtype_;
};

// Puts `kernel` first in line for scaled-dot-product attention in this process (LibTorch's choice is
// global): "cudnn" (cuDNN's fused attention; also for ""), "flash" (FlashAttention-2) or "torch"
// (LibTorch's own order: flash, memory-efficient, math, cuDNN). A kernel that cannot take given inputs
// (fp32, say) hands them to the next in line. "flash" also switches cuDNN's attention off (LibTorch
// would otherwise still pick it on Hopper); the others leave it as LibTorch had it. INVALID_ARGUMENT for
// another name.
absl::Status SelectAttentionKernel(const std::string& kernel);

// Scales the parameters' gradients so that their global L2 norm is at most `max_norm` (torch's
// clip_grad_norm_: coefficient max_norm / (norm + 1e-6), clamped to 1). `all_reduce_sum` adds the
// other stages' squared norms into the one-element fp32 tensor it is given (identity with one stage),
// so that every stage clips by the same, global, norm. Returns the norm before clipping.
double ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm,
                    const std::function<void(torch::Tensor&)>& all_reduce_sum);

// The cache holding `param`'s bf16 copy, or nullptr (CastCache registers its bf16 casts).
CastCache* CastCopyOf(const torch::Tensor& param);

// Fused AdamW over a set of parameters; state is created on first use. On CUDA, for fp32 parameters
// with contiguous, aligned gradients and state, one launch (adamw_kernels.h) updates every parameter as
// ATen's _fused_adamw_ does and writes its bf16 copy where a linear layer keeps one (CastCopyOf), so
// that the next forward's cast pass has nothing to do; `own_kernel` false (--fused_optimizer=false)
// and every other case: ATen's _fused_adamw_.
class FusedAdamW {
 public:
  FusedAdamW(std::vector<torch::Tensor> params, double lr = 1e-4, double beta1 = 0.9, double beta2 = 0.95,
             double eps = 1e-8, double weight_decay = 0.1, bool own_kernel = true);
  // Uses each parameter's .grad(); parameters without a gradient are skipped. With zero_grads, the
  // gradients the own kernel read are zeroed in the same pass (for a ZeroGrad(false) that follows: it
  // skips those).
  void Step(bool zero_grads = false);
  // Sets gradients to None; or, with set_to_none false, to zeros in place (allocating them if need be),
  // so that they keep their addresses (captured CUDA graphs accumulate into them).
  void ZeroGrad(bool set_to_none = true);

  // Parameter i's moments and step count (undefined before its first step), for checkpoints.
  struct ParamState {
    torch::Tensor exp_avg, exp_avg_sq, step;
  };
  ParamState State(size_t i) const { return {exp_avg_[i], exp_avg_sq_[i], steps_[i]}; }
  // Restores parameter i's state (copied to the parameter's device).
  void SetState(size_t i, const ParamState& s);
  size_t size() const { return params_.size(); }
  void set_lr(double lr) { lr_ = lr; }

 private:
  // The own kernel's step over `indices` (parameters of one CUDA device, fp32); false when a tensor
  // does not suit it (nothing done then: the caller runs ATen's).
  bool OwnStep(const std::vector<size_t>& indices, bool zero_grads);

  std::vector<torch::Tensor> params_, exp_avg_, exp_avg_sq_, steps_;
  double lr_, beta1_, beta2_, eps_, weight_decay_;
  bool own_kernel_;
  std::vector<bool> zeroed_;  // gradients the last Step zeroed
  // The own kernel's slice table on each device and what it was built from (rebuilt when that changes).
  struct SliceTable {
    torch::Tensor slices;
    std::vector<const void*> key;
    int64_t count = 0;
  };
  std::map<int, SliceTable> slice_tables_;
};

}  // namespace stagehand

#endif  // STAGEHAND_NN_NN_H_
