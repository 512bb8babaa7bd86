// Training data for language models: batches of token sequences, deterministic in (seed, step, index)
// so that every rank and every run sees the same batch (which is what lets a pipeline run be compared
// with a single process). A synthetic corpus a model can learn, and files of uint16 tokens (nanoGPT's
// train.bin layout).
#ifndef STAGEHAND_WORKER_DATA_H_
#define STAGEHAND_WORKER_DATA_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace stagehand {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // `batch` sequences of seq+1 tokens: inputs are [:, :-1], targets [:, 1:]. int64, on the CPU.
  virtual at::Tensor Batch(int64_t step, int64_t index, int64_t batch) const = 0;
};

// A synthetic corpus the model can learn: each sequence follows a fixed random successor table with a
// little noise, so the loss falls well below uniform guessing (ln vocab).
std::unique_ptr<TokenSource> MakeSyntheticCorpus(int64_t vocab, int64_t seq, uint64_t seed);
// A file of uint16 tokens; windows are drawn at offsets from the seed.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path, int64_t vocab, int64_t seq,
                                                           uint64_t seed);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_DATA_H_
