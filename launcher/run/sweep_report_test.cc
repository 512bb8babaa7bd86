// Unit tests of the sweep outputs: throughput, speedup and efficiency against the right base, the
// bubble bound, CSV quoting, the markdown table, and the SVG checked as well-formed XML with plain
// C++ (no python).
#include "launcher/run/sweep_report.h"

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::DoubleNear;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kTol = 1e-4;
constexpr double kGiB = static_cast<double>(int64_t{1} << 30);

SweepPoint Ok(int workers, double step_seconds, int stages = 0, int micro_batches = 0) {
  SweepPoint p;
  p.workers = workers;
  p.stages = stages;
  p.ok = true;
  p.step_seconds = step_seconds;
  p.micro_batches = micro_batches;
  p.run_dir = absl::StrCat("runs/w", workers);
  return p;
}

// A skipped point never started, so it has no run directory; a failed one has.
SweepPoint NotOk(int workers, const std::string& note, bool ran) {
  SweepPoint p;
  p.workers = workers;
  p.stages = workers;
  p.note = note;
  if (ran) p.run_dir = absl::StrCat("runs/w", workers);
  return p;
}

// A sweep of 1, 2 and 4 workers on a 2-GPU host: 1 and 2 ran, 4 was skipped.
std::vector<SweepPoint> Example() {
  SweepPoint one = Ok(1, 0.585, 1);
  one.tokens_per_second = 14000.4;
  one.peak_memory_bytes = {static_cast<int64_t>(19.6 * kGiB)};
  SweepPoint two = Ok(2, 0.373, 2, 8);
  two.tokens_per_second = 21957.6;  // the same tokens per step as one worker's: 0.585 / 0.373 faster
  two.peak_memory_bytes = {static_cast<int64_t>(19.6 * kGiB), static_cast<int64_t>(16.5 * kGiB)};
  return {one, two, NotOk(4, "4 GPUs asked, 2 visible", /*ran=*/false)};
}

int Count(const std::string& haystack, const std::string& needle) {
  int n = 0;
  for (size_t at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// Returns "" when every element is closed in order (self-closing ones count as closed), else what is
// wrong. Enough for the SVG we write: no comments, CDATA or '>' inside attribute values.
std::string TagBalanceError(const std::string& xml) {
  std::vector<std::string> open;
  for (size_t at = xml.find('<'); at != std::string::npos; at = xml.find('<', at + 1)) {
    const size_t end = xml.find('>', at);
    if (end == std::string::npos) return "unterminated tag";
    const std::string tag = xml.substr(at + 1, end - at - 1);
    if (tag.empty() || tag[0] == '?' || tag[0] == '!') continue;
    if (tag.back() == '/') continue;
    const std::string name = tag.substr(tag[0] == '/' ? 1 : 0, tag.find_first_of(" \n/", 1) - (tag[0] == '/' ? 1 : 0));
    if (tag[0] != '/') {
      open.push_back(name);
    } else if (open.empty() || open.back() != name) {
      return absl::StrCat("unexpected </", name, ">");
    } else {
      open.pop_back();
    }
  }
  return open.empty() ? "" : absl::StrCat("unclosed <", open.back(), ">");
}

// The text between tags must hold no raw '&' that does not start an entity, or it is not XML.
bool AmpersandsAreEntities(const std::string& xml) {
  for (size_t at = xml.find('&'); at != std::string::npos; at = xml.find('&', at + 1)) {
    const size_t semi = xml.find(';', at);
    if (semi == std::string::npos || semi - at > 6) return false;
  }
  return true;
}

void ExpectWellFormedSvg(const std::string& svg) {
  EXPECT_TRUE(absl::StartsWith(svg, "<svg")) << svg.substr(0, 80);
  EXPECT_TRUE(absl::EndsWith(svg, "</svg>\n"));
  EXPECT_EQ(TagBalanceError(svg), "");
  EXPECT_TRUE(AmpersandsAreEntities(svg));
  EXPECT_EQ(Count(svg, "<svg"), 1);
  EXPECT_EQ(Count(svg, "<text"), Count(svg, "</text>"));
  EXPECT_THAT(svg, Not(HasSubstr("nan")));
  EXPECT_THAT(svg, Not(HasSubstr("inf")));
}

// The horizontal grid lines: one per y tick.
int YTicks(const std::string& svg) { return Count(svg, "stroke=\"#dddddd\""); }

TEST(Speedup, BaseNotFirstInVector_UsesFewestWorkers) {
  const std::vector<SweepPoint> points = {Ok(4, 0.2), Ok(1, 0.8), Ok(2, 0.5)};
  EXPECT_THAT(Speedup(points, points[0]), DoubleNear(4.0, kTol));
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(1.0, kTol));
  EXPECT_THAT(Speedup(points, points[2]), DoubleNear(1.6, kTol));
  EXPECT_THAT(Efficiency(points, points[0]), DoubleNear(1.0, kTol));
  EXPECT_THAT(Efficiency(points, points[2]), DoubleNear(0.8, kTol));
}

TEST(Speedup, BaseFailed_NextSmallestSuccessfulPointIsBase) {
  const std::vector<SweepPoint> points = {NotOk(1, "rank 0 exited with code 1", /*ran=*/true), Ok(2, 0.5), Ok(4, 0.3)};
  EXPECT_EQ(Speedup(points, points[0]), 0);
  EXPECT_EQ(Efficiency(points, points[0]), 0);
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(1.0, kTol));
  EXPECT_THAT(Speedup(points, points[2]), DoubleNear(0.5 / 0.3, kTol));
  EXPECT_THAT(Efficiency(points, points[2]), DoubleNear(0.5 / 0.3 * 2 / 4, kTol));
}

