// The learning-rate schedule against values computed by hand (nanoGPT's get_lr).
#include "engine/lr_schedule.h"

#include "gtest/gtest.h"

namespace stagehand {
namespace {

TEST(LearningRate, WarmupThenCosine_MatchesHandComputation) {
  LrSchedule s{/*lr=*/1.0, /*min_lr=*/0.1, /*warmup_steps=*/4, /*decay_steps=*/12};
  EXPECT_DOUBLE_EQ(LearningRate(s, 0), 0.2);   // 1 * 1/5
  EXPECT_DOUBLE_EQ(LearningRate(s, 3), 0.8);   // 1 * 4/5
  EXPECT_DOUBLE_EQ(LearningRate(s, 4), 1.0);   // the cosine starts at the peak
  EXPECT_DOUBLE_EQ(LearningRate(s, 8), 0.55);  // halfway: 0.1 + 0.5 * 0.9
  // step 6: ratio 2/8, coeff (1 + cos(pi/4)) / 2 = 0.853553390593...
  EXPECT_NEAR(LearningRate(s, 6), 0.1 + 0.8535533905932737 * 0.9, 1e-15);
  EXPECT_DOUBLE_EQ(LearningRate(s, 12), 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 100), 0.1);
}

TEST(LrScheduleOf, NothingSet_IsConstant) {
  JobSpec job;
  job.set_lr(3e-3);
  job.set_steps(50);
  const LrSchedule s = LrScheduleOf(job);
  for (int64_t step : {0, 1, 25, 49}) EXPECT_DOUBLE_EQ(LearningRate(s, step), 3e-3);
}

TEST(LrScheduleOf, WarmupOnly_DecaysToATenthOverTheRun) {
  JobSpec job;
  job.set_lr(1.0);
  job.set_steps(20);
  job.set_warmup_steps(2);
  const LrSchedule s = LrScheduleOf(job);
  EXPECT_EQ(s.decay_steps, 20);
  EXPECT_DOUBLE_EQ(s.min_lr, 0.1);
  EXPECT_DOUBLE_EQ(LearningRate(s, 11), 0.55);  // halfway between 2 and 20
}

}  // namespace
}  // namespace stagehand
