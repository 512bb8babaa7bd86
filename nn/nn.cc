// Building blocks for model families (see nn.h). LibTorch translation unit.
#include "nn/nn.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>

#include <array>
#include <cstring>
#include <atomic>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/adamw_kernels.h"
#include "kernels/bias_grad_kernels.h"
#include "kernels/embedding_kernels.h"
#include "kernels/fused_backward_kernels.h"
#include "kernels/fused_kernels.h"
#include "kernels/gelu_kernels.h"
#include "kernels/gemm_gelu.h"
#include "kernels/gemm_residual.h"
#include "kernels/lt_gemm.h"
#include "nn/attention_kernels.h"
#include "nn/model_options.h"

namespace stagehand {
namespace {

// Whether a tensor's data start on a 16-byte boundary (our kernels move 16 bytes at a time).
bool Aligned16(const torch::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// Where Dense backward sends its weight gradients instead of .grad (DeferWeightGrads), or null.
std::atomic<WeightGradQueue*> deferred_queue{nullptr};

// weight.grad += dy^T x, in the weight's dtype (fp32) whatever the dtype of dy and x. On CUDA one GEMM
// with bf16 inputs and an fp32 output (beta = 1) does it; elsewhere (CPU tests) a GEMM and an add.
void AccumulateWeightGrad(torch::Tensor& weight, const torch::Tensor& dy, const torch::Tensor& x) {
  torch::Tensor& grad = weight.mutable_grad();
  const at::ScalarType dtype = weight.scalar_type();
  const bool mixed = dy.scalar_type() != dtype;
  if (!grad.defined()) {
    grad = !mixed ? at::mm(dy.t(), x) : dy.is_cuda() ? at::mm(dy.t(), x, dtype) : at::mm(dy.t(), x).to(dtype);
  } else if (!mixed) {
    grad.addmm_(dy.t(), x);
  } else if (dy.is_cuda()) {
    at::addmm_out(grad, grad, dy.t(), x, dtype);
  } else {
    grad.add_(at::mm(dy.t(), x));
  }
}

// Where a kernel adds a parameter's gradient sums into its .grad itself: a CUDA fp32 leaf that needs a
// gradient, with an fp32 contiguous .grad of its shape (or none: one is made, uninitialised, and the
// kernel writes instead of adding). {nullptr, false} otherwise: the caller returns the sums to autograd.
struct GradSum {
  float* ptr = nullptr;
  bool accumulate = false;
};
GradSum GradSumInto(const torch::Tensor* param) {
  if (param == nullptr || !param->defined() || !param->is_cuda() || param->scalar_type() != torch::kFloat32 ||
      !param->is_leaf() || !param->requires_grad()) {
    return {};
  }
  torch::Tensor& g = param->mutable_grad();
  if (!g.defined()) {
    g = torch::empty_like(*param, torch::MemoryFormat::Contiguous);
    return {g.data_ptr<float>(), false};
  }
  if (g.scalar_type() != torch::kFloat32 || !g.is_contiguous() || g.sizes() != param->sizes() ||
      g.device() != param->device()) {
    return {};
  }
  return {g.data_ptr<float>(), true};
}

// Where a kernel writes [cols] fp32 sums: into's .grad where GradSumInto allows (then `sums` stays
// undefined, which the caller returns to autograd), else a new `sums` on like's device.
struct SumsOut {
  torch::Tensor sums;
  GradSum target;
  SumsOut(const torch::Tensor* into, int64_t cols, const torch::Tensor& like) {
    if (into != nullptr && into->defined() && into->numel() == cols) target = GradSumInto(into);
    if (target.ptr == nullptr) {
      sums = torch::empty({cols}, like.options().dtype(torch::kFloat32));
      target = {sums.data_ptr<float>(), false};
    }
  }
};

// The parameter saved under `key` by a forward (undefined when none was).
torch::Tensor SavedParam(torch::autograd::AutogradContext* ctx, const char* key) {
  auto it = ctx->saved_data.find(key);
  return it == ctx->saved_data.end() || !it->second.isTensor() ? torch::Tensor() : it->second.toTensor();
}

// {dy [rows, out] in the compute dtype, the bias's gradient (undefined unless want_bias)} of a linear
// layer's incoming gradient g: with `fused`, an fp32 g (the residual stream's) is cast to bf16 and
// summed in one pass (CastWithColumnSums), a bf16 one summed by ColumnSums; otherwise ATen's cast and
// reduce. The sums are in the parameter's dtype.
std::pair<torch::Tensor, torch::Tensor> GradientAndBiasGrad(const torch::Tensor& g, at::ScalarType compute,
                                                            at::ScalarType param, int64_t out, bool want_bias,
                                                            bool fused, const torch::Tensor* bias_param) {
  fused = fused && want_bias && param == torch::kFloat32;
  if (fused && compute == torch::kBFloat16 && g.scalar_type() == torch::kFloat32) {
    return CastWithColumnSums(g.reshape({-1, out}), bias_param);
  }
  torch::Tensor dy = g.to(compute).reshape({-1, out});
  if (!want_bias) return {dy, torch::Tensor()};
  if (fused && dy.scalar_type() == torch::kBFloat16) return {dy, ColumnSums(dy, bias_param)};
  return {dy, dy.sum(0, /*keepdim=*/false, param)};
}

// dx = dy W (where input x_index needs it) and the weight gradient (where input weight_index needs it:
// into .grad, or queued for zero-bubble's W under DeferWeightGrads).
torch::Tensor LinearInputAndWeightGrads(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                        const torch::Tensor& weight_c, torch::Tensor& weight, const torch::Tensor& dy,
                                        int x_index, int weight_index) {
  const int64_t in = weight_c.size(1);
  torch::Tensor dx;
  if (ctx->needs_input_grad(x_index)) dx = at::mm(dy, weight_c).view(x.sizes());
  if (ctx->needs_input_grad(weight_index)) {
    if (WeightGradQueue* q = deferred_queue.load(); q != nullptr) {
      q->Push(weight, dy, x.reshape({-1, in}));  // zero-bubble's W forms it later
    } else {
      AccumulateWeightGrad(weight, dy, x.reshape({-1, in}));
    }
  }
  return dx;
}

// What a linear layer's backward needs (LinearBackward), saved by its forward.
void SaveLinear(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight,
                const torch::Tensor& weight_c, const std::optional<torch::Tensor>& bias, bool fused_bias_grad) {
  ctx->save_for_backward({x, weight_c});
  ctx->saved_data["weight"] = weight;
  ctx->saved_data["has_bias"] = bias.has_value();
  if (bias.has_value()) ctx->saved_data["bias"] = *bias;
  ctx->saved_data["fused_bias_grad"] = fused_bias_grad;
}

// {dx, db} of a linear layer from its output's gradient and what SaveLinear kept, the weight's gradient
// into .grad (or queued); x_index, weight_index and bias_index are those inputs' places in the forward.
std::pair<torch::Tensor, torch::Tensor> LinearBackward(torch::autograd::AutogradContext* ctx, const torch::Tensor& grad,
                                                       int x_index, int weight_index, int bias_index) {
  const torch::autograd::variable_list saved = ctx->get_saved_variables();
  const torch::Tensor &x = saved[0], &weight_c = saved[1];
  torch::Tensor weight = ctx->saved_data["weight"].toTensor();
  const bool bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(bias_index);
  const torch::Tensor bias_param = SavedParam(ctx, "bias");
  auto [dy, db] = GradientAndBiasGrad(grad, weight_c.scalar_type(), weight.scalar_type(), weight_c.size(0), bias,
                                      ctx->saved_data["fused_bias_grad"].toBool(), &bias_param);
  return {LinearInputAndWeightGrads(ctx, x, weight_c, weight, dy, x_index, weight_index), db};
}

// y = x W^T + b with x, W and b already in the compute dtype, whose backward adds the weight gradient
// into the fp32 parameter's .grad itself (and so returns none for it).
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  // weight, bias: the parameters; x, weight_c, bias_c: in the compute dtype. Without a bias, both bias
  // arguments are nullopt (apply() takes no undefined tensors) and the edges after the weight's shift.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& weight_c, const std::optional<torch::Tensor>& bias_c,
                               bool fused_bias_grad) {
    SaveLinear(ctx, x, weight, weight_c, bias, fused_bias_grad);
    return at::linear(x, weight_c, bias_c);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [dx, db] = LinearBackward(ctx, grads[0], /*x=*/0, /*weight=*/1, /*bias=*/2);
    return {dx, torch::Tensor(), db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Dense's forward split into attention's q, k, v (DenseImpl::ForwardHeads): at::linear, then the views
// of [B, S, 3H] as [B, S, 3, NH, D] permuted to three [B, NH, S, D]. The backward writes dq, dk, dv into
// one [B, S, 3H] dy with the bias's column sums in the same pass (AssembleHeadsGrad), where the two
// separate functions (the linear's, the split's) take three strided copies, then ATen's reduce over dy.
class LinearHeadsFunction : public torch::autograd::Function<LinearHeadsFunction> {
 public:
  // As LinearFunction::forward, plus the number of heads.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                                                const torch::Tensor& weight_c,
                                                const std::optional<torch::Tensor>& bias_c, int64_t heads) {
    ctx->save_for_backward({x, weight_c});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["has_bias"] = bias.has_value();
    if (bias.has_value()) ctx->saved_data["bias"] = *bias;
    const torch::Tensor y = at::linear(x, weight_c, bias_c);
    const int64_t b = y.size(0), s = y.size(1), d = y.size(2) / 3 / heads;
    std::vector<torch::Tensor> parts = y.view({b, s, 3, heads, d}).permute({2, 0, 3, 1, 4}).unbind(0);
    return {parts[0], parts[1], parts[2]};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight_c = saved[1];
    torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    const int64_t out = weight_c.size(0);
    const bool bias = ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2);
    const torch::Tensor bias_param = SavedParam(ctx, "bias");
    auto [dqkv, db] = AssembleHeadsGrad(grads[0], grads[1], grads[2], bias, &bias_param);
    const torch::Tensor dy = dqkv.to(weight_c.scalar_type()).view({-1, out});
    if (db.defined()) db = db.to(weight.scalar_type());
    torch::Tensor dx = LinearInputAndWeightGrads(ctx, x, weight_c, weight, dy, 0, 1);
    return {dx, torch::Tensor(), db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// skip + x W^T + b in one GEMM (DenseImpl::ForwardResidual): x and W in bf16, b (bias_f32, may be
// undefined) and skip in fp32, the sum accumulated and written in fp32. Autocast's "skip + linear(x)"
// rounds the branch to bf16 before the add; this adds it in fp32 (the stream differs by bf16 rounding of
// the branch). With `cutlass`, our CUTLASS kernel where it takes the operands (gemm_residual.h); else, or
// where it refuses them (nothing was queued then), cuBLASLt's; where cuBLASLt refuses too (lt_gemm.h),
// the same sum from ATen's bf16 GEMM.
torch::Tensor LinearResidual(const torch::Tensor& x, const torch::Tensor& skip, const torch::Tensor& bias_f32,
                             const torch::Tensor& weight_c, bool cutlass) {
  const int64_t out = weight_c.size(0), in = weight_c.size(1), rows = x.numel() / in;
  torch::Tensor y = torch::empty(skip.sizes(), skip.options());
  if (cutlass) {  // x and weight_c are bf16 here (ForwardResidual); the kernel checks shape and alignment
    const cudaError_t e =
        GemmResidualFp32(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()),
                         reinterpret_cast<const uint16_t*>(weight_c.data_ptr<at::BFloat16>()),
                         bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr, skip.data_ptr<float>(),
                         y.data_ptr<float>(), rows, out, in, at::cuda::getCurrentCUDAStream());
    if (e == cudaSuccess) return y;
    // InvalidValue / NotSupported: refused before anything was queued; cuBLASLt's below instead.
    TORCH_CHECK(e == cudaErrorInvalidValue || e == cudaErrorNotSupported, "GemmResidualFp32: ", cudaGetErrorString(e));
  }
  const std::string error =
      LtLinearAddFp32(at::cuda::getCurrentCUDABlasLtHandle(), at::cuda::getCUDABlasLtWorkspace(),
                      at::cuda::getCUDABlasLtWorkspaceSize(), at::cuda::getCurrentCUDAStream(), x.data_ptr(),
                      weight_c.data_ptr(), bias_f32.defined() ? bias_f32.data_ptr<float>() : nullptr,
                      skip.data_ptr<float>(), y.data_ptr<float>(), rows, out, in);
  if (error.empty()) return y;
  torch::Tensor sum = skip + at::linear(x, weight_c).to(torch::kFloat32);
  return bias_f32.defined() ? sum + bias_f32 : sum;
}

// LinearResidual under autograd: the backward is LinearFunction's, and skip's gradient is the output's.
class LinearResidualFunction : public torch::autograd::Function<LinearResidualFunction> {
 public:
  // Without a bias, bias is nullopt (apply() takes no undefined tensors).
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& skip,
                               const torch::Tensor& weight, const std::optional<torch::Tensor>& bias,
                               const torch::Tensor& weight_c, bool fused_bias_grad, bool cutlass) {
    torch::Tensor bias_f32;  // the fp32 parameter (training keeps fp32 masters), or its upcast
    if (bias.has_value()) bias_f32 = bias->scalar_type() == torch::kFloat32 ? *bias : bias->to(torch::kFloat32);
    torch::Tensor y = LinearResidual(x, skip, bias_f32, weight_c, cutlass);
    SaveLinear(ctx, x, weight, weight_c, bias, fused_bias_grad);
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto [dx, db] = LinearBackward(ctx, grads[0], /*x=*/0, /*weight=*/2, /*bias=*/3);
    return {dx,
            ctx->needs_input_grad(1) ? grads[0] : torch::Tensor(),
            torch::Tensor(),
            db,
            torch::Tensor(),
            torch::Tensor(),
            torch::Tensor()};
  }
};

// LayerNorm of an fp32 input to a bf16 output in one kernel (fused_kernels.h): what bf16 autocast
// computes for a LayerNorm that feeds a GEMM (LayerNorm in fp32, then a cast), without the fp32 output's
// round trip through memory. The backward is ATen's LayerNorm backward on the fp32 input, with the
// incoming bf16 gradient upcast as the cast's backward would.
class LayerNormToBf16Function : public torch::autograd::Function<LayerNormToBf16Function> {
 public:
  // x: contiguous and 16-byte aligned (NormForGemm checks).
  // With `skip`, x comes back as a second output (the residual stream's path around the norm), so that
  // its gradient reaches this backward and is added to dx in the fused kernel's pass.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& bias, double eps,
                                                bool fused_backward, bool skip) {
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    std::vector<int64_t> stats_shape(x.sizes().begin(), x.sizes().end() - 1);
    stats_shape.push_back(1);  // the shape at::native_layer_norm gives its mean and rstd
    torch::Tensor y = torch::empty(x.sizes(), x.options().dtype(torch::kBFloat16));
    torch::Tensor mean = torch::empty(stats_shape, x.options()), rstd = torch::empty(stats_shape, x.options());
    const cudaError_t e =
        LayerNormToBf16(x.data_ptr<float>(), weight.data_ptr<float>(), bias.data_ptr<float>(),
                        reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), mean.data_ptr<float>(),
                        rstd.data_ptr<float>(), rows, cols, static_cast<float>(eps), at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "LayerNormToBf16: ", cudaGetErrorString(e));
    ctx->save_for_backward({x, weight, bias, mean, rstd});
    ctx->saved_data["fused_backward"] = fused_backward;
    ctx->saved_data["weight"] = weight;  // the parameters, whose .grad the fused backward adds into
    ctx->saved_data["bias"] = bias;
    if (skip) return {y, x};
    return {y};
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list s = ctx->get_saved_variables();
    const torch::Tensor &x = s[0], &weight = s[1], &bias = s[2], &mean = s[3], &rstd = s[4];
    const torch::Tensor skip_grad = grads.size() > 1 ? grads[1] : torch::Tensor();
    if (ctx->saved_data["fused_backward"].toBool()) {
      const torch::Tensor weight_param = ctx->needs_input_grad(1) ? SavedParam(ctx, "weight") : torch::Tensor();
      const torch::Tensor bias_param = ctx->needs_input_grad(2) ? SavedParam(ctx, "bias") : torch::Tensor();
      std::vector<torch::Tensor> fused =
          NormBackwardFromBf16(grads[0], x, weight, mean, rstd, skip_grad, &weight_param, &bias_param);
      if (!fused.empty()) return {fused[0], fused[1], fused[2], torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
    auto [dx, dweight, dbias] =
        at::native_layer_norm_backward(grads[0].to(torch::kFloat32), x, {x.size(-1)}, mean, rstd, weight, bias,
                                       {ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)});
    if (skip_grad.defined() && dx.defined()) dx = dx + skip_grad;
    return {dx, dweight, dbias, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Whether the one-GEMM forward (gemm_gelu.h) takes x [.., in] W[out, in] and b [out]: bf16, contiguous
// and aligned on an sm_90 GPU, in shapes its TMA loads take.
bool GemmGeluTakes(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) {
  const auto aligned = Aligned16;
  auto bf16 = [&](const torch::Tensor& t) {
    return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && aligned(t);
  };
  if (!bf16(x) || !bf16(w) || !bf16(b) || w.dim() != 2 || x.size(-1) != w.size(1) || b.numel() != w.size(0)) {
    return false;
  }
  return x.numel() > 0 && GemmGeluSupports(x.numel() / x.size(-1), w.size(0), w.size(1)) && GemmGeluAvailable();
}

// {gelu(x W^T + b), x W^T + b (only with keep_h)} in the compute dtype: one CUTLASS GEMM where it takes
// the inputs and `gemm` allows, else at::linear and at::gelu.
std::pair<torch::Tensor, torch::Tensor> LinearGeluForward(const torch::Tensor& x, const torch::Tensor& w,
                                                          const torch::Tensor& b, bool keep_h, bool gemm) {
  if (gemm && GemmGeluTakes(x, w, b)) {
    const int64_t n = w.size(0), k = w.size(1), m = x.numel() / k;
    std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
    shape.back() = n;
    torch::Tensor a = torch::empty(shape, x.options());
    torch::Tensor h = keep_h ? torch::empty(shape, x.options()) : torch::Tensor();
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
    const cudaError_t e = GemmBiasGelu(bits(x), bits(w), bits(b), bits(a), keep_h ? bits(h) : nullptr, m, n, k,
                                       at::cuda::getCurrentCUDAStream());
    if (e == cudaSuccess) return {a, h};
    // InvalidValue / NotSupported: refused before anything was queued; ATen's path below instead.
    TORCH_CHECK(e == cudaErrorInvalidValue || e == cudaErrorNotSupported, "GemmBiasGelu: ", cudaGetErrorString(e));
  }
  torch::Tensor h = at::linear(x, w, b);
  torch::Tensor a = at::gelu(h);
  return {a, keep_h ? h : torch::Tensor()};
}

// The column sums of fp32 partial rows [parts, cols] in `dtype`: our second pass (SumPartialRows) for
// fp32, into the .grad of `into` where GradSumInto allows (then undefined comes back); ATen's sum else.
torch::Tensor SumPartials(const torch::Tensor& partial, at::ScalarType dtype, const torch::Tensor* into) {
  if (!partial.is_cuda() || dtype != torch::kFloat32 || partial.scalar_type() != torch::kFloat32 ||
      !partial.is_contiguous() || partial.dim() != 2) {
    return partial.sum(0, /*keepdim=*/false, dtype);
  }
  const int64_t parts = partial.size(0), cols = partial.size(1);
  const SumsOut out(into, cols, partial);
  const cudaError_t e = SumPartialRows(partial.data_ptr<float>(), out.target.ptr, parts, cols, out.target.accumulate,
                                       at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "SumPartialRows: ", cudaGetErrorString(e));
  return out.sums;
}

// {dh = da * gelu'(h), db = the column sums of dh in `db_dtype`} for da and h [rows, cols]: one kernel
// (gelu_kernels.h) for bf16 on CUDA, then a sum over its few partial rows; else ATen's.
std::pair<torch::Tensor, torch::Tensor> GeluBackwardWithBias(const torch::Tensor& da, const torch::Tensor& h,
                                                             at::ScalarType db_dtype, const torch::Tensor* into) {
  const auto aligned = Aligned16;
  auto takes = [&](const torch::Tensor& t) {
    return t.is_cuda() && t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && aligned(t);
  };
  const int64_t rows = h.size(0), cols = h.size(1);
  if (takes(da) && takes(h) && da.sizes() == h.sizes() && GeluBackwardSupports(cols)) {
    torch::Tensor dh = torch::empty_like(h);
    torch::Tensor partial = torch::empty({GeluBackwardPartials(rows), cols}, h.options().dtype(torch::kFloat32));
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>()); };
    const cudaError_t e = GeluBackwardBias(bits(da), bits(h), bits(dh), partial.data_ptr<float>(), rows, cols,
                                           at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "GeluBackwardBias: ", cudaGetErrorString(e));
    return {dh, SumPartials(partial, db_dtype, into)};
  }
  torch::Tensor dh = at::gelu_backward(da, h);
  return {dh, dh.sum(0, /*keepdim=*/false, db_dtype)};
}

// gelu(x W^T + b) with x, W and b in the compute dtype (LinearFunction's arguments, a bias required),
// saving the pre-activation h instead of leaving it to a separate GELU node. The backward forms dh and
// the bias gradient in one pass (GeluBackwardWithBias), then dx and the weight gradient as
// LinearFunction does, the weight's through the same (weight, dy, x) accumulation or deferred queue.
class LinearGeluFunction : public torch::autograd::Function<LinearGeluFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& weight_c,
                               const torch::Tensor& bias_c, bool gemm) {
    auto [a, h] = LinearGeluForward(x, weight_c, bias_c, /*keep_h=*/true, gemm);
    ctx->save_for_backward({x, weight_c, h});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
    return a;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight_c = saved[1], &h = saved[2];
    torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    const int64_t out = weight_c.size(0);
    const torch::Tensor da = grads[0].to(weight_c.scalar_type()).contiguous().view({-1, out});
    const torch::Tensor bias_param = ctx->needs_input_grad(2) ? SavedParam(ctx, "bias") : torch::Tensor();
    auto [dy, db] = GeluBackwardWithBias(da, h.view({-1, out}), weight.scalar_type(), &bias_param);
    torch::Tensor dx = LinearInputAndWeightGrads(ctx, x, weight_c, weight, dy, 0, 1);
    if (!ctx->needs_input_grad(2)) db = torch::Tensor();
    return {dx, torch::Tensor(), db, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

void WeightGradQueue::Push(torch::Tensor weight, torch::Tensor dy, torch::Tensor x) {
  absl::MutexLock lock(&mu_);
  entries_.push_back({std::move(weight), std::move(dy), std::move(x)});
}

void WeightGradQueue::Apply() {
  std::vector<Entry> entries;
  {
    absl::MutexLock lock(&mu_);
    entries.swap(entries_);
  }
  torch::NoGradGuard no_grad;
  for (Entry& e : entries) AccumulateWeightGrad(e.weight, e.dy, e.x);
}

size_t WeightGradQueue::size() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

int64_t WeightGradQueue::bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const Entry& e : entries_) n += static_cast<int64_t>(e.dy.nbytes() + e.x.nbytes());
  return n;
}

DeferWeightGrads::DeferWeightGrads(WeightGradQueue* queue) : previous_(deferred_queue.exchange(queue)) {}

DeferWeightGrads::~DeferWeightGrads() { deferred_queue.store(previous_); }

torch::Tensor DeferredSplitBackward::BackwardInput(const torch::Tensor& input, const torch::Tensor& output,
                                                   const torch::Tensor& grad_output) {
  // A key left by a micro-batch whose W never ran (a failed step) and whose output's address came back
  // is stale: start afresh.
  pending_.erase(output.unsafeGetTensorImpl());
  WeightGradQueue& queue = pending_[output.unsafeGetTensorImpl()];
  torch::autograd::variable_list grads;
  if (grad_output.defined()) grads.push_back(grad_output);
  {
    DeferWeightGrads route(&queue);
    torch::autograd::backward({output}, grads);  // every leaf: the input (when it wants one) and parameters
  }
  return input.defined() && input.requires_grad() ? input.grad() : torch::Tensor();
}

bool DeferredSplitBackward::BackwardWeight(const torch::Tensor& output) {
  auto it = pending_.find(output.unsafeGetTensorImpl());
  if (it == pending_.end()) return false;
  it->second.Apply();
  pending_.erase(it);
  return true;
}

int64_t DeferredSplitBackward::pending_bytes() const {
  int64_t n = 0;
  for (const auto& [key, queue] : pending_) n += queue.bytes();
  return n;
}

at::Generator LayerGenerator(uint64_t seed, int layer, const torch::Device& device) {
  const uint64_t s = seed * 1000003ULL + static_cast<uint64_t>(layer);
  if (!device.is_cuda()) return at::make_generator<at::CPUGeneratorImpl>(s);
  at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());  // -1: the current device
  gen.set_current_seed(s);
  return gen;
}

std::vector<torch::Tensor> NormBackwardFromBf16(const torch::Tensor& dy, const torch::Tensor& x,
                                                const torch::Tensor& weight, const torch::Tensor& mean,
                                                const torch::Tensor& rstd, const torch::Tensor& residual,
                                                const torch::Tensor* weight_param, const torch::Tensor* bias_param) {
  const auto aligned = Aligned16;
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  if (!dy.defined() || !dy.is_cuda() || dy.scalar_type() != torch::kBFloat16 || !dy.is_contiguous() ||
      dy.sizes() != x.sizes() || !aligned(dy) || x.scalar_type() != torch::kFloat32 || !x.is_contiguous() ||
      !aligned(x) || weight.scalar_type() != torch::kFloat32 || !weight.is_contiguous() || !aligned(weight) ||
      !rstd.is_contiguous() || (mean.defined() && !mean.is_contiguous()) || !NormBackwardSupports(cols) ||
      (residual.defined() && (residual.scalar_type() != torch::kFloat32 || !residual.is_contiguous() ||
                              residual.sizes() != x.sizes() || !aligned(residual)))) {
    return {};
  }
  const int64_t parts = NormBackwardPartials(rows, cols);
  torch::Tensor dx = torch::empty_like(x);
  torch::Tensor dgamma = torch::empty({parts, cols}, x.options());
  torch::Tensor dbeta = mean.defined() ? torch::empty({parts, cols}, x.options()) : torch::Tensor();
  const cudaError_t e = NormBackward(
      reinterpret_cast<const uint16_t*>(dy.data_ptr<at::BFloat16>()), x.data_ptr<float>(), weight.data_ptr<float>(),
      mean.defined() ? mean.data_ptr<float>() : nullptr, rstd.data_ptr<float>(),
      residual.defined() ? residual.data_ptr<float>() : nullptr, dx.data_ptr<float>(), dgamma.data_ptr<float>(),
      mean.defined() ? dbeta.data_ptr<float>() : nullptr, rows, cols, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "NormBackward: ", cudaGetErrorString(e));
  return {dx, SumPartials(dgamma, torch::kFloat32, weight_param),
          mean.defined() ? SumPartials(dbeta, torch::kFloat32, bias_param) : torch::Tensor()};
}

// ln(x) as the input of a GEMM: with `fused` under bf16 autocast on CUDA, fused with the cast to bf16
// that the GEMM would make; otherwise (CPU, fp32, inputs the kernel does not take) the LayerNorm module.
// Whether the fused LayerNorm takes x (else the module runs).
bool FusesLayerNorm(torch::nn::LayerNorm& ln, const torch::Tensor& x, bool fused) {
  const auto aligned = Aligned16;
  const bool fuse = fused && x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous() && aligned(x) &&
                    at::autocast::is_autocast_enabled(at::kCUDA) &&
                    at::autocast::get_autocast_dtype(at::kCUDA) == at::kBFloat16 && ln->weight.defined() &&
                    ln->bias.defined() && ln->weight.scalar_type() == torch::kFloat32 && aligned(ln->weight) &&
                    aligned(ln->bias) && LayerNormToBf16Supports(x.size(-1));
  return fuse;
}

torch::Tensor NormForGemm(torch::nn::LayerNorm& ln, const torch::Tensor& x, bool fused, bool fused_backward) {
  if (!FusesLayerNorm(ln, x, fused)) return ln(x);
  return LayerNormToBf16Function::apply(x, ln->weight, ln->bias, ln->options.eps(), fused_backward, false)[0];
}

std::pair<torch::Tensor, torch::Tensor> NormForGemmWithSkip(torch::nn::LayerNorm& ln, const torch::Tensor& x,
                                                            bool fused, bool fused_backward, bool fused_skip) {
  if (!fused_skip || !fused_backward || !torch::GradMode::is_enabled() || !FusesLayerNorm(ln, x, fused)) {
    return {NormForGemm(ln, x, fused, fused_backward), x};
  }
  torch::autograd::variable_list out =
      LayerNormToBf16Function::apply(x, ln->weight, ln->bias, ln->options.eps(), fused_backward, true);
  return {out[0], out[1]};
}

DenseImpl::Operands DenseImpl::InComputeDtype(const torch::Tensor& x) {
  const c10::DeviceType device = x.device().type();
  const bool autocast = at::autocast::is_autocast_enabled(device);
  const at::ScalarType dtype = autocast ? at::autocast::get_autocast_dtype(device) : weight.scalar_type();
  Operands o;
  o.x = x.scalar_type() == dtype ? x : x.to(dtype);
  o.w = dtype == weight.scalar_type() ? weight : weight_cast_.Get(weight, dtype);
  if (bias.defined()) {
    o.b = dtype == bias.scalar_type() ? bias : bias_cast_.Get(bias, dtype);
    o.bias_param = bias;
  }
  return o;
}

torch::Tensor DenseImpl::forward(const torch::Tensor& x) {
  const Operands o = InComputeDtype(x);
  // at::linear, not F::linear: for [B, S, in] inputs the C++ frontend's F::linear does a matmul and
  // then a separate bias add, where at::linear folds the bias into the GEMM as Python does.
  if (!torch::GradMode::is_enabled() || !(o.x.requires_grad() || weight.requires_grad())) {
    return at::linear(o.x, o.w, o.b);
  }
  return LinearFunction::apply(o.x, weight, o.bias_param, o.w, o.b, fused_bias_grad_);
}

std::vector<torch::Tensor> DenseImpl::ForwardHeads(const torch::Tensor& x, int64_t heads) {
  TORCH_CHECK(x.dim() == 3 && weight.size(0) % (3 * heads) == 0, "ForwardHeads takes [B, S, in] into 3 x ", heads,
              " heads, got ", x.sizes(), " into ", weight.size(0));
  const Operands o = InComputeDtype(x);
  if (!torch::GradMode::is_enabled() || !(o.x.requires_grad() || weight.requires_grad())) {
    const torch::Tensor y = at::linear(o.x, o.w, o.b);
    return y.view({y.size(0), y.size(1), 3, heads, -1}).permute({2, 0, 3, 1, 4}).unbind(0);
  }
  return LinearHeadsFunction::apply(o.x, weight, o.bias_param, o.w, o.b, heads);
}

void SetDenseFusedBiasGrad(torch::nn::Module& root, bool on) {
  for (const auto& module : root.modules(/*include_self=*/false)) {
    if (auto* dense = dynamic_cast<DenseImpl*>(module.get()); dense != nullptr) dense->set_fused_bias_grad(on);
  }
}

namespace {

// Whether the column-sum kernels take x [rows, cols] of `dtype` (else the callers use ATen).
bool ColumnKernelTakes(const torch::Tensor& x, at::ScalarType dtype) {
  return x.defined() && x.is_cuda() && x.dim() == 2 && x.scalar_type() == dtype && x.is_contiguous() && x.size(0) > 0 &&
         ColumnSumsSupports(x.size(1)) && Aligned16(x);
}

// [ColumnSumPartials, cols] fp32 scratch on x's device, and where the kernel writes the sums (SumsOut).
struct SumBuffers : SumsOut {
  torch::Tensor partial;
  SumBuffers(const torch::Tensor& x, int64_t rows, int64_t cols, const torch::Tensor* into)
      : SumsOut(into, cols, x),
        partial(torch::empty({ColumnSumPartials(rows, cols), cols}, x.options().dtype(torch::kFloat32))) {}
};

}  // namespace

torch::Tensor ColumnSums(const torch::Tensor& x, const torch::Tensor* into) {
  if (!ColumnKernelTakes(x, torch::kBFloat16)) {
    return x.sum(0, /*keepdim=*/false, at::promote_types(x.scalar_type(), torch::kFloat32));
  }
  const int64_t rows = x.size(0), cols = x.size(1);
  const SumBuffers b(x, rows, cols, into);
  const cudaError_t e =
      ColumnSumsBf16(reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>()), b.partial.data_ptr<float>(),
                     b.target.ptr, rows, cols, at::cuda::getCurrentCUDAStream(), b.target.accumulate);
  TORCH_CHECK(e == cudaSuccess, "ColumnSumsBf16: ", cudaGetErrorString(e));
  return b.sums;
}