TEST(Speedup, SkippedPoint_IsZero) {
  const std::vector<SweepPoint> points = Example();
  EXPECT_EQ(Speedup(points, points[2]), 0);
  EXPECT_EQ(Efficiency(points, points[2]), 0);
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(0.585 / 0.373, kTol));
  EXPECT_THAT(Efficiency(points, points[1]), DoubleNear(0.585 / 0.373 / 2, kTol));
}

TEST(Speedup, NoSuccessfulPoint_IsZero) {
  const std::vector<SweepPoint> points = {NotOk(1, "a", true), NotOk(2, "b", false)};
  EXPECT_EQ(Speedup(points, points[0]), 0);
  EXPECT_EQ(Efficiency(points, points[1]), 0);
}

TEST(Speedup, ZeroStepTime_IsNotABaseAndNotDividedBy) {
  const std::vector<SweepPoint> points = {Ok(1, 0), Ok(2, 0.5), Ok(4, 0)};
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(1.0, kTol));
  EXPECT_EQ(Speedup(points, points[2]), 0);
  EXPECT_EQ(Efficiency(points, points[2]), 0);
}

// A program whose every rank takes a batch of its own (weak scaling): the step time stays, the
// samples per step grow with the workers, and the speedup is the samples/s'.
TEST(Speedup, ProgramReportingSamples_FromSamplesPerSecond) {
  std::vector<SweepPoint> points = {Ok(1, 0.5), Ok(2, 0.5), Ok(4, 0.625)};
  points[0].samples_per_second = 32;
  points[1].samples_per_second = 64;
  points[2].samples_per_second = 102.4;
  EXPECT_EQ(ThroughputUnit(points), "samples/s");
  EXPECT_THAT(Throughput(points, points[2]), DoubleNear(102.4, kTol));
  EXPECT_THAT(Speedup(points, points[0]), DoubleNear(1.0, kTol));
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(2.0, kTol));
  EXPECT_THAT(Speedup(points, points[2]), DoubleNear(3.2, kTol));
  EXPECT_THAT(Efficiency(points, points[2]), DoubleNear(0.8, kTol));
  EXPECT_THAT(SweepMarkdown(points, "t"), HasSubstr("| workers | stages | step time (s) | samples/s | speedup |"));
  EXPECT_THAT(SweepMarkdown(points, "t"), HasSubstr("| 4 | 0 | 0.6250 | 102 | 3.20x | 80.0% | - | - |\n"));
  EXPECT_THAT(SweepCsv(points), HasSubstr("\n4,0,ok,0.625000,0.0,102.4,3.2000,0.8000,,,runs/w4\n"));
}

