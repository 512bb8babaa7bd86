// Tests of common/crypto.h: the FIPS 180-4 SHA-256 examples, the RFC 4231 HMAC-SHA256 vectors, the comparison, and
// random bytes.
#include "common/crypto.h"

#include <string>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

std::string Hex(const Sha256Digest& d) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(d.data()), d.size()));
}

struct Vector {
  const char* name;
  std::string key;
  std::string data;
  const char* hmac;
};

// FIPS 180-4's examples (NIST's "SHA256.pdf"): one block, two blocks, and the empty message.
TEST(CryptoTest, Sha256_FipsExamples_MatchTheStandard) {
  EXPECT_EQ(Hex(Sha256("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(Sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(Sha256("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// RFC 4231 section 4 (test case 5 is truncated output, which we never use).
TEST(CryptoTest, HmacSha256_Rfc4231Vectors_MatchTheRfc) {
  std::string key4;
  for (int i = 1; i <= 25; ++i) key4.push_back(static_cast<char>(i));
  const Vector vectors[] = {
      {"case 1", std::string(20, '\x0b'), "Hi There",
       "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
      {"case 2", "Jefe", "what do ya want for nothing?",
       "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
      {"case 3", std::string(20, '\xaa'), std::string(50, '\xdd'),
       "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
      {"case 4", key4, std::string(50, '\xcd'), "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
      {"case 6", std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
       "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
      {"case 7", std::string(131, '\xaa'),
       "This is a test using a larger than block-size key and a larger than block-size data. The key "
       "needs to be hashed before being used by the HMAC algorithm.",
       "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
  };
  for (const Vector& v : vectors) EXPECT_EQ(Hex(HmacSha256(v.key, v.data)), v.hmac) << v.name;
}

TEST(CryptoTest, ConstantTimeEqual_OneBitApart_IsFalse) {
  const Sha256Digest a = HmacSha256("k", "m");
  Sha256Digest b = a;
  EXPECT_TRUE(ConstantTimeEqual(a, b));
  b[31] ^= 1;
  EXPECT_FALSE(ConstantTimeEqual(a, b));
}

TEST(CryptoTest, RandomBytes_TwoCalls_Differ) {
  Sha256Digest a{}, b{};
  ASSERT_TRUE(RandomBytes(a.data(), a.size()).ok());
  ASSERT_TRUE(RandomBytes(b.data(), b.size()).ok());
  EXPECT_NE(a, b);  // 2^-256 to fail by chance
}

}  // namespace
}  // namespace stagehand

namespace stagehand {
namespace {

// FIPS 180-4's examples: "abc", and the 448-bit message fed in two pieces.
TEST(CryptoTest, Sha256_FipsVectors_MatchInPieces) {
  Sha256Stream a;
  a.Update("abc", 3);
  EXPECT_EQ(HexDigest(a.Final()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  const std::string m = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  Sha256Stream b;
  b.Update(m.data(), 10);
  b.Update(m.data() + 10, m.size() - 10);
  EXPECT_EQ(HexDigest(b.Final()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

}  // namespace
}  // namespace stagehand
