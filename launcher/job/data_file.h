// The launcher's check of a --data token file before anything starts, so that a bad file is one line
// and exit 2 rather than an error inside every worker after the run directory exists.
#ifndef STAGEHAND_LAUNCHER_JOB_DATA_FILE_H_
#define STAGEHAND_LAUNCHER_JOB_DATA_FILE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace stagehand {

// `path` must be a regular file of little-endian uint16 tokens (nanoGPT's layout): an even byte count,
// at least seq + 1 tokens (one training window), and, when vocab > 0, every token below vocab; the
// whole file is scanned (mapped, 8 tokens per SSE2 instruction: about 0.3 s per GB from the page cache).
// INVALID_ARGUMENT naming
// --data, the path and, for a bad token, its position and value.
absl::Status CheckTokenFile(const std::string& path, int64_t seq, int64_t vocab);

// The position of the first token >= vocab among `count` tokens, or -1. Exposed for the test.
int64_t FirstTokenAtOrAbove(const uint16_t* tokens, int64_t count, int64_t vocab);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_JOB_DATA_FILE_H_