std::pair<torch::Tensor, torch::Tensor> CastWithColumnSums(const torch::Tensor& g, const torch::Tensor* into) {
  if (!ColumnKernelTakes(g, torch::kFloat32)) {
    torch::Tensor y = g.to(torch::kBFloat16);
    return {y, y.sum(0, /*keepdim=*/false, torch::kFloat32)};
  }
  const int64_t rows = g.size(0), cols = g.size(1);
  torch::Tensor y = torch::empty({rows, cols}, g.options().dtype(torch::kBFloat16));
  const SumBuffers b(g, rows, cols, into);
  const cudaError_t e = CastBf16WithColumnSums(
      g.data_ptr<float>(), reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>()), b.partial.data_ptr<float>(),
      b.target.ptr, rows, cols, at::cuda::getCurrentCUDAStream(), b.target.accumulate);
  TORCH_CHECK(e == cudaSuccess, "CastBf16WithColumnSums: ", cudaGetErrorString(e));
  return {y, b.sums};
}

std::pair<torch::Tensor, torch::Tensor> AssembleHeadsGrad(const torch::Tensor& dq, const torch::Tensor& dk,
                                                          const torch::Tensor& dv, bool sums,
                                                          const torch::Tensor* into) {
  const std::array<const torch::Tensor*, 3> g = {&dq, &dk, &dv};
  const torch::Tensor* any = nullptr;
  for (const torch::Tensor* t : g) any = t->defined() ? t : any;
  TORCH_CHECK(any != nullptr && any->dim() == 4, "AssembleHeadsGrad takes q, k, v gradients [B, NH, S, D]");
  const int64_t b = any->size(0), heads = any->size(1), s = any->size(2), d = any->size(3);
  bool kernel = sums;
  for (const torch::Tensor* t : g) {
    kernel = kernel && t->defined() && t->is_cuda() && t->scalar_type() == torch::kBFloat16 &&
             t->sizes() == any->sizes() && t->stride(3) == 1 && t->stride(0) % 8 == 0 && t->stride(1) % 8 == 0 &&
             t->stride(2) % 8 == 0 && Aligned16(*t);
  }
  kernel = kernel && d % 8 == 0 && b * s > 0;
  if (!kernel) {
    torch::Tensor dqkv = torch::empty({b, s, 3, heads, d}, any->options());
    for (int i = 0; i < 3; ++i) {
      torch::Tensor slot = dqkv.select(2, i);  // [B, S, NH, D]
      if (g[i]->defined()) {
        slot.copy_(g[i]->transpose(1, 2));
      } else {
        slot.zero_();
      }
    }
    dqkv = dqkv.view({b, s, 3 * heads * d});
    if (!sums) return {dqkv, torch::Tensor()};
    // fp32 sums of bf16 or fp32 gradients, as the kernel's; float64 ones (the CPU gradient checks) in float64.
    const at::ScalarType sum_type = at::promote_types(dqkv.scalar_type(), torch::kFloat32);
    return {dqkv, dqkv.view({b * s, -1}).sum(0, /*keepdim=*/false, sum_type)};
  }
  torch::Tensor dqkv = torch::empty({b, s, 3 * heads * d}, any->options());
  const SumBuffers buffers(dqkv, b * s, 3 * heads * d, into);
  HeadsGradView views[3];
  for (int i = 0; i < 3; ++i) {
    views[i] = {reinterpret_cast<const uint16_t*>(g[i]->data_ptr<at::BFloat16>()), g[i]->stride(0), g[i]->stride(1),
                g[i]->stride(2)};
  }
  const cudaError_t e =
      AssembleHeadsGradWithColumnSums(views, b, heads, s, d, reinterpret_cast<uint16_t*>(dqkv.data_ptr<at::BFloat16>()),
                                      buffers.partial.data_ptr<float>(), buffers.target.ptr,
                                      at::cuda::getCurrentCUDAStream(), buffers.target.accumulate);
  TORCH_CHECK(e == cudaSuccess, "AssembleHeadsGradWithColumnSums: ", cudaGetErrorString(e));
  return {dqkv, buffers.sums};
}

