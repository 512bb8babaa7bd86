// The library readahead through the real launcher on a CPU worker: the first run's worker writes the
// list of its touched library pages under XDG_CACHE_HOME, the second launcher reads it ahead (and
// says so at the end); a file changed since it was recorded is skipped; a malformed list is one
// warning line and is rewritten; --prefetch_libraries=false writes and reads nothing.
#include <dirent.h>
#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/readahead.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::ParseReadaheadList;
using ::stagehand::ReadaheadList;
using ::stagehand::testing::Exists;
using ::stagehand::testing::LauncherCommand;
using ::stagehand::testing::ReadFile;
using ::stagehand::testing::RunResult;
using ::stagehand::testing::TmpPath;

const std::vector<std::string> kJob = {"--device=cpu", "--workers=1",       "--model=tiny",
                                       "--steps=2",    "--micro_batches=2", "--global_batch=4"};

// The launcher with XDG_CACHE_HOME=`cache`.
RunResult Launch(const std::string& cache, std::vector<std::string> flags = kJob) {
  RunResult r;
  r.run_dir = TmpPath("readahead_run");
  const int status =
      std::system(absl::StrCat("XDG_CACHE_HOME=", cache, " ", LauncherCommand(flags, r.run_dir)).c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ReadFile(r.run_dir + ".out");
  return r;
}

// The list files in the cache's readahead directory.
std::vector<std::string> Lists(const std::string& cache) {
  std::vector<std::string> out;
  const std::string dir = cache + "/stagehand/readahead";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] != '.') out.push_back(dir + "/" + e->d_name);
  }
  closedir(d);
  return out;
}

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Readahead, FirstRunWritesTheList_SecondRunReadsIt) {
  const std::string cache = TmpPath("readahead_cache");
  RunResult first = Launch(cache);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_FALSE(absl::StrContains(first.output, "library readahead:")) << first.output;  // nothing to read yet
  EXPECT_TRUE(absl::StrContains(ReadFile(first.run_dir + "/rank0.log"), "library readahead list: "));
  std::vector<std::string> lists = Lists(cache);
  ASSERT_EQ(lists.size(), 1u);  // no temporary file left beside it
  absl::StatusOr<ReadaheadList> list = ParseReadaheadList(ReadFile(lists[0]));
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_GE(list->files.size(), 2u);
  EXPECT_TRUE(absl::EndsWith(list->files[0].path, "/worker")) << list->files[0].path;  // the executable first
  bool torch = false;
  for (const auto& f : list->files) torch = torch || absl::StrContains(f.path, "libtorch_cpu.so");
  EXPECT_TRUE(torch);
  EXPECT_GT(list->total_bytes(), 1 << 20);

  RunResult second = Launch(cache);
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(Count(second.output, "stagehand: library readahead: "), 1) << second.output;
  EXPECT_TRUE(absl::StrContains(second.output, absl::StrCat(list->files.size(), " files"))) << second.output;
  EXPECT_FALSE(absl::StrContains(second.output, "skipped")) << second.output;
  // The readahead's line comes before the run's closing lines: the last line is the verdict.
  EXPECT_LT(second.output.find("stagehand: library readahead: "), second.output.find("stagehand: done: "))
      << second.output;
  EXPECT_TRUE(absl::StartsWith(second.output.substr(second.output.rfind('\n', second.output.size() - 2) + 1),
                               "stagehand: done: "))
      << second.output;

  // A file whose size differs from the recorded one is skipped.
  const std::string path = list->files[0].path;
  std::string text = ReadFile(lists[0]);
  const std::string entry = absl::StrCat("file ", list->files[0].size, " ");
  ASSERT_TRUE(absl::StrContains(text, entry));
  absl::StrReplaceAll({{entry, absl::StrCat("file ", list->files[0].size + 1, " ")}}, &text);
  std::ofstream(lists[0], std::ios::trunc) << text;
  RunResult stale = Launch(cache);
  ASSERT_EQ(stale.exit_code, 0) << stale.output;
  EXPECT_TRUE(absl::StrContains(stale.output, "1 skipped (changed since recorded)")) << stale.output;
}

TEST(Readahead, MalformedList_IsOneWarningAndRewritten) {
  const std::string cache = TmpPath("readahead_cache");
  ASSERT_EQ(Launch(cache).exit_code, 0);
  std::vector<std::string> lists = Lists(cache);
  ASSERT_EQ(lists.size(), 1u);
  std::ofstream(lists[0], std::ios::trunc) << "stagehand-readahead 1\nkey x\nrange 0 4096\n";
  RunResult r = Launch(cache);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(Count(r.output, "warning: ignoring the library readahead list"), 1) << r.output;
  EXPECT_TRUE(absl::StrContains(r.output, "line 3: a range before any file")) << r.output;
  EXPECT_FALSE(absl::StrContains(r.output, "library readahead: ")) << r.output;
  EXPECT_TRUE(ParseReadaheadList(ReadFile(lists[0])).ok());  // the worker wrote a good one
}

TEST(Readahead, Off_WritesAndReadsNothing) {
  const std::string cache = TmpPath("readahead_cache");
  std::vector<std::string> off = kJob;
  off.push_back("--prefetch_libraries=false");
  RunResult r = Launch(cache, off);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(Exists(cache + "/stagehand/readahead"));
  ASSERT_EQ(Launch(cache).exit_code, 0);  // writes one
  ASSERT_EQ(Lists(cache).size(), 1u);
  RunResult again = Launch(cache, off);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_FALSE(absl::StrContains(again.output, "library readahead")) << again.output;
}

}  // namespace
