// A CPU sweep over 1, 2 and 4 workers with the tiny model, through the real launcher: every file is
// written, report.json parses and agrees with steps.csv, and trace.json is valid Chrome trace JSON
// with one track per rank and no overlapping slices within a track.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "protos/job.pb.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

class SweepTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    dir_ = new std::string(absl::StrCat(tmp ? tmp : "/tmp", "/sweep_", getpid()));
    const char* srcdir = std::getenv("TEST_SRCDIR");
    setenv("OMP_NUM_THREADS", "1", 1);
    std::string cmd = absl::StrCat(srcdir ? srcdir : ".", "/stagehand/launcher/launcher",
                                   " --device=cpu --model=tiny --fp32 --steps=6 --micro_batches=4 --global_batch=16",
                                   " --sweep=1,2,4 --run_dir=", *dir_, " > ", *dir_, ".out 2>&1");
    int status = std::system(cmd.c_str());
    exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  static std::string* dir_;
  static int exit_code_;
};
std::string* SweepTest::dir_ = nullptr;
int SweepTest::exit_code_ = -1;

TEST_F(SweepTest, Sweep_OneTwoFourCpuWorkers_WritesEveryFile) {
  ASSERT_EQ(exit_code_, 0) << ReadFile(*dir_ + ".out");
  for (const char* f : {"sweep.csv", "sweep.md", "sweep.svg"}) EXPECT_FALSE(ReadFile(*dir_ + "/" + f).empty()) << f;
  std::vector<std::string> csv = absl::StrSplit(ReadFile(*dir_ + "/sweep.csv"), '\n', absl::SkipEmpty());
  ASSERT_EQ(csv.size(), 4u);
  for (int n : {1, 2, 4}) {
    const std::string run = absl::StrCat(*dir_, "/workers_", n);
    for (const char* f : {"report.json", "steps.csv", "trace.json", "startup_ledger.tsv", "job.textproto"}) {
      EXPECT_FALSE(ReadFile(run + "/" + f).empty()) << run << "/" << f;
    }
    for (int r = 0; r < n; ++r) EXPECT_FALSE(ReadFile(absl::StrCat(run, "/rank", r, ".log")).empty());
  }
  const std::string svg = ReadFile(*dir_ + "/sweep.svg");
  EXPECT_EQ(svg.rfind("<svg", 0) == 0 || svg.rfind("<?xml", 0) == 0, true);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

// The 1-worker point printed "predicted 0.0000 s/step (from the model's estimate) ... (+1179263%)",
// every point "0.0 TFLOP/s" and "done: 1 workers": on CPU workers the estimate (a GPU's) is not
// printed, FLOP/s are in a unit that shows them, and one worker is one worker.
TEST_F(SweepTest, ConsoleLines_NoGpuEstimateOnCpuFlopsInTheirUnitSingular) {
  const std::string out = ReadFile(*dir_ + ".out");
  EXPECT_EQ(out.find("from the model's estimate"), std::string::npos) << out;
  EXPECT_EQ(out.find(" 0.0 TFLOP/s"), std::string::npos) << out;
  EXPECT_NE(out.find("FLOP/s"), std::string::npos) << out;
  EXPECT_NE(out.find("stagehand: sweep: 1 worker\n"), std::string::npos) << out;
  EXPECT_NE(out.find("stagehand: done: 1 worker, 6 steps in "), std::string::npos) << out;
  EXPECT_EQ(out.find("1 workers"), std::string::npos) << out;
}

TEST_F(SweepTest, ReportJson_ParsesAndAgreesWithStepsCsv) {
  ASSERT_EQ(exit_code_, 0);
  for (int n : {1, 2, 4}) {
    const std::string run = absl::StrCat(*dir_, "/workers_", n);
    stagehand::RunReport report;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(run + "/report.json"), &report).ok()) << run;
    EXPECT_EQ(report.ranks_size(), n);
    EXPECT_EQ(report.steps(), 6);
    // steps.csv: step,rank,loss,seconds,tokens,peak_memory_bytes; the loss on the last rank.
    std::vector<std::string> lines = absl::StrSplit(ReadFile(run + "/steps.csv"), '\n', absl::SkipEmpty());
    ASSERT_EQ(lines.size(), 1u + 6 * n) << run;
    std::map<int, double> loss, seconds;
    for (size_t i = 1; i < lines.size(); ++i) {
      std::vector<std::string> f = absl::StrSplit(lines[i], ',');
      int step = 0, rank = 0;
      ASSERT_TRUE(absl::SimpleAtoi(f[0], &step) && absl::SimpleAtoi(f[1], &rank));
      if (rank == n - 1) {
        ASSERT_TRUE(absl::SimpleAtod(f[2], &loss[step]) && absl::SimpleAtod(f[3], &seconds[step])) << lines[i];
      }
    }
    EXPECT_NEAR(report.first_loss(), loss[0], 1e-6);
    EXPECT_NEAR(report.last_loss(), loss[5], 1e-6);
    double mean = 0;
    for (int s = report.warmup_steps(); s < 6; ++s) mean += seconds[s] / (6 - report.warmup_steps());
    EXPECT_NEAR(report.step_seconds(), mean, 1e-5) << run;
    EXPECT_NEAR(report.tokens_per_second(), 16 * 32 / mean, 1e-3 * 16 * 32 / mean);
    for (const auto& r : report.ranks()) {
      EXPECT_GE(r.bubble_fraction(), 0);
      EXPECT_LE(r.bubble_fraction(), 1);
      EXPECT_GT(r.forward_ms(), 0);
    }
  }
}

TEST_F(SweepTest, TraceJson_OneTrackPerRankNoOverlaps) {
  ASSERT_EQ(exit_code_, 0);
  for (int n : {1, 2, 4}) {
    const std::string run = absl::StrCat(*dir_, "/workers_", n);
    google::protobuf::Struct trace;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(ReadFile(run + "/trace.json"), &trace).ok()) << run;
    const auto& events = trace.fields().at("traceEvents").list_value().values();
    std::map<std::pair<int, int>, std::vector<std::pair<double, double>>> tracks;
    int processes = 0;
    for (const auto& v : events) {
      const auto& e = v.struct_value().fields();
      const std::string ph = e.at("ph").string_value();
      if (ph == "M" && e.at("name").string_value() == "process_name") ++processes;
      if (ph != "X") continue;
      ASSERT_GE(e.at("dur").number_value(), 0);
      tracks[{static_cast<int>(e.at("pid").number_value()), static_cast<int>(e.at("tid").number_value())}].push_back(
          {e.at("ts").number_value(), e.at("ts").number_value() + e.at("dur").number_value()});
    }
    EXPECT_EQ(processes, n);
    EXPECT_EQ(static_cast<int>(tracks.size()), n) << "one track per rank";
    for (auto& [track, slices] : tracks) {
      std::sort(slices.begin(), slices.end());
      for (size_t i = 1; i < slices.size(); ++i) {
        EXPECT_LE(slices[i - 1].second, slices[i].first + 1e-3) << run << " rank " << track.first << " slice " << i;
      }
      EXPECT_GE(slices.size(), 6u * 2) << "forward and backward slices of every step";
    }
  }
}

}  // namespace
