// Tests of the progress lines: nccl-tests' all-reduce columns and bandwidths.
#include "launcher/progress.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace stagehand
