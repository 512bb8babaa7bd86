// SHA-256, HMAC-SHA256 and constant-time comparison from libcrypto (already in every process that links gRPC),
// random bytes from getrandom(2).
#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/fd.h"

namespace stagehand {

Sha256Digest Sha256(absl::string_view data) {
  Sha256Digest out{};
  unsigned int len = 0;
  // As with HMAC below: EVP_Digest fails only when libcrypto cannot allocate.
  if (EVP_Digest(data.data(), data.size(), out.data(), &len, EVP_sha256(), nullptr) != 1 || len != out.size()) {
    std::fputs("stagehand: SHA-256 failed in libcrypto (out of memory?)\n", stderr);
    std::abort();
  }
  return out;
}

Sha256Digest HmacSha256(absl::string_view key, absl::string_view message) {
  Sha256Digest out{};
  unsigned int len = 0;
  // The one-shot HMAC() fails only on allocation failure or a bad digest: neither can be handled here,
  // and returning a predictable digest would be worse than stopping.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), out.data(), &len) == nullptr ||
      len != out.size()) {
    std::fputs("stagehand: HMAC-SHA256 failed in libcrypto (out of memory?)\n", stderr);
    std::abort();
  }
  return out;
}

Sha256Stream::Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr || EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1) {
    std::fputs("stagehand: SHA-256 init failed in libcrypto (out of memory?)\n", stderr);
    std::abort();
  }
}

Sha256Stream::~Sha256Stream() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Stream::Update(const void* data, size_t n) {
  if (n > 0) EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, n);
}

Sha256Digest Sha256Stream::Final() {
  Sha256Digest out{};
  unsigned int len = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), out.data(), &len);
  return out;
}

std::string HexDigest(const Sha256Digest& d) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (uint8_t b : d) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

bool ConstantTimeEqual(const Sha256Digest& a, const Sha256Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

absl::Status RandomBytes(uint8_t* out, size_t n) {
  while (n > 0) {
    const ssize_t got = ::getrandom(out, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return absl::UnavailableError(
          absl::StrCat("getrandom: ", ErrnoText(errno), "; this kernel cannot give random bytes"));
    }
    out += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

}  // namespace stagehand
