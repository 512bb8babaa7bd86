// BoolOption: the value where set, else the default declared in protos/job.proto.
#include "common/job_option.h"

#include "gtest/gtest.h"
#include "protos/job.pb.h"

namespace stagehand {
namespace {

TEST(JobOptionTest, UnsetTakesTheDeclaredDefault) {
  JobSpec job;
  EXPECT_TRUE(BoolOption(job, JobSpec::kTimingFieldNumber));
  EXPECT_TRUE(BoolOption(job, JobSpec::kPrefetchLibrariesFieldNumber));
  EXPECT_FALSE(BoolOption(job, JobSpec::kSaveParamsFieldNumber));
  EXPECT_FALSE(BoolOption(job, JobSpec::kProfileSingleStageFieldNumber));
  EXPECT_TRUE(BoolOption(job.model_spec(), ModelSpec::kFusedLayernormFieldNumber));
  EXPECT_FALSE(BoolOption(job.model_spec(), ModelSpec::kFp32FieldNumber));
}

TEST(JobOptionTest, SetTakesTheValue) {
  JobSpec job;
  job.set_timing(false);
  job.set_save_params(true);
  job.mutable_model_spec()->set_fused_layernorm(false);
  EXPECT_FALSE(BoolOption(job, JobSpec::kTimingFieldNumber));
  EXPECT_TRUE(BoolOption(job, JobSpec::kSaveParamsFieldNumber));
  EXPECT_FALSE(BoolOption(job.model_spec(), ModelSpec::kFusedLayernormFieldNumber));
}

TEST(JobOptionTest, ANumberThatIsNotABoolFieldStops) {
  JobSpec job;
  EXPECT_DEATH(BoolOption(job, JobSpec::kStepsFieldNumber), "has no bool field");
}

}  // namespace
}  // namespace stagehand
