// Tests of the progress lines: nccl-tests' all-reduce columns and bandwidths, the model's ETA, a
// program's throughput.
#include "launcher/run/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "protos/coordinator.pb.h"
#include "protos/job.pb.h"

namespace stagehand {
namespace {

TEST(AllReduceRow, TwoRanks256MiB_BusbwEqualsAlgbw) {
  // 64 Mi floats = 256 MiB in 1 ms: algbw 268.44 GB/s; with 2 ranks busbw = algbw * 2 * 1/2.
  const std::string row = Progress::AllReduceRow(int64_t{1} << 26, 2, 1e-3);
  EXPECT_NE(row.find("268435456"), std::string::npos) << row;
  EXPECT_NE(row.find("67108864"), std::string::npos) << row;
  EXPECT_NE(row.find("1000.0"), std::string::npos) << row;
  EXPECT_NE(row.find("268.44   268.44"), std::string::npos) << row;
}

TEST(AllReduceRow, FourRanks_BusbwIsOneAndAHalfAlgbw) {
  const std::string row = Progress::AllReduceRow(250000000, 4, 1.0);  // 1 GB in 1 s
  EXPECT_NE(row.find("1.00     1.50"), std::string::npos) << row;
}

TEST(AllReduceHeader, NamesNcclTestsColumns) {
  const std::string h = Progress::AllReduceHeader();
  for (const char* column : {"size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong", "(GB/s)"}) {
    EXPECT_NE(h.find(column), std::string::npos) << column;
  }
}

// The lines Progress prints for the loss-holding rank's report of each of `seconds`' steps.
std::string ModelLines(const std::vector<double>& seconds, int64_t steps) {
  JobSpec job;
  job.set_model("tiny");
  job.set_workers(1);
  job.set_steps(steps);
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  {
    Progress p(/*bar=*/false, out);
    for (size_t i = 0; i < seconds.size(); ++i) {
      ReportStepRequest r;
      r.set_step(static_cast<int64_t>(i));
      r.set_has_loss(true);
      r.set_loss(5);
      r.set_step_seconds(seconds[i]);
      r.set_tokens(100);
      p.PrintStep(r, job);
    }
  }
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  return text;
}

TEST(PrintStep, FirstStep_NoEta) {
  // The first step carries the start-up (10 s here): an ETA from it would say 990 s.
  const std::string text = ModelLines({10.0}, 100);
  EXPECT_NE(text.find("step 1/100"), std::string::npos) << text;
  EXPECT_EQ(text.find("ETA"), std::string::npos) << text;
}

TEST(PrintStep, LaterSteps_EtaFromTheirMeanNotTheFirstStep) {
  // Steps 2 and 3 take 0.1 s and 0.3 s: 97 steps left at 0.2 s = 19 s (the first step's 10 s left out).
  const std::string text = ModelLines({10.0, 0.1, 0.3}, 100);
  EXPECT_NE(text.find("step 3/100  loss 5.0000  0.300 s  333 tokens/s  ETA 19 s"), std::string::npos) << text;
}

TEST(PrintStep, Evaluation_ValLossPerplexityAndTokensSeen) {
  JobSpec job;
  job.set_model("tiny");
  job.set_workers(2);
  job.set_steps(10);
  std::string text;
  Progress p(/*bar=*/false, [&text](absl::string_view t) { text.append(t.data(), t.size()); });
  ReportStepRequest r;
  r.set_step(3);
  r.set_rank(1);
  r.set_has_loss(true);
  r.set_loss(2.5);
  r.set_step_seconds(0.5);
  r.set_tokens(2048);
  r.set_has_val_loss(true);
  r.set_val_loss(2.0);
  p.PrintStep(r, job);
  EXPECT_NE(text.find("seen 8.2k tokens  val_loss 2.0000  ppl 7.39"), std::string::npos) << text;
}

TEST(PrintStep, EveryRanksParameters_PrintedOnceWithTheTotal) {
  JobSpec job;
  job.set_model("tiny");
  job.set_workers(2);
  job.set_steps(10);
  std::string text;
  Progress p(/*bar=*/false, [&text](absl::string_view t) { text.append(t.data(), t.size()); });
  ReportStepRequest r;
  r.set_rank(0);
  r.set_parameters(1500000);
  p.PrintStep(r, job);
  EXPECT_EQ(text.find("parameters"), std::string::npos) << "printed before rank 1's count came: " << text;
  r.set_rank(1);
  r.set_parameters(2000000);
  p.PrintStep(r, job);
  r.set_step(1);
  p.PrintStep(r, job);
  EXPECT_NE(text.find("stagehand: parameters: 3500000 (3.50M): rank 0 1.50M, rank 1 2.00M\n"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("parameters"), text.rfind("parameters")) << text;
}

// A program's step: samples/s where its script reports samples but not tokens; tokens/s first.
TEST(PrintStep, ProgramWithSamples_SamplesPerSecondUnlessTokens) {
  JobSpec job;
  job.add_program("/usr/bin/python3");
  job.set_workers(2);
  std::string text;
  Progress p(/*bar=*/false, [&text](absl::string_view t) { text.append(t.data(), t.size()); });
  ReportStepRequest r;
  r.set_step(2);
  r.set_rank(0);
  r.set_step_seconds(0.5);
  r.set_samples(16);
  p.PrintStep(r, job);
  EXPECT_EQ(text, "stagehand: step 3  0.500 s  32.0 samples/s\n");
  text.clear();
  r.set_tokens(1024);
  p.PrintStep(r, job);
  EXPECT_EQ(text, "stagehand: step 3  0.500 s  2048 tokens/s\n");
  text.clear();
  r.set_rank(1);  // rank 0's steps are the job's
  p.PrintStep(r, job);
  EXPECT_EQ(text, "");
}

}  // namespace
}  // namespace stagehand