torch::Tensor DenseImpl::ForwardResidual(const torch::Tensor& x, const torch::Tensor& skip, ResidualGemm gemm) {
  const bool autocast = x.is_cuda() && at::autocast::is_autocast_enabled(c10::DeviceType::CUDA) &&
                        at::autocast::get_autocast_dtype(c10::DeviceType::CUDA) == at::kBFloat16;
  const int64_t out = weight.size(0), in = weight.size(1);
  // The GEMM reads x, the weight and skip as given: contiguous rows, skip in fp32 of the output's shape.
  if (gemm == ResidualGemm::kOff || !autocast || !LtAvailable() || skip.scalar_type() != torch::kFloat32 ||
      !skip.is_contiguous() || skip.size(-1) != out || x.size(-1) != in || skip.numel() / out != x.numel() / in ||
      x.numel() == 0) {
    return skip + forward(x);
  }
  const torch::Tensor& w = weight.scalar_type() == at::kBFloat16 ? weight : weight_cast_.Get(weight, at::kBFloat16);
  const torch::Tensor xc = (x.scalar_type() == at::kBFloat16 ? x : x.to(at::kBFloat16)).contiguous();
  std::optional<torch::Tensor> bias_param;
  if (bias.defined()) bias_param = bias;
  if (!torch::GradMode::is_enabled() || !(xc.requires_grad() || skip.requires_grad() || weight.requires_grad())) {
    torch::NoGradGuard no_grad;
    // Inference lowers the bias to bf16 (LowerDenseWeights): its fp32 copy is made once and kept, so
    // the product's plan (keyed by the bias's address, lt_gemm.h) is made once too.
    torch::Tensor bias_f32;
    if (bias.defined())
      bias_f32 = bias.scalar_type() == torch::kFloat32 ? bias : bias_f32_cast_.Get(bias, torch::kFloat32);
    return LinearResidual(xc, skip, bias_f32, w, gemm == ResidualGemm::kCutlass);
  }
  return LinearResidualFunction::apply(xc, skip, weight, bias_param, w, fused_bias_grad_,
                                       gemm == ResidualGemm::kCutlass);
}

