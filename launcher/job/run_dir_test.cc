// Tests of the run directory's files: the atomic writer (whole file or the old one, never a cut one),
// steps.csv rows that stay whole on a full disk, and which directories a run may use.
#include "launcher/job/run_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace stagehand {
namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::ScopedTmpfs;

std::string NewDir(const std::string& name) {
  const char* t = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(t ? t : "/tmp", "/", name, "_", getpid());
  mkdir(dir.c_str(), 0755);
  return dir;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

ReportStepRequest Step(int64_t step, int rank) {
  ReportStepRequest r;
  r.set_step(step);
  r.set_rank(rank);
  r.set_step_seconds(0.25);
  r.set_tokens(64);
  return r;
}

TEST(WriteFileAtomically, NewFile_HasTheContentsAndNoTemporaryLeft) {
  const std::string dir = NewDir("atomic_new");
  ASSERT_TRUE(WriteFileAtomically(dir + "/report.json", "{\"a\": 1}\n").ok());
  EXPECT_EQ(ReadFile(dir + "/report.json"), "{\"a\": 1}\n");
  EXPECT_FALSE(Exists(dir + "/.report.json.tmp"));
}

TEST(WriteFileAtomically, ExistingFile_IsReplacedWhole) {
  const std::string dir = NewDir("atomic_replace");
  ASSERT_TRUE(WriteFileAtomically(dir + "/trace.json", "old").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/trace.json", "new and longer").ok());
  EXPECT_EQ(ReadFile(dir + "/trace.json"), "new and longer");
}

TEST(WriteFileAtomically, MissingDirectory_IsNotFoundNamingThePath) {
  const std::string path = NewDir("atomic_missing") + "/gone/report.json";
  const absl::Status s = WriteFileAtomically(path, "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_FALSE(Exists(path));
}

TEST(WriteFileAtomically, FullDisk_IsResourceExhaustedAndKeepsTheOldFile) {
  ScopedTmpfs fs(NewDir("atomic_full"), "256k");
  if (!fs.ok()) GTEST_SKIP() << fs.why();
  const std::string path = fs.dir() + "/trace.json";
  ASSERT_TRUE(WriteFileAtomically(path, "the earlier whole file").ok());
  const absl::Status s = WriteFileAtomically(path, std::string(1 << 20, 'x'));  // 1 MiB into 256 KiB
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("No space left on device"), absl::string_view::npos) << s;
  EXPECT_EQ(ReadFile(path), "the earlier whole file");
  EXPECT_FALSE(Exists(fs.dir() + "/.trace.json.tmp"));
}

TEST(WriteFileAtomically, FullDiskNoEarlierFile_LeavesNoFile) {
  ScopedTmpfs fs(NewDir("atomic_full_new"), "256k");
  if (!fs.ok()) GTEST_SKIP() << fs.why();
  EXPECT_FALSE(WriteFileAtomically(fs.dir() + "/report.json", std::string(1 << 20, 'x')).ok());
  EXPECT_FALSE(Exists(fs.dir() + "/report.json"));
  EXPECT_FALSE(Exists(fs.dir() + "/.report.json.tmp"));
}

TEST(StepsCsv, Append_RowsArePersistedAtOnce) {
  const std::string path = NewDir("steps_append") + "/steps.csv";
  StepsCsv csv;
  ASSERT_TRUE(csv.Open(path).ok());
  ASSERT_TRUE(csv.Append({Step(0, 0), Step(0, 1)}).ok());
  // Read before Close(): what a launcher killed now would leave.
  EXPECT_EQ(ReadFile(path),
            "step,rank,loss,seconds,tokens,peak_memory_bytes\n0,0,,0.250000,64,0\n0,1,,0.250000,64,0\n");
  ASSERT_TRUE(csv.Close().ok());
}

TEST(StepsCsv, GpuColumns_HeaderAndCells) {
  const std::string path = NewDir("steps_gpu") + "/steps.csv";
  StepsCsv csv;
  ASSERT_TRUE(csv.Open(path, /*gpu_columns=*/true).ok());
  ReportStepRequest gpu = Step(0, 0);
  StepTelemetry& t = *gpu.mutable_telemetry();
  t.set_samples(5);
  t.set_sm_mhz_mean(1752.4);
  t.set_sm_mhz_min(1695);
  t.set_mem_mhz_mean(3201);
  t.set_power_w_mean(698.25);
  t.set_power_w_max(701);
  t.set_power_limit_w(700);
  t.set_temperature_c_max(71);
  t.set_utilization_percent_mean(99);
  t.set_power_capped_fraction(0.4);
  t.set_throttled_fraction(0.4);
  t.set_throttle_reasons_seen(0x4);
  ASSERT_TRUE(csv.Append({gpu, Step(0, 1)}).ok());  // rank 1 sent no telemetry: empty cells
  ASSERT_TRUE(csv.Close().ok());
  const std::vector<std::string> lines = absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], absl::StrCat("step,rank,loss,seconds,tokens,peak_memory_bytes,", kGpuStepColumns));
  EXPECT_EQ(lines[1], "0,0,,0.250000,64,0,1752,1695,3201,698.2,701.0,700,71,,99,0.400,0.000,0.400,sw_power_cap");
  EXPECT_EQ(lines[2], "0,1,,0.250000,64,0,,,,,,,,,,,,,");
  for (const std::string& line : lines) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(line, ',')).size(), 19u) << line;
  }
}

