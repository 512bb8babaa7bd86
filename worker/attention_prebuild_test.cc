// LibTorch translation unit: AttentionPrebuild. The CUDA cases run on a GPU host (tools/bundle).
#include "worker/attention_prebuild.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/cuda.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace stagehand {
namespace {

constexpr AttentionCall kGpt{16, 16, 128, 1024, true, true};
constexpr AttentionCall kLlama{32, 4, 64, 2048, true, false};

TEST(AttentionPrebuild, DistinctCalls_KeepsTheFirstOfEachInOrder) {
  const std::vector<AttentionCall> d = DistinctAttentionCalls({kGpt, kLlama, kGpt, kLlama});
  ASSERT_EQ(d.size(), 2u);
  EXPECT_TRUE(d[0] == kGpt);
  EXPECT_TRUE(d[1] == kLlama);
  AttentionCall other = kGpt;
  other.packed_qkv = false;
  EXPECT_EQ(DistinctAttentionCalls({kGpt, other}).size(), 2u);
}

TEST(AttentionPrebuild, NoCalls_StartsNothing) { EXPECT_EQ(AttentionPrebuild::Start({}, true, 0), nullptr); }

TEST(AttentionPrebuild, SizesNoAttentionHas_AreReportedNotRun) {
  AttentionCall bad = kLlama;
  bad.kv_heads = 5;  // does not divide 32
  std::unique_ptr<AttentionPrebuild> p = AttentionPrebuild::Start({bad}, /*backward=*/false, 0);
  ASSERT_NE(p, nullptr);
  const std::string line = p->Finish();
  EXPECT_NE(line.find("on 0 threads"), std::string::npos) << line;
  EXPECT_NE(
      line.find(
          "not built (step 0 builds them): forward heads=32 kv=5 d=64 s=2048 causal: not an attention call's sizes"),
      std::string::npos)
      << line;
  EXPECT_EQ(p->Finish(), "");  // once
}

// Without a GPU the threads fail inside LibTorch and say so; nothing throws and the job would go on.
TEST(AttentionPrebuild, WithoutAGpu_EachKernelIsReportedNotBuilt) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is present";
  std::unique_ptr<AttentionPrebuild> p = AttentionPrebuild::Start({kGpt}, /*backward=*/true, 0);
  ASSERT_NE(p, nullptr);
  const std::string line = p->Finish();
  EXPECT_NE(line.find("on 2 threads"), std::string::npos) << line;
  EXPECT_NE(line.find("not built (step 0 builds them): forward heads=16 d=128 s=1024 causal packed: "),
            std::string::npos)
      << line;
  EXPECT_NE(line.find("; backward heads=16 d=128 s=1024 causal packed: "), std::string::npos) << line;
}

TEST(AttentionPrebuildCuda, GptAndLlamaCalls_BuildForwardAndBackwardAndLeaveNoMemory) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  at::zeros({1}, at::TensorOptions().device(at::kCUDA));  // CUDA up, as the worker has it
  auto reserved = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).reserved_bytes[0].current; };
  const int64_t before = reserved();
  for (bool backward : {true, false}) {
    std::unique_ptr<AttentionPrebuild> p = AttentionPrebuild::Start({kGpt, kLlama}, backward, 0);
    ASSERT_NE(p, nullptr);
    const std::string line = p->Finish();
    EXPECT_EQ(line.find("not built"), std::string::npos) << line;
    EXPECT_NE(line.find(backward ? "on 4 threads" : "on 2 threads"), std::string::npos) << line;
    EXPECT_NE(line.find("forward heads=32 kv=4 d=64 s=2048 causal "), std::string::npos) << line;
    EXPECT_EQ(line.find("backward") != std::string::npos, backward) << line;
  }
  EXPECT_LE(reserved(), before);  // the threads' blocks went back to the device
}

// The backward's synthetic out and logsumexp are laid out as the forward makes them (what the model's
// backward is then called with): out in q's layout, the logsumexp [B, N, S, 1] fp32.
TEST(AttentionPrebuildCuda, ForwardOutputs_HaveTheLayoutTheBackwardIsGiven) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU";
  const at::TensorOptions o = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (const AttentionCall& c : {kGpt, kLlama}) {
    std::vector<at::Tensor> qkv;
    if (c.packed_qkv) {
      qkv = at::randn({2, c.seq, 3, c.heads, c.head_dim}, o).permute({2, 0, 3, 1, 4}).unbind(0);
    } else {
      for (int64_t n : {c.heads, c.kv_heads, c.kv_heads})
        qkv.push_back(at::randn({2, c.seq, n, c.head_dim}, o).transpose(1, 2));
    }
    auto r = at::_scaled_dot_product_cudnn_attention(qkv[0], qkv[1], qkv[2], std::nullopt, true, 0.0, c.causal, false);
    const at::Tensor& out = std::get<0>(r);
    const at::Tensor& lse = std::get<1>(r);
    const at::Tensor expect_out = at::zeros({2, c.seq, c.heads, c.head_dim}, o).transpose(1, 2);
    EXPECT_EQ(out.sizes(), expect_out.sizes());
    EXPECT_EQ(out.strides(), expect_out.strides());
    EXPECT_EQ(lse.sizes(), (std::vector<int64_t>{2, c.heads, c.seq, 1}));
    EXPECT_EQ(lse.scalar_type(), at::kFloat);
  }
}

}  // namespace
}  // namespace stagehand
