// Token sources (see data.h).
#include "engine/data.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

// Randomness for the token sources: splitmix64, cheap enough to draw one number per token.

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t Next() { return Mix64(state_++ * 0x9e3779b97f4a7c15ULL); }
  // Uniform in [0, n); the modulo bias is below 2^-40 for the n used here.
  uint64_t Below(uint64_t n) { return Next() % n; }

 private:
  uint64_t state_;
};

// One stream per batch row, from (seed, step, index, row): independent of how batches are split up.
SplitMix64 RowRng(uint64_t seed, int64_t step, int64_t index, int64_t row) {
  uint64_t h = Mix64(seed ^ 0x5eed5eed5eed5eedULL);
  h = Mix64(h ^ static_cast<uint64_t>(step));
  h = Mix64(h ^ static_cast<uint64_t>(index));
  return SplitMix64(Mix64(h ^ static_cast<uint64_t>(row)));
}

// Each sequence starts at a random token; the next token is succ[previous] with probability 9/10,
// else uniform. The best achievable loss is about 0.9 nats at vocab 256 (against ln 256 = 5.55).
class SyntheticCorpus : public TokenSource {
 public:
  SyntheticCorpus(int64_t vocab, int64_t seq, uint64_t seed) : seq_(seq), seed_(seed), succ_(vocab) {
    // A random permutation (Fisher-Yates): every token has a successor and is some token's successor.
    std::iota(succ_.begin(), succ_.end(), int64_t{0});
    SplitMix64 rng(Mix64(seed ^ 0x5ccc5ccc5ccc5cccULL));
    for (size_t i = succ_.size(); i > 1; --i) std::swap(succ_[i - 1], succ_[rng.Below(i)]);
  }
  at::Tensor Batch(int64_t step, int64_t index, int64_t batch) const override {
    TORCH_CHECK(batch >= 0, "batch must be >= 0, got ", batch);
    auto out = at::empty({batch, seq_ + 1}, at::kLong);
    int64_t* p = out.data_ptr<int64_t>();
    const uint64_t vocab = succ_.size();
    for (int64_t row = 0; row < batch; ++row) {
      SplitMix64 rng = RowRng(seed_, step, index, row);
      int64_t token = rng.Below(vocab);
      *p++ = token;
      for (int64_t t = 0; t < seq_; ++t) {
        token = rng.Below(10) != 0 ? succ_[token] : static_cast<int64_t>(rng.Below(vocab));
        *p++ = token;
      }
    }
    return out;
  }

 private:
  int64_t seq_;
  uint64_t seed_;
  std::vector<int64_t> succ_;
};

// A read-only mapping of a file of uint16 tokens (little-endian, as nanoGPT's prepare.py writes them
// with numpy on x86), unmapped when the source goes.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are read as little-endian uint16");

class TokenFile : public TokenSource {
 public:
  // Windows are drawn from the first `count` tokens (the training part); `mapped_bytes` is the whole file's.
  TokenFile(const uint16_t* tokens, size_t count, size_t mapped_bytes, int64_t seq, uint64_t seed)
      : tokens_(tokens), count_(count), mapped_bytes_(mapped_bytes), seq_(seq), seed_(seed) {}
  ~TokenFile() override { munmap(const_cast<uint16_t*>(tokens_), mapped_bytes_); }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  at::Tensor Batch(int64_t step, int64_t index, int64_t batch) const override {
    TORCH_CHECK(batch >= 0, "batch must be >= 0, got ", batch);
    auto out = at::empty({batch, seq_ + 1}, at::kLong);
    int64_t* p = out.data_ptr<int64_t>();
    const uint64_t offsets = count_ - seq_;  // windows of seq+1 tokens start at 0 .. count - seq - 1
    for (int64_t row = 0; row < batch; ++row) {
      const uint16_t* window = tokens_ + RowRng(seed_, step, index, row).Below(offsets);
      for (int64_t t = 0; t <= seq_; ++t) *p++ = window[t];
    }
    return out;
  }

 private:
  const uint16_t* tokens_;
  size_t count_, mapped_bytes_;
  int64_t seq_;
  uint64_t seed_;
};

// The held-out sequences at the end of a token file (ValidationSplit).
class ValidationFile : public TokenSource {
 public:
  ValidationFile(const uint16_t* tokens, size_t mapped_bytes, ValidationSplit split, int64_t seq)
      : tokens_(tokens), mapped_bytes_(mapped_bytes), split_(split), seq_(seq) {}
  ~ValidationFile() override { munmap(const_cast<uint16_t*>(tokens_), mapped_bytes_); }
  ValidationFile(const ValidationFile&) = delete;
  ValidationFile& operator=(const ValidationFile&) = delete;

  at::Tensor Batch(int64_t, int64_t index, int64_t batch) const override {
    TORCH_CHECK(batch >= 0 && index >= 0, "batch and index must be >= 0, got ", batch, " and ", index);
    auto out = at::empty({batch, seq_ + 1}, at::kLong);
    int64_t* p = out.data_ptr<int64_t>();
    for (int64_t row = 0; row < batch; ++row) {
      const int64_t j = (index * batch + row) % split_.sequences;
      const uint16_t* sequence = tokens_ + split_.start + j * (seq_ + 1);
      for (int64_t t = 0; t <= seq_; ++t) *p++ = sequence[t];
    }
    return out;
  }

