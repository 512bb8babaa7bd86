// The few cryptographic primitives stagehand needs, over OpenSSL's libcrypto: SHA-256, HMAC-SHA256,
// a constant-time comparison, and fresh random bytes from the kernel (getrandom(2)).
#ifndef STAGEHAND_COMMON_CRYPTO_H_
#define STAGEHAND_COMMON_CRYPTO_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace stagehand {

inline constexpr size_t kSha256Bytes = 32;
using Sha256Digest = std::array<uint8_t, kSha256Bytes>;

// SHA-256 (FIPS 180-4) of `data`: the server keeps a client token's hash, never the token.
Sha256Digest Sha256(absl::string_view data);

// HMAC-SHA256 (RFC 2104, FIPS 180-4) of `message` under `key`; any key length (longer than the block
// size is hashed first, as the RFC says).
Sha256Digest HmacSha256(absl::string_view key, absl::string_view message);

// SHA-256 (FIPS 180-4) of a stream, fed in pieces: checkpoint shards are hashed as they are written.
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t n);
  Sha256Digest Final();  // once; the object is spent after it

 private:
  void* ctx_;  // EVP_MD_CTX
};

// Lower-case hex of a digest (64 characters).
std::string HexDigest(const Sha256Digest& d);

// Whether a == b, in time that does not depend on where they differ: comparing a MAC byte by byte
// with an early exit would tell an attacker how many leading bytes of a forgery are right.
bool ConstantTimeEqual(const Sha256Digest& a, const Sha256Digest& b);

// Fills out[0, n) with random bytes from the kernel's CSPRNG (getrandom(2), which blocks only until
// the pool is first seeded at boot). UNAVAILABLE when the kernel refuses (it names the errno).
absl::Status RandomBytes(uint8_t* out, size_t n);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_CRYPTO_H_