namespace {

class EmbeddingFunction : public torch::autograd::Function<EmbeddingFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& weight,
                               const torch::Tensor& tokens) {
    ctx->save_for_backward({tokens});
    ctx->saved_data["weight"] = weight;
    return torch::embedding(weight, tokens);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined() || !ctx->needs_input_grad(0)) return {torch::Tensor(), torch::Tensor()};
    torch::Tensor weight = ctx->saved_data["weight"].toTensor();
    const torch::Tensor ids = ctx->get_saved_variables()[0].reshape({-1});
    const int64_t cols = weight.size(1);
    torch::Tensor g = grads[0].to(weight.scalar_type()).contiguous().view({-1, cols});
    if (!Aligned16(g)) g = g.clone();  // a view at an odd offset
    torch::NoGradGuard no_grad;
    torch::Tensor& grad = weight.mutable_grad();
    if (grad.defined() && (grad.scalar_type() != torch::kFloat32 || !grad.is_contiguous() ||
                           grad.sizes() != weight.sizes() || !Aligned16(grad))) {
      // A .grad the kernel cannot write: ATen's dense gradient, for autograd to add.
      return {at::embedding_dense_backward(g, ids, weight.size(0), -1, false), torch::Tensor()};
    }
    auto [sorted, order] = at::sort(ids, /*stable=*/true, /*dim=*/0, /*descending=*/false);
    if (!grad.defined()) grad = torch::zeros_like(weight, torch::MemoryFormat::Contiguous);
    const cudaError_t e =
        EmbeddingGradAccumulate(sorted.data_ptr<int64_t>(), order.data_ptr<int64_t>(), g.data_ptr<float>(),
                                grad.data_ptr<float>(), ids.numel(), cols, at::cuda::getCurrentCUDAStream());
    TORCH_CHECK(e == cudaSuccess, "EmbeddingGradAccumulate: ", cudaGetErrorString(e));
    return {torch::Tensor(), torch::Tensor()};  // the weight's gradient is in .grad already
  }
};

}  // namespace

