// EmbeddingLookup (nn.h): its in-place backward (embedding_kernels.h) against a float64 reference of
// the same sums, with repeated ids, a long run of one id, a gradient already in .grad, and two runs
// compared bit for bit; the CPU path against torch::embedding. The *Cuda* cases skip without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "nn/nn.h"

namespace stagehand {
namespace {

// weight.grad after backward of sum(EmbeddingLookup(weight, ids) * g), starting from `start` in .grad.
torch::Tensor GradOf(const torch::Tensor& table, const torch::Tensor& ids, const torch::Tensor& g,
                     const torch::Tensor& start, bool fused) {
  torch::Tensor weight = table.detach().clone().requires_grad_(true);
  if (start.defined()) weight.mutable_grad() = start.clone();
  (EmbeddingLookup(weight, ids, fused) * g).sum().backward();
  return weight.grad();
}

// start + the sum of g's rows into their ids' rows, in float64.
torch::Tensor Reference(const torch::Tensor& ids, const torch::Tensor& g, const torch::Tensor& start) {
  torch::Tensor r = start.to(torch::kDouble).cpu();
  r.index_add_(0, ids.reshape({-1}).cpu(), g.reshape({-1, g.size(-1)}).to(torch::kDouble).cpu());
  return r;
}

TEST(EmbeddingLookup, CpuIsTorchEmbedding) {
  torch::manual_seed(1);
  const torch::Tensor table = torch::randn({50, 8}), ids = torch::randint(0, 50, {3, 7});
  const torch::Tensor g = torch::randn({3, 7, 8});
  torch::Tensor w = table.clone().requires_grad_(true);
  EXPECT_TRUE(torch::equal(EmbeddingLookup(w, ids, true), torch::embedding(table, ids)));
  EXPECT_TRUE(torch::allclose(GradOf(table, ids, g, {}, true), GradOf(table, ids, g, {}, false)));
}

void ExpectMatchesReference(int64_t vocab, int64_t cols, int64_t batch, int64_t seq, bool long_run) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(2);
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  const torch::Tensor table = torch::randn({vocab, cols}, cuda);
  torch::Tensor ids = torch::randint(0, vocab, {batch, seq}, cuda.dtype(torch::kLong));
  if (long_run) ids.select(0, 0).fill_(vocab - 1);  // one id at `seq` positions: one long run
  const torch::Tensor g = torch::randn({batch, seq, cols}, cuda);
  const torch::Tensor start = torch::randn({vocab, cols}, cuda);
  const torch::Tensor fused = GradOf(table, ids, g, start, true);
  const torch::Tensor ref = Reference(ids, g, start);
  EXPECT_TRUE(torch::allclose(fused.cpu().to(torch::kDouble), ref, 1e-5, 1e-4))
      << "worst " << (fused.cpu().to(torch::kDouble) - ref).abs().max().item<double>();
  EXPECT_TRUE(torch::equal(fused, GradOf(table, ids, g, start, true))) << "run to run, bit for bit";
  // From no gradient at all (set_to_none): the same as from zeros.
  EXPECT_TRUE(torch::equal(GradOf(table, ids, g, {}, true), GradOf(table, ids, g, torch::zeros_like(start), true)));
  // The unfused path (ATen's backward and autograd's add) agrees within fp32 rounding.
  EXPECT_TRUE(torch::allclose(fused, GradOf(table, ids, g, start, false), 1e-5, 1e-4));
}

TEST(EmbeddingLookupCuda, SmallVocabManyRepeats) { ExpectMatchesReference(97, 64, 4, 300, false); }
TEST(EmbeddingLookupCuda, LongRunOfOneId) { ExpectMatchesReference(1000, 256, 3, 1024, true); }
TEST(EmbeddingLookupCuda, Gpt13bShape) { ExpectMatchesReference(50304, 2048, 8, 1024, false); }

TEST(EmbeddingLookupCuda, Bf16TableTakesAtenPath) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const auto cuda = torch::TensorOptions().device(torch::kCUDA);
  torch::Tensor w = torch::randn({20, 8}, cuda.dtype(torch::kBFloat16)).requires_grad_(true);
  const torch::Tensor ids = torch::randint(0, 20, {2, 5}, cuda.dtype(torch::kLong));
  EmbeddingLookup(w, ids, true).sum().backward();
  torch::Tensor w2 = w.detach().clone().requires_grad_(true);
  torch::embedding(w2, ids).sum().backward();
  EXPECT_TRUE(torch::equal(w.grad(), w2.grad()));
}

}  // namespace
}  // namespace stagehand
