// The client's token file (`--token_file`, STAGEHAND_TOKEN_FILE): the bearer token a server minted,
// alone in a file. Shared by the client and the server's tests; no store, no gRPC.
#ifndef STAGEHAND_CONTROL_BEARER_TOKEN_H_
#define STAGEHAND_CONTROL_BEARER_TOKEN_H_

#include <string>

#include "absl/status/statusor.h"

namespace stagehand {

struct TokenFile {
  std::string token;
  std::string warning;  // "" or a line to print: the file can be read by group or others
};

// The client's token file: the token alone, whitespace around it trimmed. INVALID_ARGUMENT (the
// user's argument: the client exits 2) when it cannot be read, is empty, large, or holds more than
// one word. A file that others can read is used with a warning rather than refused (as ssh
// refuses a private key): a token is revocable and limited to its role, and refusing would break
// secrets mounted 0644 by CI systems.
absl::StatusOr<TokenFile> ReadTokenFile(const std::string& path);

}  // namespace stagehand

#endif  // STAGEHAND_CONTROL_BEARER_TOKEN_H_
