// The token file check (see data_file.h).
#include "launcher/job/data_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/input_file.h"

namespace stagehand {
namespace {

// Chunks small enough to stay in cache; only a chunk with a token too large is searched again for
// its position.
constexpr int64_t kChunk = 1 << 16;

absl::Status Bad(const std::string& path, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("--data=", path, ": ", what));
}

// Whether any of the n tokens is above `max`. SSE2 (every x86-64) has no unsigned 16-bit max, but a
// saturating subtract is zero exactly for tokens <= max: OR the differences 8 at a time. GCC 12 at
// -O2 leaves the scalar loop unvectorized, 1.2 s per GB; this runs at memory speed.
bool AnyAbove(const uint16_t* p, int64_t n, uint16_t max) {
  int64_t i = 0;
  bool any = false;
#ifdef __SSE2__
  const __m128i m = _mm_set1_epi16(static_cast<short>(max));
  __m128i acc = _mm_setzero_si128();
  for (; i + 8 <= n; i += 8) {
    acc = _mm_or_si128(acc, _mm_subs_epu16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)), m));
  }
  any = _mm_movemask_epi8(_mm_cmpeq_epi16(acc, _mm_setzero_si128())) != 0xffff;
#endif
  for (; i < n; ++i) any |= p[i] > max;
  return any;
}

}  // namespace

int64_t FirstTokenAtOrAbove(const uint16_t* tokens, int64_t count, int64_t vocab) {
  if (vocab > 0xffff) return -1;  // every uint16 is below it
  if (vocab <= 0) return count > 0 ? 0 : -1;
  const uint16_t max = static_cast<uint16_t>(vocab - 1);
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t n = std::min(kChunk, count - start);
    if (!AnyAbove(tokens + start, n, max)) continue;
    for (int64_t i = 0; i < n; ++i) {
      if (tokens[start + i] > max) return start + i;
    }
  }
  return -1;
}

absl::Status CheckTokenFile(const std::string& path, int64_t seq, int64_t vocab) {
  // Opened, then fstat'd: a FIFO opens at once (O_NONBLOCK) and is refused, never read (input_file.h).
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, absl::StrCat("--data=", path));
  if (absl::IsNotFound(file.status())) {
    return absl::InvalidArgumentError(absl::StrCat(file.status().message(),
                                                   "; pass a file of uint16 tokens, or drop "
                                                   "--data for the synthetic corpus"));
  }
  if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
  const struct stat st = file->st;
  if (st.st_size % 2 != 0) {
    return Bad(path, absl::StrCat(st.st_size, " bytes, an odd count: not uint16 tokens (nanoGPT's train.bin layout)"));
  }
  const int64_t count = st.st_size / 2;
  if (count < seq + 1) {
    return Bad(path, absl::StrCat(count, " tokens, fewer than one window of --seq + 1 = ", seq + 1,
                                  "; pass a larger file or a smaller --seq"));
  }
  if (vocab <= 0 || vocab > 0xffff) return absl::OkStatus();  // unknown (a user's family) or nothing to check
  void* map = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, file->fd.get(), 0);
  const int map_errno = errno;
  file->fd.reset();
  if (map == MAP_FAILED) return Bad(path, absl::StrCat("cannot map it: ", std::strerror(map_errno)));
  madvise(map, st.st_size, MADV_SEQUENTIAL);
  const auto* tokens = static_cast<const uint16_t*>(map);
  const int64_t bad = FirstTokenAtOrAbove(tokens, count, vocab);
  const uint16_t value = bad >= 0 ? tokens[bad] : 0;
  munmap(map, st.st_size);
  if (bad >= 0) {
    return Bad(path, absl::StrCat("token ", value, " at position ", bad, " (byte ", 2 * bad, ") is not below --vocab=",
                                  vocab, "; pass the vocabulary the file was tokenized with"));
  }
  return absl::OkStatus();
}

}  // namespace stagehand
