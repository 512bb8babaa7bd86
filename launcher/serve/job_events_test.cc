// JobEvents: numbering, filtering of lines, waiting, the final state, text split into lines.
#include "launcher/serve/job_events.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

control::JobInfo State(control::JobState s) {
  control::JobInfo info;
  info.set_state(s);
  return info;
}

TEST(JobEventsTest, After_NumbersFromOne_AndSkipsLinesWhenAsked) {
  JobEvents events;
  events.AddState(State(control::JOB_STATE_QUEUED), false);
  events.AddLine("hello");
  ReportStepRequest step;
  step.set_step(3);
  events.AddStep(step);
  JobEvents::Read all = events.After(0, true, absl::Now());
  ASSERT_EQ(all.events.size(), 3u);
  EXPECT_EQ(all.events[0].seq(), 1);
  EXPECT_EQ(all.events[2].seq(), 3);
  EXPECT_EQ(all.events[1].line(), "hello");
  JobEvents::Read no_lines = events.After(0, false, absl::Now());
  ASSERT_EQ(no_lines.events.size(), 2u);
  EXPECT_EQ(no_lines.events[1].step().step(), 3);
  EXPECT_EQ(events.After(2, true, absl::Now()).events.size(), 1u);
  EXPECT_FALSE(all.ended);
}

TEST(JobEventsTest, FinalState_EndsTheLog_NothingAfterIt) {
  JobEvents events;
  events.AddState(State(control::JOB_STATE_SUCCEEDED), true);
  events.AddLine("late");
  JobEvents::Read r = events.After(0, true, absl::Now());
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_TRUE(r.ended);
  EXPECT_TRUE(events.ended());
}

TEST(JobEventsTest, After_WaitsForTheNextEvent) {
  JobEvents events;
  std::thread writer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    events.AddLine("later");
  });
  JobEvents::Read r = events.After(0, true, absl::Now() + absl::Seconds(10));
  writer.join();
  ASSERT_EQ(r.events.size(), 1u);
  EXPECT_EQ(r.events[0].line(), "later");
}

TEST(JobEventsTest, AddText_SplitsLines_KeepsPartialUntilItsEnd_DropsBarRedraws) {
  JobEvents events;
  events.AddText("one\ntw");
  EXPECT_EQ(events.last_seq(), 1);
  events.AddText("o\n\r[##..] 50%\r[####] 100%\n");
  JobEvents::Read r = events.After(0, true, absl::Now());
  ASSERT_EQ(r.events.size(), 3u);
  EXPECT_EQ(r.events[0].line(), "one");
  EXPECT_EQ(r.events[1].line(), "two");
  EXPECT_EQ(r.events[2].line(), "[####] 100%");
}

TEST(JobEventsTest, AddLine_BeyondTheCap_OneNoticeThenNothing) {
  JobEvents events;
  for (int64_t i = 0; i < JobEvents::kMaxLines + 10; ++i) events.AddLine("x");
  EXPECT_EQ(events.last_seq(), JobEvents::kMaxLines + 1);
  ReportStepRequest step;
  events.AddStep(step);  // steps and states still come through
  EXPECT_EQ(events.last_seq(), JobEvents::kMaxLines + 2);
}

}  // namespace
}  // namespace stagehand
