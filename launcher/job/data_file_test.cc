// Tests of the launcher's token file check: each refusal names the file and what is wrong; the scan
// finds the first bad token anywhere, past the first 4M tokens too.
#include "launcher/job/data_file.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::HasSubstr;

std::string WriteTokens(const std::string& name, const std::vector<uint16_t>& tokens) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(2 * tokens.size()));
  return path;
}

void ExpectRefused(const absl::Status& s, const std::string& fragment) {
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(fragment));
  EXPECT_THAT(std::string(s.message()), HasSubstr("--data="));
}

TEST(TokenFileTest, CheckTokenFile_GoodFile_IsOk) {
  EXPECT_TRUE(CheckTokenFile(WriteTokens("good.bin", std::vector<uint16_t>(100, 7)), 64, 8).ok());
}

TEST(TokenFileTest, CheckTokenFile_Missing_IsRefused) {
  ExpectRefused(CheckTokenFile(absl::StrCat(::testing::TempDir(), "/none.bin"), 8, 256), "No such file");
}

TEST(TokenFileTest, CheckTokenFile_Directory_IsRefused) {
  ExpectRefused(CheckTokenFile(::testing::TempDir(), 8, 256), "not a regular file");
}

TEST(TokenFileTest, CheckTokenFile_Empty_IsRefusedAsTooShort) {
  ExpectRefused(CheckTokenFile(WriteTokens("empty.bin", {}), 8, 256), "0 tokens, fewer than one window");
}

TEST(TokenFileTest, CheckTokenFile_OddByteCount_IsRefused) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/odd.bin");
  std::ofstream(path, std::ios::binary) << std::string(101, '\0');
  ExpectRefused(CheckTokenFile(path, 8, 256), "101 bytes, an odd count");
}

TEST(TokenFileTest, CheckTokenFile_FewerThanSeqPlusOne_IsRefused) {
  ExpectRefused(CheckTokenFile(WriteTokens("short.bin", std::vector<uint16_t>(64, 1)), 64, 256),
                "64 tokens, fewer than one window of --seq + 1 = 65");
}

// The launcher scans every token, not only the first 4M.
TEST(TokenFileTest, CheckTokenFile_BadTokenPastFirst4M_NamesPosition) {
  std::vector<uint16_t> tokens((size_t{5} << 20), 3);
  tokens[(size_t{4} << 20) + 17] = 300;
  ExpectRefused(CheckTokenFile(WriteTokens("late.bin", tokens), 64, 256),
                absl::StrCat("token 300 at position ", (int64_t{4} << 20) + 17));
}

TEST(TokenFileTest, FirstTokenAtOrAbove_FindsFirstInChunk) {
  std::vector<uint16_t> tokens(200000, 1);
  tokens[150001] = 9;
  tokens[150000] = 8;
  EXPECT_EQ(FirstTokenAtOrAbove(tokens.data(), tokens.size(), 8), 150000);
  EXPECT_EQ(FirstTokenAtOrAbove(tokens.data(), tokens.size(), 10), -1);
  EXPECT_EQ(FirstTokenAtOrAbove(tokens.data(), tokens.size(), 70000), -1);
  EXPECT_EQ(FirstTokenAtOrAbove(tokens.data(), 13, 2), -1);  // the scalar tail
  tokens[11] = 2;
  EXPECT_EQ(FirstTokenAtOrAbove(tokens.data(), 13, 2), 11);
}

}  // namespace
}  // namespace stagehand
