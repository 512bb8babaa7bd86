// Tests of the device queue (job_queue.h): FIFO without overtaking, jobs that fit together at once,
// GPU ordinals, and the messages of a job that can never fit.
#include "launcher/serve/job_queue.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

control::Devices Cpu(int n) {
  control::Devices d;
  d.set_cpu_workers(n);
  return d;
}

control::Devices Gpu(int n) {
  control::Devices d;
  d.set_gpus(n);
  return d;
}

std::vector<std::string> Ids(const std::vector<Grant>& grants) {
  std::vector<std::string> ids;
  for (const Grant& g : grants) ids.push_back(g.id);
  return ids;
}

TEST(DeviceQueueTest, Schedule_TwoCpuJobsOverTheCap_RunOneAfterAnother) {
  DeviceQueue q(0, 4);
  ASSERT_TRUE(q.Enqueue("a", Cpu(3)).ok());
  ASSERT_TRUE(q.Enqueue("b", Cpu(3)).ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("a"));
  EXPECT_EQ(q.Position("b"), 1);
  EXPECT_THAT(q.Schedule(), IsEmpty());
  ASSERT_TRUE(q.Release("a").ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("b"));
  EXPECT_EQ(q.free_cpu_workers(), 1);
}

TEST(DeviceQueueTest, Schedule_TwoCpuJobsWithinTheCap_RunAtOnce) {
  DeviceQueue q(0, 4);
  ASSERT_TRUE(q.Enqueue("a", Cpu(2)).ok());
  ASSERT_TRUE(q.Enqueue("b", Cpu(2)).ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("a", "b"));
  EXPECT_EQ(q.free_cpu_workers(), 0);
  EXPECT_EQ(q.running(), 2);
}

TEST(DeviceQueueTest, Schedule_DisjointGpus_RunAtOnceOnTheLowestFree) {
  DeviceQueue q(4, 0);
  ASSERT_TRUE(q.Enqueue("a", Gpu(1)).ok());
  ASSERT_TRUE(q.Enqueue("b", Gpu(2)).ok());
  const std::vector<Grant> grants = q.Schedule();
  ASSERT_EQ(grants.size(), 2u);
  EXPECT_THAT(grants[0].gpu_ordinals, ElementsAre(0));
  EXPECT_THAT(grants[1].gpu_ordinals, ElementsAre(1, 2));
  ASSERT_TRUE(q.Release("a").ok());
  ASSERT_TRUE(q.Enqueue("c", Gpu(2)).ok());
  const std::vector<Grant> next = q.Schedule();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_THAT(next[0].gpu_ordinals, ElementsAre(0, 3));  // the holes, lowest first
}

TEST(DeviceQueueTest, Schedule_BigJobAtTheHead_LaterSmallJobsDoNotOvertake) {
  DeviceQueue q(2, 0);
  ASSERT_TRUE(q.Enqueue("small1", Gpu(1)).ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("small1"));
  ASSERT_TRUE(q.Enqueue("big", Gpu(2)).ok());
  ASSERT_TRUE(q.Enqueue("small2", Gpu(1)).ok());
  // One GPU is free and small2 would fit, but big is ahead of it.
  EXPECT_THAT(q.Schedule(), IsEmpty());
  EXPECT_EQ(q.Position("big"), 1);
  EXPECT_EQ(q.Position("small2"), 2);
  ASSERT_TRUE(q.Release("small1").ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("big"));
  ASSERT_TRUE(q.Release("big").ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("small2"));
}

TEST(DeviceQueueTest, CanEverFit_TooManyGpus_SaysWhatToPass) {
  DeviceQueue q(1, 4);
  absl::Status s = q.CanEverFit(Gpu(4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "asks for 4 GPUs but this server has 1; pass --gpus=1 or fewer");
  EXPECT_TRUE(q.CanEverFit(Gpu(1)).ok());
}

TEST(DeviceQueueTest, CanEverFit_TooManyCpuWorkers_SaysWhatToPass) {
  DeviceQueue q(1, 4);
  absl::Status s = q.CanEverFit(Cpu(6));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      s.message(),
      "asks for 6 CPU workers but this server runs at most 4 at once (--max_cpu_workers); pass --workers=4 or fewer");
  EXPECT_TRUE(q.CanEverFit(Cpu(4)).ok());
}

TEST(DeviceQueueTest, CanEverFit_GpusOnACpuServer_SuggestsCpu) {
  DeviceQueue q(0, 4);
  EXPECT_EQ(q.CanEverFit(Gpu(1)).message(), "asks for 1 GPU but this server has none; pass --device=cpu");
  EXPECT_THAT(std::string(q.CanEverFit(control::Devices()).message()), HasSubstr("asks for no workers"));
}

TEST(DeviceQueueTest, Enqueue_NeverFits_IsRefusedAndQueuesNothing) {
  DeviceQueue q(1, 4);
  EXPECT_EQ(q.Enqueue("a", Gpu(2)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.waiting(), 0);
  ASSERT_TRUE(q.Enqueue("b", Gpu(1)).ok());
  EXPECT_EQ(q.Enqueue("b", Gpu(1)).code(), absl::StatusCode::kAlreadyExists);
}

TEST(DeviceQueueTest, Remove_WaitingJob_LetsTheNextStart) {
  DeviceQueue q(1, 0);
  ASSERT_TRUE(q.Enqueue("a", Gpu(1)).ok());
  ASSERT_TRUE(q.Enqueue("b", Gpu(1)).ok());
  ASSERT_TRUE(q.Enqueue("c", Gpu(1)).ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("a"));
  EXPECT_EQ(q.Remove("a").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(q.Remove("b").ok());
  EXPECT_EQ(q.Remove("b").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(q.Position("c"), 1);
  ASSERT_TRUE(q.Release("a").ok());
  EXPECT_EQ(q.Release("a").code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("c"));
  EXPECT_EQ(q.Position("c"), 0);
}

TEST(DeviceQueueTest, Restore_RunningJob_HoldsItsGpus) {
  DeviceQueue q(2, 0);
  ASSERT_TRUE(q.Restore("old", Gpu(1), {1}).ok());
  EXPECT_EQ(q.Restore("other", Gpu(1), {1}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(q.Restore("bad", Gpu(1), {2}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(q.Restore("short", Gpu(2), {0}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(q.Enqueue("a", Gpu(1)).ok());
  ASSERT_TRUE(q.Enqueue("b", Gpu(1)).ok());
  const std::vector<Grant> grants = q.Schedule();
  ASSERT_EQ(grants.size(), 1u);
  EXPECT_THAT(grants[0].gpu_ordinals, ElementsAre(0));
  ASSERT_TRUE(q.Release("old").ok());
  EXPECT_THAT(Ids(q.Schedule()), ElementsAre("b"));
}

}  // namespace
}  // namespace stagehand