torch::Tensor EmbeddingLookup(const torch::Tensor& weight, const torch::Tensor& tokens, bool fused) {
  const bool takes = fused && weight.is_cuda() && weight.scalar_type() == torch::kFloat32 && weight.dim() == 2 &&
                     weight.is_contiguous() && weight.size(1) % 4 == 0 && torch::GradMode::is_enabled() &&
                     weight.requires_grad() && weight.is_leaf();
  if (!takes) return torch::embedding(weight, tokens);
  return EmbeddingFunction::apply(weight, tokens);
}

namespace {

// Parameter (its TensorImpl) -> the cache of its bf16 copy.
ABSL_CONST_INIT absl::Mutex cast_copies_mu(absl::kConstInit);
std::map<const c10::TensorImpl*, CastCache*>& CastCopies() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cast_copies_mu) {
  static auto* copies = new std::map<const c10::TensorImpl*, CastCache*>();
  return *copies;
}

}  // namespace

void CastCache::Register(const torch::Tensor& param) {
  absl::MutexLock lock(&cast_copies_mu);
  CastCopies()[param.unsafeGetTensorImpl()] = this;
}

CastCache& CastCache::operator=(const CastCache&) {
  cast_ = torch::Tensor();  // as a copy: empty (the registry's entry for it finds no buffer)
  version_ = -1;
  source_ = nullptr;
  return *this;
}