TEST(StepsCsv, EvalAndIncarnationColumns_AfterTheOthersOnlyWhenAsked) {
  const std::string path = NewDir("steps_eval") + "/steps.csv";
  StepsCsv csv;
  ASSERT_TRUE(csv.Open(path, /*gpu_columns=*/false, /*eval_columns=*/true, /*incarnation_column=*/true).ok());
  ReportStepRequest evaluated = Step(3, 1);
  evaluated.set_has_loss(true);
  evaluated.set_loss(2.5);
  evaluated.set_has_val_loss(true);
  evaluated.set_val_loss(2.0);
  evaluated.set_incarnation(2);
  ReportStepRequest plain = Step(3, 0);
  plain.set_incarnation(1);
  ASSERT_TRUE(csv.Append({evaluated, plain}).ok());
  ASSERT_TRUE(csv.Close().ok());
  EXPECT_EQ(ReadFile(path),
            "step,rank,loss,seconds,tokens,peak_memory_bytes,val_loss,val_ppl,incarnation\n"
            "3,1,2.5,0.250000,64,0,2,7.3890561,2\n"
            "3,0,,0.250000,64,0,,,1\n");
}

TEST(StepsCsv, FullDisk_EveryRowWholeAndLaterAppendsFail) {
  ScopedTmpfs fs(NewDir("steps_full"), "256k");
  if (!fs.ok()) GTEST_SKIP() << fs.why();
  const std::string path = fs.dir() + "/steps.csv";
  StepsCsv csv;
  ASSERT_TRUE(csv.Open(path).ok());
  absl::Status s;
  int64_t step = 0;
  while (s.ok() && step < 100000) {
    std::vector<ReportStepRequest> batch;
    for (int i = 0; i < 7; ++i, ++step) batch.push_back(Step(step, 0));  // 7 rows: batches that straddle pages
    s = csv.Append(batch);
  }
  ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_FALSE(csv.Append({Step(step, 0)}).ok());
  const std::string text = ReadFile(path);
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    EXPECT_EQ(std::vector<std::string>(absl::StrSplit(line, ',')).size(), 6u) << line;
  }
}

TEST(CheckRunDir, Absent_IsOkAndCreatesNothing) {
  const std::string path = NewDir("check_absent") + "/a/b";
  EXPECT_TRUE(CheckRunDir(path, false).ok());
  EXPECT_FALSE(Exists(path));
}

TEST(CheckRunDir, File_IsInvalidArgument) {
  const std::string path = NewDir("check_file") + "/f";
  ASSERT_TRUE(WriteFileAtomically(path, "x").ok());
  EXPECT_EQ(CheckRunDir(path, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckRunDir(path + "/under", false).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckRunDir, EarlierRunWithoutOverwrite_IsFailedPreconditionNamingTheFlag) {
  const std::string dir = NewDir("check_reused");
  ASSERT_TRUE(WriteFileAtomically(dir + "/rank3.log", "stale").ok());
  const absl::Status s = CheckRunDir(dir, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--overwrite"), absl::string_view::npos) << s;
}

TEST(CheckRunDir, OverwriteWithForeignFile_IsRefused) {
  const std::string dir = NewDir("check_foreign");
  ASSERT_TRUE(WriteFileAtomically(dir + "/report.json", "{}").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/thesis.tex", "mine").ok());
  const absl::Status s = CheckRunDir(dir, true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("thesis.tex"), absl::string_view::npos) << s;
}

TEST(PrepareRunDir, Overwrite_RemovesEveryFileOfTheEarlierRun) {
  const std::string dir = NewDir("prepare_overwrite");
  mkdir((dir + "/workers_2").c_str(), 0755);
  for (const char* f : {"/rank0.log", "/rank3.log", "/steps.csv", "/.report.json.tmp", "/params_rank1.pt", "/sweep.md",
                        "/workers_2/rank1.log"}) {
    ASSERT_TRUE(WriteFileAtomically(dir + f, "old").ok()) << f;
  }
  ASSERT_TRUE(CheckRunDir(dir, true).ok());
  ASSERT_TRUE(PrepareRunDir(dir, true).ok());
  EXPECT_TRUE(CheckRunDir(dir, false).ok()) << "not empty after --overwrite";
}

TEST(CheckRunDir, ReadOnlyDirectory_IsPermissionDenied) {
  ScopedTmpfs fs(NewDir("check_ro"), "64k", "ro");
  if (!fs.ok()) {
    // Without root, a directory without write permission says the same.
    const std::string dir = NewDir("check_ro_perm");
    chmod(dir.c_str(), 0555);
    if (access(dir.c_str(), W_OK) == 0) GTEST_SKIP() << fs.why();
    EXPECT_EQ(CheckRunDir(dir, false).code(), absl::StatusCode::kPermissionDenied);
    return;
  }
  EXPECT_EQ(CheckRunDir(fs.dir(), false).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(CheckRunDir(fs.dir() + "/new", false).code(), absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace stagehand
