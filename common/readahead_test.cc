// The readahead list: its text, merging, staleness, malformed lists, and this process's own pages.
#include "common/readahead.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

std::string TmpDir() {
  static int n = 0;
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(t != nullptr ? t : "/tmp", "/readahead_test.", getpid(), ".", n++);
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string WriteFile(const std::string& path, size_t bytes) {
  std::ofstream(path, std::ios::trunc) << std::string(bytes, 'x');
  return path;
}

FileRanges Recorded(const std::string& path, std::vector<ByteRange> ranges) {
  struct stat st;
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  return {path, st.st_size, int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec, std::move(ranges)};
}

TEST(MergeRanges, OverlappingAndWithinGap_AreMergedAndSorted) {
  std::vector<ByteRange> merged =
      MergeRanges({{8192, 4096}, {0, 4096}, {4096, 4096}, {20480, 4096}, {40960, 4096}, {6000, 100}}, 8192);
  // 0..12288 touching; 20480 is 8192 past 12288 (within the gap); 40960 is 16384 past 24576.
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0], (ByteRange{0, 24576}));
  EXPECT_EQ(merged[1], (ByteRange{40960, 4096}));
}

TEST(MergeRanges, NoGap_KeepsSeparateRangesAndDropsEmpty) {
  std::vector<ByteRange> merged = MergeRanges({{0, 4096}, {8192, 4096}, {100, 0}}, 0);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[1], (ByteRange{8192, 4096}));
}

TEST(ReadaheadList, FormatThenParse_GivesTheSameList) {
  ReadaheadList list;
  list.key = "readahead-v1 worker=/a b/worker size=10 mtime_ns=5";
  list.files.push_back({"/lib/with space/libx.so.1", 1 << 20, 1234567890123, {{0, 4096}, {65536, 8192}}});
  list.files.push_back({"/lib/liby.so", 4096, 7, {{0, 4096}}});
  absl::StatusOr<ReadaheadList> back = ParseReadaheadList(FormatReadaheadList(list));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->key, list.key);
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[0].path, "/lib/with space/libx.so.1");
  EXPECT_EQ(back->files[0].mtime_ns, 1234567890123);
  EXPECT_EQ(back->files[0].ranges, list.files[0].ranges);
  EXPECT_EQ(back->total_bytes(), 4096 + 8192 + 4096);
}

TEST(ReadaheadList, Malformed_IsInvalidArgumentNamingTheLine) {
  const std::string head = "stagehand-readahead 1\nkey k\n";
  for (const auto& [text, line] : std::vector<std::pair<std::string, std::string>>{
           {"", "line 1"},
           {"stagehand-readahead 2\nkey k\n", "line 1"},
           {"stagehand-readahead 1\n", "line 2"},
           {head + "range 0 4096\n", "line 3"},
           {head + "file 10 5 relative.so\n", "line 3"},
           {head + "file ten 5 /a.so\n", "line 3"},
           {head + "file 8192 5 /a.so\nrange 4096 8192\n", "line 4"},  // past the end
           {head + "file 8192 5 /a.so\nrange -1 10\n", "line 4"},
           {head + "file 8192 5 /a.so\nbogus\n", "line 4"},
           {std::string("\x7f"
                        "ELF\x02\x01",
                        6),
            "line 1"}}) {
    absl::StatusOr<ReadaheadList> list = ParseReadaheadList(text);
    ASSERT_FALSE(list.ok()) << text;
    EXPECT_EQ(list.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(list.status().message(), line)) << text << ": " << list.status();
  }
}

TEST(PutLauncherFilesFirst, DriverAndNvml_MoveToTheFrontInOrder) {
  ReadaheadList list;
  for (const char* p : {"/w/worker", "/a/libtorch.so", "/d/libcuda.so.580.1", "/b/libcudart.so.13",
                        "/d/libnvidia-ml.so.580.1", "/c/libcudnn.so.9"}) {
    list.files.push_back({p, 4096, 1, {{0, 4096}}});
  }
  PutLauncherFilesFirst(list);
  std::vector<std::string> order;
  for (const FileRanges& f : list.files) order.push_back(f.path);
  EXPECT_EQ(order, (std::vector<std::string>{"/d/libcuda.so.580.1", "/d/libnvidia-ml.so.580.1", "/w/worker",
                                             "/a/libtorch.so", "/b/libcudart.so.13", "/c/libcudnn.so.9"}));
}