CastCache::~CastCache() {
  absl::MutexLock lock(&cast_copies_mu);
  auto& copies = CastCopies();
  for (auto it = copies.begin(); it != copies.end();) it = it->second == this ? copies.erase(it) : std::next(it);
}

CastCache* CastCopyOf(const torch::Tensor& param) {
  absl::MutexLock lock(&cast_copies_mu);
  auto& copies = CastCopies();
  auto it = copies.find(param.unsafeGetTensorImpl());
  return it == copies.end() ? nullptr : it->second;
}

void CastBatch::Add(CastCache& cache, const torch::Tensor& param, at::ScalarType dtype) {
  torch::Tensor* buffer = cache.StaleBuffer(param, dtype);
  if (buffer == nullptr) {
    cache.Get(param, dtype);
    return;
  }
  buffers.push_back(*buffer);
  params.push_back(param);
  caches.push_back(&cache);
}

void CastBatch::Run() {
  if (buffers.empty()) return;
  {
    torch::NoGradGuard no_grad;
    // A different source dtype is allowed (ATen's multi-tensor copy dispatches on both); tensors on
    // several devices or of other layouts take ATen's per-tensor path, with the same values.
    at::_foreach_copy_(buffers, params);
  }
  for (size_t i = 0; i < caches.size(); ++i) caches[i]->MarkFresh(params[i]);
  buffers.clear();
  params.clear();
  caches.clear();
}