 private:
  const uint16_t* tokens_;
  size_t mapped_bytes_;
  ValidationSplit split_;
  int64_t seq_;
};

// Only the first tokens are checked against the vocabulary: reading a whole multi-GB file at startup
// would cost seconds, and a file written for another tokenizer shows itself in its first megabytes.
constexpr size_t kTokensChecked = size_t{4} << 20;  // 8 MiB

absl::Status CheckTokens(const std::string& path, const uint16_t* tokens, size_t count, int64_t vocab) {
  const size_t n = std::min(count, kTokensChecked);
  for (size_t i = 0; i < n; ++i) {
    if (tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", path, ": token ", tokens[i], " at position ", i,
                                                     " is not below the vocabulary size ", vocab,
                                                     "; use a file made with the model's tokenizer or a larger vocab"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<TokenSource> MakeSyntheticCorpus(int64_t vocab, int64_t seq, uint64_t seed) {
  return std::make_unique<SyntheticCorpus>(vocab, seq, seed);
}

ValidationSplit SplitOf(int64_t tokens, int64_t seq, double val_fraction) {
  ValidationSplit v;
  v.tokens = tokens;
  if (val_fraction > 0)
    v.sequences = static_cast<int64_t>(std::floor(static_cast<double>(tokens) * val_fraction)) / (seq + 1);
  v.start = tokens - v.sequences * (seq + 1);
  return v;
}

namespace {

// A token file mapped read-only and checked; the caller owns the mapping (munmap of `bytes`).
struct MappedTokens {
  const uint16_t* tokens = nullptr;
  size_t count = 0, bytes = 0;
};

absl::StatusOr<MappedTokens> MapTokenFile(const std::string& path, int64_t vocab, int64_t seq) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot open token file ", path, ": ", std::strerror(errno),
                                                   "; pass a file of uint16 tokens (nanoGPT's train.bin layout)"));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is not a regular file"));
  }
  const size_t bytes = st.st_size, count = bytes / 2;
  if (bytes % 2 != 0 || count < static_cast<size_t>(seq) + 1) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        "token file ", path, " has ", bytes, " bytes", bytes % 2 != 0 ? ", an odd number (truncated?)" : "",
        "; it must hold whole uint16 tokens, at least seq + 1 = ", seq + 1, " of them"));
  }
  void* mapped = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  const int mmap_errno = errno;
  close(fd);  // the mapping keeps the file
  if (mapped == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat("cannot map token file ", path, ": ", std::strerror(mmap_errno)));
  }
  const auto* tokens = static_cast<const uint16_t*>(mapped);
  if (absl::Status s = CheckTokens(path, tokens, count, vocab); !s.ok()) {
    munmap(mapped, bytes);
    return s;
  }
  return MappedTokens{tokens, count, bytes};
}

}  // namespace

absl::StatusOr<std::unique_ptr<TokenSource>> OpenTokenFile(const std::string& path, int64_t vocab, int64_t seq,
                                                           uint64_t seed, double val_fraction) {
  absl::StatusOr<MappedTokens> m = MapTokenFile(path, vocab, seq);
  if (!m.ok()) return m.status();
  const ValidationSplit split = SplitOf(static_cast<int64_t>(m->count), seq, val_fraction);
  if (split.start < seq + 1) {
    munmap(const_cast<uint16_t*>(m->tokens), m->bytes);
    return absl::FailedPreconditionError(
        absl::StrCat("token file ", path, ": --val_fraction=", val_fraction, " leaves ", split.start,
                     " tokens to train on, fewer than seq + 1 = ", seq + 1, "; pass a smaller --val_fraction"));
  }
  return std::unique_ptr<TokenSource>(
      std::make_unique<TokenFile>(m->tokens, static_cast<size_t>(split.start), m->bytes, seq, seed));
}

absl::StatusOr<std::unique_ptr<TokenSource>> OpenValidationSplit(const std::string& path, int64_t vocab, int64_t seq,
                                                                 double val_fraction) {
  absl::StatusOr<MappedTokens> m = MapTokenFile(path, vocab, seq);
  if (!m.ok()) return m.status();
  const ValidationSplit split = SplitOf(static_cast<int64_t>(m->count), seq, val_fraction);
  if (split.sequences < 1) {
    munmap(const_cast<uint16_t*>(m->tokens), m->bytes);
    return absl::FailedPreconditionError(absl::StrCat("token file ", path, ": --val_fraction=", val_fraction,
                                                      " holds no whole sequence of seq + 1 = ", seq + 1,
                                                      " tokens; pass a larger --val_fraction"));
  }
  return std::unique_ptr<TokenSource>(std::make_unique<ValidationFile>(m->tokens, m->bytes, split, seq));
}

}  // namespace stagehand