TEST(ReadAhead, ChangedSizeOrMtimeOrMissing_IsSkipped) {
  const std::string dir = TmpDir();
  const std::string same = WriteFile(dir + "/same.so", 16384);
  const std::string grown = WriteFile(dir + "/grown.so", 16384);
  const std::string touched = WriteFile(dir + "/touched.so", 16384);
  ReadaheadList list;
  list.files = {Recorded(same, {{0, 8192}}),
                Recorded(grown, {{0, 4096}}),
                Recorded(touched, {{0, 4096}}),
                {dir + "/missing.so", 4096, 1, {{0, 4096}}}};
  WriteFile(grown, 20000);
  timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
  ASSERT_EQ(utimensat(AT_FDCWD, touched.c_str(), times, 0), 0);
  ReadaheadStats stats = ReadAhead(list);
  EXPECT_EQ(stats.files, 1);
  EXPECT_EQ(stats.skipped, 3);
  EXPECT_EQ(stats.bytes, 8192);
}

TEST(ReadAhead, Cancelled_ReadsNothing) {
  const std::string dir = TmpDir();
  ReadaheadList list;
  list.files = {Recorded(WriteFile(dir + "/a.so", 4096), {{0, 4096}})};
  std::atomic<bool> cancel{true};
  ReadaheadStats stats = ReadAhead(list, &cancel);
  EXPECT_TRUE(stats.cancelled);
  EXPECT_EQ(stats.bytes, 0);
}

TEST(ReadaheadKey, RewrittenBinary_ChangesTheKey) {
  const std::string dir = TmpDir();
  const std::string bin = WriteFile(dir + "/worker", 100);
  absl::StatusOr<std::string> before = ReadaheadKey(bin);
  ASSERT_TRUE(before.ok());
  EXPECT_TRUE(absl::StrContains(*before, "size=100"));
  WriteFile(bin, 101);
  EXPECT_NE(*ReadaheadKey(bin), *before);
  EXPECT_NE(ReadaheadListPath(dir, *ReadaheadKey(bin)), ReadaheadListPath(dir, *before));
  EXPECT_EQ(ReadaheadKey(dir + "/none").status().code(), absl::StatusCode::kNotFound);
}

TEST(TouchedLibraryPages, ThisProcess_ListsItsExecutableFirstAndItsLibraries) {
  absl::StatusOr<ReadaheadList> list = TouchedLibraryPages(64 * 1024);
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_GE(list->files.size(), 2u);
  char exe[4096];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  EXPECT_EQ(list->files[0].path, std::string(exe, n));
  EXPECT_EQ(list->key, *ReadaheadKey(std::string(exe, n)));
  bool libc = false;
  for (const FileRanges& f : list->files) {
    libc = libc || absl::StrContains(f.path, "libc.so");
    ASSERT_FALSE(f.ranges.empty()) << f.path;
    for (const ByteRange& r : f.ranges) EXPECT_LE(r.offset + r.length, f.size) << f.path;
  }
  EXPECT_TRUE(libc);
  EXPECT_GT(list->total_bytes(), 0);
  // What it writes reads back as the same list.
  absl::StatusOr<ReadaheadList> back = ParseReadaheadList(FormatReadaheadList(*list));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->files.size(), list->files.size());
}

TEST(ReadaheadRecorder, Start_WritesTheListThePrefetcherReads) {
  const std::string dir = TmpDir() + "/cache/readahead";  // made by the recorder
  ReadaheadRecorder recorder;
  recorder.Start(dir);
  absl::StatusOr<std::string> line = recorder.Join();
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(absl::StrContains(*line, "library readahead list:")) << *line;
  LibraryPrefetcher prefetcher;
  prefetcher.Start(dir, "/proc/self/exe");
  ReadaheadStats stats = prefetcher.Join();
  EXPECT_GE(stats.files, 2);
  EXPECT_EQ(stats.skipped, 0);
  EXPECT_GT(stats.bytes, 0);
}