void RefreshDenseCasts(torch::nn::Module& root, at::ScalarType dtype) {
  CastBatch batch;
  for (const auto& module : root.modules(/*include_self=*/false)) {
    auto* dense = dynamic_cast<DenseImpl*>(module.get());
    if (dense != nullptr && dense->weight.is_cuda()) dense->AddCasts(dtype, batch);
  }
  batch.Run();
}

void LowerDenseWeights(torch::nn::Module& root, at::ScalarType dtype) {
  torch::NoGradGuard no_grad;
  for (const auto& module : root.modules(/*include_self=*/false)) {
    auto* dense = dynamic_cast<DenseImpl*>(module.get());
    if (dense == nullptr || !dense->weight.is_cuda()) continue;
    dense->weight.set_data(dense->weight.detach().to(dtype));
    if (dense->bias.defined()) dense->bias.set_data(dense->bias.detach().to(dtype));
  }
}

bool LowersDenseWeights(const JobSpec& job, const torch::Device& device, bool bf16_autocast) {
  const bool on = ModelOptionOn(job.model_spec(), "inference_bf16_weights");
  // Not when the weights are written out (--save_params, --export_dir): those keep fp32.
  return on && device.is_cuda() && bf16_autocast && job.pipeline().inference() && !job.save_params() &&
         job.export_dir().empty();
}

torch::Tensor DenseImpl::ForwardGelu(const torch::Tensor& x, bool fused, bool gemm) {
  if (!fused || !bias.defined()) return at::gelu(forward(x));
  const Operands o = InComputeDtype(x);
  if (!torch::GradMode::is_enabled() || !(o.x.requires_grad() || weight.requires_grad() || bias.requires_grad())) {
    return LinearGeluForward(o.x, o.w, *o.b, /*keep_h=*/false, gemm).first;
  }
  return LinearGeluFunction::apply(o.x, weight, bias, o.w, *o.b, gemm);
}

absl::Status SelectAttentionKernel(const std::string& kernel) {
  using B = at::SDPBackend;
  using Order = std::array<B, at::num_sdp_backends>;
  // LibTorch's own order, as it stood before any choice here.
  static const Order initial = at::globalContext().sDPPriorityOrder();
  Order order;
  if (kernel == "cudnn" || kernel.empty()) {
    // For gpt-1.3b's shapes on an H200 (bf16, 16 heads of 128, causal, 1024 tokens), cuDNN's forward
    // takes 50 us per 4 sequences where FlashAttention-2 takes 93 (bench/probes/gpt_block_parts.py).
    order = {B::cudnn_attention, B::flash_attention, B::efficient_attention, B::math, B::overrideable};
  } else if (kernel == "flash") {
    order = {B::flash_attention, B::efficient_attention, B::math, B::cudnn_attention, B::overrideable};
  } else if (kernel == "torch") {
    order = initial;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("attention kernel ", kernel, ": unknown; use ", AttentionKernelChoices()));
  }
  std::vector<int64_t> v;
  for (B b : order) v.push_back(static_cast<int64_t>(b));
  at::globalContext().setSDPPriorityOrder(v);
  // The order alone does not keep cuDNN out: LibTorch puts cuDNN first on Hopper by itself, so a gpt-1.3b
  // job with --attention=flash would run cuDNN's attention kernels on an H200
  // (bench/results/attention-prebuild-h200-2026-12-03.md). So "flash" also switches cuDNN's attention off, and
  // the others keep LibTorch's own setting.
  static const bool cudnn_initially = at::globalContext().userEnabledCuDNNSDP();
  at::globalContext().setSDPUseCuDNN(kernel == "flash" ? false : cudnn_initially);
  return absl::OkStatus();
}

FusedAdamW::FusedAdamW(std::vector<torch::Tensor> params, double lr, double beta1, double beta2, double eps,
                       double weight_decay, bool own_kernel)
    : params_(std::move(params)),
      lr_(lr),
      beta1_(beta1),
      beta2_(beta2),
      eps_(eps),
      weight_decay_(weight_decay),
      own_kernel_(own_kernel) {
  exp_avg_.resize(params_.size());
  exp_avg_sq_.resize(params_.size());
  steps_.resize(params_.size());
  zeroed_.assign(params_.size(), false);
}