// Tokens where every run that finished reported them, even beside samples; samples only where every
// one did; else steps/s. A run that did not finish has no say.
TEST(ThroughputUnit, TokensThenSamplesThenSteps) {
  std::vector<SweepPoint> points = {Ok(1, 0.5), Ok(2, 0.25), NotOk(4, "oom", /*ran=*/true)};
  EXPECT_EQ(ThroughputUnit(points), "steps/s");
  EXPECT_THAT(Throughput(points, points[1]), DoubleNear(4.0, kTol));
  EXPECT_EQ(Throughput(points, points[2]), 0);
  points[0].samples_per_second = 10;
  EXPECT_EQ(ThroughputUnit(points), "steps/s");  // the 2-worker run reported none
  points[1].samples_per_second = 30;
  EXPECT_EQ(ThroughputUnit(points), "samples/s");
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(3.0, kTol));
  points[0].tokens_per_second = 100;
  points[1].tokens_per_second = 150;
  EXPECT_EQ(ThroughputUnit(points), "tokens/s");
  EXPECT_THAT(Speedup(points, points[1]), DoubleNear(1.5, kTol));
  EXPECT_EQ(ThroughputUnit({}), "steps/s");
}

TEST(BubbleBound, Values) {
  EXPECT_THAT(PipelineSpeedupBound(2, 8), DoubleNear(1.7778, kTol));
  EXPECT_THAT(PipelineSpeedupBound(4, 8), DoubleNear(32.0 / 11, kTol));
  EXPECT_THAT(PipelineSpeedupBound(4, 1), DoubleNear(1.0, kTol));  // one micro-batch: no overlap at all
  EXPECT_EQ(PipelineSpeedupBound(1, 8), 1);
  EXPECT_EQ(PipelineSpeedupBound(4, 0), 4);  // not a pipeline schedule: no bubble
  EXPECT_EQ(PipelineSpeedupBound(0, 1), 0);  // no stages: must not be 0/0
}

TEST(SweepCsv, Example_HeaderRowsAndSkippedStatus) {
  const std::string csv = SweepCsv(Example());
  EXPECT_EQ(csv,
            "workers,stages,status,step_seconds,tokens_per_second,samples_per_second,speedup,efficiency,"
            "bubble_bound,peak_memory_gib_max,run_dir\n"
            "1,1,ok,0.585000,14000.4,0.0,1.0000,1.0000,1.0000,19.600,runs/w1\n"
            "2,2,ok,0.373000,21957.6,0.0,1.5684,0.7842,1.7778,19.600,runs/w2\n"
            "4,4,skipped: 4 GPUs asked; 2 visible,,,,,,,,\n");
}

TEST(SweepCsv, CommasAndQuotes_StayOneFieldEach) {
  SweepPoint failed = NotOk(2, "rank 1: \"NCCL error\", unhandled\nsystem error", /*ran=*/true);
  failed.run_dir = "runs/a,b";
  SweepPoint ok = Ok(1, 0.5);
  ok.run_dir = "runs/say \"hi\"";
  const std::string csv = SweepCsv({ok, failed});
  EXPECT_THAT(csv, HasSubstr(",\"runs/say \"\"hi\"\"\"\n"));
  EXPECT_THAT(csv,
              HasSubstr("2,2,\"failed: rank 1: \"\"NCCL error\"\"; unhandled system error\",,,,,,,,\"runs/a,b\"\n"));
  // Outside quotes, every row has the header's 10 separators.
  for (absl::string_view row : absl::StrSplit(csv, '\n', absl::SkipEmpty())) {
    int commas = 0;
    bool quoted = false;
    for (char c : row) {
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) ++commas;
    }
    EXPECT_EQ(commas, 10) << row;
    EXPECT_FALSE(quoted) << row;
  }
}

TEST(SweepMarkdown, Example_FormatsEveryColumn) {
  EXPECT_EQ(SweepMarkdown(Example(), "GPT-small on 2x H200"),
            "## GPT-small on 2x H200\n\n"
            "| workers | stages | step time (s) | tokens/s | speedup | efficiency | bound | memory per GPU (GiB) |\n"
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
            "| 1 | 1 | 0.5850 | 14000 | 1.00x | 100.0% | 1.00x | 19.6 |\n"
            "| 2 | 2 | 0.3730 | 21958 | 1.57x | 78.4% | 1.78x | 19.6 / 16.5 |\n"
            "| 4 | 4 | skipped: 4 GPUs asked, 2 visible |  |  |  |  |  |\n");
}

TEST(SweepMarkdown, FailedNoteWithPipe_IsEscapedAndNotPipeline_HasNoBound) {
  const std::string md = SweepMarkdown({Ok(1, 0.5), NotOk(2, "a|b", /*ran=*/true)}, "t");
  EXPECT_THAT(md, HasSubstr("| 1 | 0 | 0.5000 | 2.00 | 1.00x | 100.0% | - | - |\n"));  // 2 steps/s
  EXPECT_THAT(md, HasSubstr("| 2 | 2 | failed: a\\|b |"));
}

