// LibTorch translation unit: AttentionPrebuild's threads.
#include "worker/attention_prebuild.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace stagehand {
namespace {

struct Qkv {
  at::Tensor q, k, v;
};

// q, k, v [1, N, S, D] laid out as the family's are (AttentionCall), zeros: cuDNN's plan follows the
// strides, and zeros need no random generator (the run's draws stay the run's).
Qkv ZeroQkv(const AttentionCall& c, const at::TensorOptions& o) {
  if (c.packed_qkv) {
    std::vector<at::Tensor> t = at::zeros({1, c.seq, 3, c.heads, c.head_dim}, o).permute({2, 0, 3, 1, 4}).unbind(0);
    return {t[0], t[1], t[2]};
  }
  auto heads = [&](int64_t n) { return at::zeros({1, c.seq, n, c.head_dim}, o).transpose(1, 2); };
  return {heads(c.heads), heads(c.kv_heads), heads(c.kv_heads)};
}

// The forward's first call: what the model's call compiles (with the logsumexp when it trains).
void Forward(const AttentionCall& c, bool logsumexp, const at::TensorOptions& o) {
  const Qkv t = ZeroQkv(c, o);
  (void)at::_scaled_dot_product_cudnn_attention(t.q, t.k, t.v, /*attn_bias=*/std::nullopt, logsumexp,
                                                /*dropout_p=*/0.0, c.causal, /*return_debug_mask=*/false);
}

// The backward's, on what the forward would have returned (its output in q's layout, as LibTorch
// allocates it; the logsumexp [B, N, S, 1] fp32), without waiting for a forward.
void Backward(const AttentionCall& c, const at::TensorOptions& o) {
  const Qkv t = ZeroQkv(c, o);
  const at::Tensor out = at::zeros({1, c.seq, c.heads, c.head_dim}, o).transpose(1, 2);
  const at::Tensor grad = at::zeros({1, c.seq, c.heads, c.head_dim}, o).transpose(1, 2);
  const at::Tensor lse = at::zeros({1, c.heads, c.seq, 1}, o.dtype(at::kFloat));
  const at::Tensor seed = at::zeros({}, o.dtype(at::kLong)), offset = at::zeros({}, o.dtype(at::kLong));
  (void)at::_scaled_dot_product_cudnn_attention_backward(grad, t.q, t.k, t.v, out, lse, seed, offset,
                                                         /*attn_bias=*/at::Tensor(), /*cum_seq_q=*/at::Tensor(),
                                                         /*cum_seq_k=*/at::Tensor(), c.seq, c.seq,
                                                         /*dropout_p=*/0.0, c.causal);
}

std::string Describe(const AttentionCall& c) {
  return absl::StrCat("heads=", c.heads, c.kv_heads != c.heads ? absl::StrCat(" kv=", c.kv_heads) : "",
                      " d=", c.head_dim, " s=", c.seq, c.causal ? " causal" : "", c.packed_qkv ? " packed" : "");
}

}  // namespace

std::vector<AttentionCall> DistinctAttentionCalls(const std::vector<AttentionCall>& calls) {
  std::vector<AttentionCall> out;
  for (const AttentionCall& c : calls) {
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::unique_ptr<AttentionPrebuild> AttentionPrebuild::Start(std::vector<AttentionCall> calls, bool backward,
                                                            int device) {
  calls = DistinctAttentionCalls(calls);
  if (calls.empty()) return nullptr;
  std::unique_ptr<AttentionPrebuild> p(new AttentionPrebuild());
  p->start_ = absl::Now();
  struct Job {
    AttentionCall call;
    bool backward;
  };
  std::vector<Job> jobs;
  for (const AttentionCall& c : calls) {
    jobs.push_back({c, false});
    if (backward) jobs.push_back({c, true});
  }
  p->kernels_.resize(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    Kernel& k = p->kernels_[i];
    k.name = absl::StrCat(jobs[i].backward ? "backward " : "forward ", Describe(jobs[i].call));
    const AttentionCall& c = jobs[i].call;
    if (c.heads <= 0 || c.kv_heads <= 0 || c.head_dim <= 0 || c.seq <= 0 || c.heads % c.kv_heads != 0 ||
        (c.packed_qkv && c.kv_heads != c.heads)) {
      k.error = "not an attention call's sizes";
      continue;
    }
    p->threads_.emplace_back([&k, job = jobs[i], logsumexp = backward, device] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        c10::cuda::CUDAGuard guard(device);
        const c10::cuda::CUDAStream stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device);
        c10::cuda::CUDAStreamGuard on(stream);
        const at::TensorOptions o = at::TensorOptions().device(at::kCUDA, device).dtype(at::kBFloat16);
        if (job.backward) {
          Backward(job.call, o);
        } else {
          Forward(job.call, logsumexp, o);
        }
        stream.synchronize();
      } catch (const c10::Error& e) {
        k.error = e.what_without_backtrace();
      } catch (const std::exception& e) {
        k.error = e.what();
      }
      k.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  return p;
}

std::string AttentionPrebuild::Finish() {
  if (finished_) return "";
  finished_ = true;
  const absl::Time join = absl::Now();
  for (std::thread& t : threads_) t.join();
  const absl::Duration waited = absl::Now() - join;
  // The threads' tensors went back to the caching allocator as free blocks of their streams: give
  // them (and any other free block; nothing has been captured yet) back to the device.
  bool ran = false;
  for (const Kernel& k : kernels_) ran = ran || k.error.empty();
  if (ran) c10::cuda::CUDACachingAllocator::emptyCache();
  std::vector<std::string> parts, failed;
  for (const Kernel& k : kernels_) {
    if (k.error.empty()) {
      parts.push_back(absl::StrFormat("%s %.0f ms", k.name, k.ms));
    } else {
      failed.push_back(absl::StrCat(k.name, ": ", k.error.substr(0, 300)));
    }
  }
  std::string line = absl::StrFormat(
      "attention kernels built ahead of step 0 on %d threads (%s; the start waited %.0f ms for them, %.0f ms after "
      "they began)",
      threads_.size(), absl::StrJoin(parts, ", "), absl::ToDoubleMilliseconds(waited),
      absl::ToDoubleMilliseconds(join - start_));
  if (!failed.empty()) {
    absl::StrAppend(&line, "; not built (step 0 builds them): ", absl::StrJoin(failed, "; "));
  }
  return line;
}

AttentionPrebuild::~AttentionPrebuild() { (void)Finish(); }

}  // namespace stagehand
