// Training data for language models: batches of token sequences, deterministic in (seed, step, index)
// so that every rank and every run sees the same batch (which is what lets a pipeline run be compared
// with a single process). A synthetic corpus a model can learn, and files of uint16 tokens (nanoGPT's
// train.bin layout).
#ifndef STAGEHAND_ENGINE_DATA_H_
#define STAGEHAND_ENGINE_DATA_H_

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
// A file of uint16 tokens; windows are drawn at offsets from the seed. With a validation split
// (val_fraction > 0) only the training part is drawn from: every window lies wholly before the split.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path, int64_t vocab, int64_t seq,
                                                           uint64_t seed, double val_fraction = 0);

// The validation split of a file of N tokens: its last K whole sequences of seq + 1 tokens, K =
// floor(N * val_fraction / (seq + 1)), so the split starts at token N - K (seq + 1) and training
// windows end before it. Sequence j is tokens [start + j (seq + 1), start + (j + 1) (seq + 1)).
struct ValidationSplit {
  int64_t tokens = 0;     // N
  int64_t sequences = 0;  // K
  int64_t start = 0;      // the split's first token; the training part is [0, start)
};
ValidationSplit SplitOf(int64_t tokens, int64_t seq, double val_fraction);

// The validation split of a token file as a source: Batch(step, index, batch) is evaluation batch
// `index` (step is ignored): row i is split sequence (index * batch + i) mod K, the same sequences at
// every evaluation. FAILED_PRECONDITION when the split holds no sequence.
absl::StatusOr<std::unique_ptr<TokenSource>> OpenValidationSplit(const std::string& path, int64_t vocab, int64_t seq,
                                                                 double val_fraction);

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_DATA_H_
