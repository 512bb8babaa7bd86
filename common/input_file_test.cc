// Inputs opened as regular files only: a FIFO with no writer, a directory and a device are refused at
// once with one line naming the input; a regular file reads whole, within its bound.
#include "common/input_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Tmp(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/input_file_", name); }

TEST(OpenRegularFile, Fifo_RefusedAtOnceNamingTheInput) {
  const std::string path = Tmp("fifo");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> text = ReadRegularFile(path, "--schedule_file=" + path);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "waited for a writer";
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(text.status().message()),
              AllOf(HasSubstr("--schedule_file=" + path + ": not a regular file but a FIFO"), Not(HasSubstr("\n"))));
}

TEST(OpenRegularFile, DirectoryAndDevice_Refused) {
  absl::StatusOr<RegularFile> dir = OpenRegularFile(::testing::TempDir(), "--job=dir");
  ASSERT_FALSE(dir.ok());
  EXPECT_THAT(std::string(dir.status().message()), HasSubstr("--job=dir: not a regular file but a directory"));
  absl::StatusOr<RegularFile> dev = OpenRegularFile("/dev/zero", "--data=/dev/zero");
  ASSERT_FALSE(dev.ok());
  EXPECT_THAT(std::string(dev.status().message()), HasSubstr("a character device"));
}

TEST(OpenRegularFile, Missing_IsNotFoundWithTheReason) {
  absl::StatusOr<RegularFile> f = OpenRegularFile(Tmp("none"), "--job=none");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("--job=none: cannot read it: No such file or directory"));
}

TEST(ReadRegularFile, RegularFile_ReadsWholeWithinItsBound) {
  const std::string path = Tmp("text");
  std::ofstream(path) << "0F0 0B0\n";
  absl::StatusOr<std::string> text = ReadRegularFile(path, "x");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "0F0 0B0\n");
  absl::StatusOr<std::string> small = ReadRegularFile(path, "--token_file=t", 4);
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("--token_file=t: 8 bytes, more than the 4"));
  absl::StatusOr<RegularFile> f = OpenRegularFile(path, "x");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->st.st_size, 8);
}

}  // namespace
}  // namespace stagehand