bool FusedAdamW::OwnStep(const std::vector<size_t>& indices, bool zero_grads) {
  auto suits = [](const torch::Tensor& t, const torch::Tensor& like) {
    return t.defined() && t.is_cuda() && t.scalar_type() == torch::kFloat32 && t.is_contiguous() &&
           t.device() == like.device() && t.sizes() == like.sizes() && Aligned16(t);
  };
  std::vector<const void*> key;
  std::vector<CastCache*> caches(indices.size(), nullptr);
  std::vector<uint16_t*> copies(indices.size(), nullptr);
  for (size_t j = 0; j < indices.size(); ++j) {
    const size_t i = indices[j];
    const torch::Tensor& p = params_[i];
    if (!suits(p, p) || !suits(p.grad(), p) || !suits(exp_avg_[i], p) || !suits(exp_avg_sq_[i], p)) return false;
    if (CastCache* cache = CastCopyOf(p); cache != nullptr) {
      if (torch::Tensor* buffer = cache->CopyBuffer(p); buffer != nullptr && Aligned16(*buffer)) {
        caches[j] = cache;
        copies[j] = reinterpret_cast<uint16_t*>(buffer->data_ptr());
      }
    }
    for (const void* q :
         std::initializer_list<const void*>{p.data_ptr(), p.grad().data_ptr(), exp_avg_[i].data_ptr(),
                                            exp_avg_sq_[i].data_ptr(), copies[j], steps_[i].data_ptr()}) {
      key.push_back(q);
    }
    key.push_back(reinterpret_cast<const void*>(static_cast<uintptr_t>(p.numel())));
  }
  const int device = params_[indices[0]].device().index();
  SliceTable& table = slice_tables_[device];
  if (key != table.key || !table.slices.defined()) {
    std::vector<AdamWSlice> slices;
    for (size_t j = 0; j < indices.size(); ++j) {
      const size_t i = indices[j];
      const torch::Tensor& p = params_[i];
      for (int64_t b = 0; b < p.numel(); b += kAdamWSliceElements) {
        slices.push_back({p.data_ptr<float>(), p.grad().data_ptr<float>(), exp_avg_[i].data_ptr<float>(),
                          exp_avg_sq_[i].data_ptr<float>(), copies[j], steps_[i].data_ptr<float>(), b,
                          std::min(p.numel(), b + kAdamWSliceElements)});
      }
    }
    const int64_t bytes = static_cast<int64_t>(slices.size() * sizeof(AdamWSlice));
    // Through pinned memory, queued on the stream: no host synchronisation, also where the addresses
    // change every step (gradients set to None between steps, without CUDA graphs). The caching host
    // allocator keeps the pinned block until the copy is done.
    torch::Tensor host = torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
    std::memcpy(host.data_ptr(), slices.data(), static_cast<size_t>(bytes));
    table.slices =
        torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(params_[indices[0]].device()));
    table.slices.copy_(host, /*non_blocking=*/true);
    table.key = std::move(key);
    table.count = static_cast<int64_t>(slices.size());
  }
  const cudaError_t e = AdamWStep(reinterpret_cast<const AdamWSlice*>(table.slices.data_ptr()), table.count, lr_,
                                  beta1_, beta2_, weight_decay_, eps_, zero_grads, at::cuda::getCurrentCUDAStream());
  TORCH_CHECK(e == cudaSuccess, "AdamWStep: ", cudaGetErrorString(e));
  for (size_t j = 0; j < indices.size(); ++j) {
    const torch::Tensor& p = params_[indices[j]];
    torch::autograd::impl::bump_version(p);  // as below: the copies keyed on it see the update
    if (caches[j] != nullptr) {
      caches[j]->MarkFresh(p);  // ... and the copy written here is current
      // The copy changed in place, as copy_ would have marked it (a graph that saved it then fails).
      if (torch::Tensor* buffer = caches[j]->CopyBuffer(p); buffer != nullptr)
        torch::autograd::impl::bump_version(*buffer);
    }
    zeroed_[indices[j]] = zero_grads;
  }
  return true;
}

void FusedAdamW::Step(bool zero_grads) {
  torch::NoGradGuard no_grad;
  // One fused call per (device, dtype): the kernel wants every list on one device, in one dtype.
  struct Group {
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    std::vector<size_t> indices;
  };
  std::map<std::tuple<int, int, int>, Group> groups;
  for (size_t i = 0; i < params_.size(); ++i) {
    const torch::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    if (!steps_[i].defined()) {  // state is created on first use, where the parameter lives then
      exp_avg_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      exp_avg_sq_[i] = torch::zeros_like(p, torch::MemoryFormat::Preserve);
      steps_[i] = torch::zeros({}, p.options().dtype(torch::kFloat32));
    }
    Group& g = groups[{static_cast<int>(p.device().type()), p.device().index(), static_cast<int>(p.scalar_type())}];
    g.params.push_back(p);
    g.grads.push_back(p.grad());
    g.exp_avgs.push_back(exp_avg_[i]);
    g.exp_avg_sqs.push_back(exp_avg_sq_[i]);
    g.steps.push_back(steps_[i]);
    g.indices.push_back(i);
  }
  for (auto& [key, g] : groups) {
    at::_foreach_add_(g.steps, 1);  // the kernel reads the step count; as torch.optim, we advance it
    if (own_kernel_ && std::get<0>(key) == static_cast<int>(c10::DeviceType::CUDA) &&
        std::get<2>(key) == static_cast<int>(torch::kFloat32) && OwnStep(g.indices, zero_grads)) {
      continue;
    }
    at::_fused_adamw_(g.params, g.grads, g.exp_avgs, g.exp_avg_sqs, /*max_exp_avg_sqs=*/{}, g.steps, lr_, beta1_,
                      beta2_, weight_decay_, eps_, /*amsgrad=*/false, /*maximize=*/false);
    // The fused kernel writes the parameters without moving their version counters (torch 2.11); move
    // them, so that anything keyed on them (the linear layers' bf16 copies) sees the update.
    for (const torch::Tensor& p : g.params) torch::autograd::impl::bump_version(p);
  }
}

double ClipGradNorm(const std::vector<torch::Tensor>& params, double max_norm,
                    const std::function<void(torch::Tensor&)>& all_reduce_sum) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  torch::Tensor sumsq =
      torch::zeros({1}, params.empty() ? torch::TensorOptions() : params[0].options().dtype(torch::kFloat32));
  for (const torch::Tensor& g : grads) sumsq += g.to(torch::kFloat32).pow(2).sum();
  all_reduce_sum(sumsq);
  const torch::Tensor norm = sumsq.sqrt();
  // On the device, without reading the norm back: the host does not wait for the GPU here.
  const torch::Tensor coef = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  if (!grads.empty()) at::_foreach_mul_(grads, coef.reshape({}).to(grads[0].scalar_type()));
  return grads.empty() || !norm.is_cpu() ? -1.0 : norm.item<double>();
}

void FusedAdamW::SetState(size_t i, const ParamState& s) {
  const torch::Tensor& p = params_[i];
  exp_avg_[i] = s.exp_avg.to(p.device(), p.scalar_type()).clone();
  exp_avg_sq_[i] = s.exp_avg_sq.to(p.device(), p.scalar_type()).clone();
  steps_[i] = s.step.to(p.device(), torch::kFloat32).reshape({}).clone();
}

void FusedAdamW::ZeroGrad(bool set_to_none) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> defined;
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& p = params_[i];
    torch::Tensor& g = p.mutable_grad();
    const bool zeroed = zeroed_[i];
    zeroed_[i] = false;
    if (set_to_none) {
      g.reset();
    } else if (g.defined()) {
      if (!zeroed) defined.push_back(g);  // the last Step zeroed it in its pass
    } else {
      g = torch::zeros_like(p, torch::MemoryFormat::Preserve);
    }
  }
  if (!defined.empty()) at::_foreach_zero_(defined);  // one launch (per chunk) for all of them
}

}  // namespace stagehand
