// Token sources (data.h): the synthetic corpus and token files, on the CPU.
#include "engine/data.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stagehand {
namespace {

// A model's sizes as the token sources see them; by default a tiny model's.
struct Sizes {
  int64_t vocab = 256, seq = 32;
};

TEST(SyntheticCorpus, SameSeedStepIndex_SameBatch) {
  const Sizes c;
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 9);
  torch::Tensor a = corpus->Batch(3, 1, 4);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{4, c.seq + 1}));
  EXPECT_EQ(a.scalar_type(), torch::kLong);
  EXPECT_TRUE(a.device().is_cpu());
  EXPECT_GE(a.min().item<int64_t>(), 0);
  EXPECT_LT(a.max().item<int64_t>(), c.vocab);
  EXPECT_TRUE(
      torch::equal(a, MakeSyntheticCorpus(c.vocab, c.seq, 9)->Batch(3, 1, 4)));  // another instance, as another rank
  EXPECT_TRUE(torch::equal(a, corpus->Batch(3, 1, 8).slice(0, 0, 4)));           // rows do not depend on batch size
}

TEST(SyntheticCorpus, DifferentIndexStepOrSeed_DifferentBatch) {
  const Sizes c;
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 9);
  torch::Tensor a = corpus->Batch(3, 1, 4);
  EXPECT_FALSE(torch::equal(a, corpus->Batch(3, 2, 4)));
  EXPECT_FALSE(torch::equal(a, corpus->Batch(4, 1, 4)));
  EXPECT_FALSE(torch::equal(a, MakeSyntheticCorpus(c.vocab, c.seq, 10)->Batch(3, 1, 4)));
}

TEST(SyntheticCorpus, NextToken_MostlyFollowsOneSuccessor) {
  const Sizes c;
  torch::Tensor batch = MakeSyntheticCorpus(c.vocab, c.seq, 9)->Batch(0, 0, 256);
  std::vector<std::vector<int>> counts(c.vocab, std::vector<int>(c.vocab));
  auto t = batch.accessor<int64_t, 2>();
  for (int64_t r = 0; r < batch.size(0); ++r) {
    for (int64_t s = 0; s < c.seq; ++s) ++counts[t[r][s]][t[r][s + 1]];
  }
  int64_t followed = 0;
  for (const auto& row : counts) followed += *std::max_element(row.begin(), row.end());
  const double fraction = static_cast<double>(followed) / (batch.size(0) * c.seq);
  EXPECT_GT(fraction, 0.85);
  EXPECT_LT(fraction, 0.95);
}

TEST(SyntheticCorpus, ReferenceSizes_AreFast) {
  const Sizes c{32768, 1024};  // the reference model's (../shared/targets.md)
  auto corpus = MakeSyntheticCorpus(c.vocab, c.seq, 1);
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10; ++i) ASSERT_EQ(corpus->Batch(0, i, 8).size(1), c.seq + 1);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.5);
}

std::string WriteTokens(const std::string& name, const std::vector<uint16_t>& tokens) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint16_t));
  return path;
}

TEST(OpenTokenFile, RoundTrip_WindowsOfTheFileDeterministicInStepAndIndex) {
  const Sizes c;
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = i % 200;  // each window counts up mod 200
  const std::string path = WriteTokens("round_trip.bin", tokens);
  absl::StatusOr<std::unique_ptr<TokenSource>> source = OpenTokenFile(path, c.vocab, c.seq, 5);
  ASSERT_TRUE(source.ok()) << source.status();
  torch::Tensor batch = (*source)->Batch(2, 0, 8);
  ASSERT_EQ(batch.sizes(), (std::vector<int64_t>{8, c.seq + 1}));
  EXPECT_EQ(batch.scalar_type(), torch::kLong);
  torch::Tensor next = (batch.slice(1, 0, c.seq) + 1) % 200;
  EXPECT_TRUE(torch::equal(batch.slice(1, 1), next));
  EXPECT_TRUE((batch.select(1, 0) != batch[0][0]).any().item<bool>());  // rows start at different offsets

  absl::StatusOr<std::unique_ptr<TokenSource>> again = OpenTokenFile(path, c.vocab, c.seq, 5);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(torch::equal((*again)->Batch(2, 0, 8), batch));
  EXPECT_FALSE(torch::equal((*source)->Batch(2, 1, 8), batch));
  EXPECT_FALSE(torch::equal((*source)->Batch(3, 0, 8), batch));
}

TEST(OpenTokenFile, ExactlySeqPlusOneTokens_GivesTheWholeFile) {
  const Sizes c;
  std::vector<uint16_t> tokens(c.seq + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 255 - i;
  absl::StatusOr<std::unique_ptr<TokenSource>> source =
      OpenTokenFile(WriteTokens("exact.bin", tokens), c.vocab, c.seq, 5);
  ASSERT_TRUE(source.ok()) << source.status();
  torch::Tensor batch = (*source)->Batch(0, 0, 2);
  for (int64_t t = 0; t <= c.seq; ++t) EXPECT_EQ(batch[1][t].item<int64_t>(), 255 - t);
}

void ExpectInvalid(const absl::StatusOr<std::unique_ptr<TokenSource>>& source, const std::string& part) {
  ASSERT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument) << source.status();
  EXPECT_NE(source.status().message().find(part), std::string::npos) << source.status();
}

TEST(OpenTokenFile, Missing_IsInvalidArgumentNamingIt) {
  const std::string path = ::testing::TempDir() + "/no_such_tokens.bin";
  ExpectInvalid(OpenTokenFile(path, 256, 32, 1), path);
}

TEST(OpenTokenFile, Directory_IsInvalidArgument) {
  ExpectInvalid(OpenTokenFile(::testing::TempDir(), 256, 32, 1), "not a regular file");
}

TEST(OpenTokenFile, FewerThanSeqPlusOneTokens_IsInvalidArgument) {
  const Sizes c;
  ExpectInvalid(OpenTokenFile(WriteTokens("short.bin", std::vector<uint16_t>(c.seq, 1)), c.vocab, c.seq, 1),
                "seq + 1 = 33");
  ExpectInvalid(OpenTokenFile(WriteTokens("empty.bin", {}), c.vocab, c.seq, 1), "seq + 1 = 33");
}

TEST(OpenTokenFile, OddSize_IsInvalidArgument) {
  const std::string path = WriteTokens("odd.bin", std::vector<uint16_t>(100, 1));
  std::ofstream(path, std::ios::binary | std::ios::app).put('\0');
  ExpectInvalid(OpenTokenFile(path, 256, 32, 1), "odd");
}

TEST(OpenTokenFile, TokenOutsideVocab_IsInvalidArgumentNamingIt) {
  std::vector<uint16_t> tokens(100, 1);
  tokens[42] = 300;
  ExpectInvalid(OpenTokenFile(WriteTokens("big_token.bin", tokens), 256, 32, 1), "token 300 at position 42");
}

}  // namespace
}  // namespace stagehand