TEST(SweepSvg, Example_IsWellFormedWithLabelsLegendAndAxes) {
  const std::string svg = SweepSvg(Example(), "Speedup <GPT> & \"friends\"");
  ExpectWellFormedSvg(svg);
  EXPECT_THAT(svg, HasSubstr("width=\"640\" height=\"420\""));
  EXPECT_THAT(svg, HasSubstr("fill=\"#ffffff\""));
  EXPECT_THAT(svg, HasSubstr("Speedup &lt;GPT&gt; &amp; &quot;friends&quot;"));
  EXPECT_THAT(svg, HasSubstr(">1.00x</text>"));
  EXPECT_THAT(svg, HasSubstr(">1.57x</text>"));
  EXPECT_THAT(svg, HasSubstr(">workers</text>"));
  EXPECT_THAT(svg, HasSubstr(">speedup over 1 worker</text>"));
  EXPECT_THAT(svg, HasSubstr(">ideal (linear)</text>"));
  EXPECT_THAT(svg, HasSubstr(">bubble bound</text>"));
  EXPECT_THAT(svg, HasSubstr(">measured</text>"));
  EXPECT_EQ(Count(svg, "<circle"), 2);  // the skipped 4-worker point is not drawn
  EXPECT_EQ(Count(svg, "<polyline"), 3);
  EXPECT_THAT(YTicks(svg), testing::AllOf(testing::Ge(5), testing::Le(6)));
  // The x ticks are the sweep's counts, the skipped one included: the reader sees what was asked.
  for (const char* tick : {">1</text>", ">2</text>", ">4</text>"}) EXPECT_THAT(svg, HasSubstr(tick));
  EXPECT_EQ(Count(svg, ">skipped</text>"), 1);
  if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::ofstream(absl::StrCat(dir, "/sweep_example.svg")) << SweepSvg(Example(), "GPT-small: 1 and 2 workers");
  }
}

TEST(SweepSvg, SinglePoint_NoDivisionByZero) {
  const std::string svg = SweepSvg({Ok(1, 0.5)}, "one");
  ExpectWellFormedSvg(svg);
  EXPECT_EQ(Count(svg, "<circle"), 1);
  EXPECT_THAT(svg, HasSubstr(">1.00x</text>"));
  EXPECT_THAT(YTicks(svg), testing::AllOf(testing::Ge(5), testing::Le(6)));
}

TEST(SweepSvg, NothingSucceeded_StillAValidEmptyPlot) {
  const std::string svg = SweepSvg({NotOk(1, "x", true), NotOk(2, "y", false)}, "none");
  ExpectWellFormedSvg(svg);
  EXPECT_EQ(Count(svg, "<circle"), 0);
  EXPECT_THAT(svg, HasSubstr(">speedup</text>"));
  EXPECT_EQ(Count(svg, ">failed</text>"), 1);
  EXPECT_EQ(Count(svg, ">skipped</text>"), 1);
  EXPECT_EQ(SweepSvg({}, "empty").substr(0, 4), "<svg");
  ExpectWellFormedSvg(SweepSvg({}, "empty"));
}

TEST(SweepSvg, BaseOfTwoWorkers_LabelsAxisAndScalesBound) {
  const std::vector<SweepPoint> points = {NotOk(1, "oom", true), Ok(2, 0.4, 2, 8), Ok(4, 0.25, 4, 8)};
  const std::string svg = SweepSvg(points, "base 2");
  ExpectWellFormedSvg(svg);
  EXPECT_THAT(svg, HasSubstr(">speedup over 2 workers</text>"));
  EXPECT_THAT(svg, HasSubstr(">1.60x</text>"));
  // The bound relative to the base is the model's ratio: (32/11) / (16/9).
  EXPECT_THAT(SweepMarkdown(points, "t"), HasSubstr("| 1.60x | 80.0% | 1.64x |"));
}

TEST(SweepSvg, ManyScales_FiveOrSixYTicks) {
  for (double step : {0.9, 0.5, 0.3, 0.11, 0.07, 0.02, 0.013, 0.0101}) {
    const std::string svg = SweepSvg({Ok(1, 1.0), Ok(8, step), Ok(64, step / 3)}, "scale");
    ExpectWellFormedSvg(svg);
    EXPECT_THAT(YTicks(svg), testing::AllOf(testing::Ge(5), testing::Le(6))) << step;
  }
}

}  // namespace
}  // namespace stagehand