// Two jobs of one worker: the second's list keeps the first's pages of an unchanged file, drops those of
// a file that changed since, and keeps a file only the first touched (after the second's own files).
TEST(MergeReadaheadLists, SameKey_UnionOfUnchangedFilesAndTheOldOnlyFilesLast) {
  ReadaheadList old, fresh;
  old.key = fresh.key = "k";
  old.files = {{"/lib/a.so", 1 << 20, 5, {{0, 4096}, {524288, 4096}}},
               {"/lib/b.so", 8192, 6, {{0, 4096}}},
               {"/lib/only_old.so", 4096, 7, {{0, 4096}}}};
  fresh.files = {{"/lib/b.so", 8192, 9, {{4096, 4096}}},  // rebuilt since: the old range no longer applies
                 {"/lib/a.so", 1 << 20, 5, {{4096, 4096}, {1 << 19, 8192}}}};
  const ReadaheadList merged = MergeReadaheadLists(old, fresh, /*gap=*/0);
  ASSERT_EQ(merged.files.size(), 3u);
  EXPECT_EQ(merged.files[0].path, "/lib/b.so");
  EXPECT_EQ(merged.files[0].ranges, (std::vector<ByteRange>{{4096, 4096}}));
  EXPECT_EQ(merged.files[1].path, "/lib/a.so");
  EXPECT_EQ(merged.files[1].ranges, (std::vector<ByteRange>{{0, 8192}, {524288, 8192}}));
  EXPECT_EQ(merged.files[2].path, "/lib/only_old.so");
  ReadaheadList other = old;
  other.key = "another worker";
  EXPECT_EQ(MergeReadaheadLists(other, fresh, 0).files.size(), 2u) << "a list of another key adds nothing";
  const ReadaheadList filtered =
      MergeReadaheadLists(old, fresh, 0, [](const FileRanges& f) { return f.path != "/lib/only_old.so"; });
  EXPECT_EQ(filtered.files.size(), 2u) << "an old-only file the filter refuses is dropped";
}

// Writes `earlier` (this test binary's key) as the list in `dir`, runs a recorder there and returns its
// line; `after` gets the list file's text.
std::string RecordOver(const std::string& dir, ReadaheadList earlier, std::string* after) {
  earlier.key = *ReadaheadKey("/proc/self/exe");
  const std::string path = ReadaheadListPath(dir, earlier.key);
  EXPECT_TRUE(WriteReadaheadList(path, earlier).ok());
  ReadaheadRecorder recorder;
  recorder.Start(dir);
  absl::StatusOr<std::string> line = recorder.Join();
  EXPECT_TRUE(line.ok()) << line.status();
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  *after = text.str();
  return line.ok() ? *line : "";
}

// The recorder adds to the list it finds: a file of an earlier job's list stays in it.
TEST(ReadaheadRecorder, Start_KeepsWhatTheListAlreadyHeld) {
  const std::string extra = WriteFile(TmpDir() + "/libextra.so", 16384);
  ReadaheadList earlier;
  earlier.files.push_back(Recorded(extra, {{0, 8192}}));
  earlier.files.push_back({TmpDir() + "/libgone.so", 4096, 1, {{0, 4096}}});  // no longer on disk
  std::string text;
  const std::string line = RecordOver(TmpDir(), earlier, &text);
  EXPECT_TRUE(absl::StrContains(line, "MiB and 1 files more from earlier jobs")) << line;
  absl::StatusOr<ReadaheadList> now = ParseReadaheadList(text);
  ASSERT_TRUE(now.ok()) << now.status();
  ASSERT_GE(now->files.size(), 2u);
  EXPECT_EQ(now->files.back().path, extra);
  EXPECT_EQ(now->files.back().ranges, (std::vector<ByteRange>{{0, 8192}}));
  for (const FileRanges& f : now->files)
    EXPECT_FALSE(absl::StrContains(f.path, "libgone.so")) << "a removed file stays";
}

// A list that would grow past twice this job's pages starts again from them: an earlier job's file of
// 4 GiB (sparse) is not kept.
TEST(ReadaheadRecorder, Start_DropsHistoryThatWouldOutgrowTheJob) {
  const std::string big = TmpDir() + "/libbig.so";
  {
    UniqueFd fd(open(big.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(ftruncate(fd.get(), int64_t{4} << 30), 0);
  }
  ReadaheadList earlier;
  earlier.files.push_back(Recorded(big, {{0, int64_t{4} << 30}}));
  std::string text;
  const std::string line = RecordOver(TmpDir(), earlier, &text);
  EXPECT_TRUE(absl::StrContains(line, "earlier jobs' pages dropped")) << line;
  EXPECT_FALSE(absl::StrContains(text, "libbig.so"));
  std::remove(big.c_str());
}

TEST(LibraryPrefetcher, MissingOrMalformedList_ReadsNothing) {
  const std::string dir = TmpDir();
  LibraryPrefetcher none;
  none.Start(dir, "/proc/self/exe");
  EXPECT_EQ(none.Join().files, 0);
  std::ofstream(ReadaheadListPath(dir, *ReadaheadKey("/proc/self/exe"))) << "garbage\n";
  LibraryPrefetcher bad;
  bad.Start(dir, "/proc/self/exe");  // one warning line on stderr
  EXPECT_EQ(bad.Join().files, 0);
}

}  // namespace
}  // namespace stagehand
