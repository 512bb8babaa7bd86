// JobServer without its serve loop (Tick is never called, so nothing starts): submissions queue, and
// cancelling them ends them; what the server keeps of ended jobs is checked here. Runs of real jobs
// are tests/serve_test's.
#include "launcher/job_server.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

std::string StateDir() {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/job_server_test_", counter++);
}

control::SubmitJobRequest TinyJob(const std::string& submission) {
  control::SubmitJobRequest r;
  r.set_submission_id(submission);
  r.mutable_job()->set_device("cpu");
  r.mutable_job()->set_workers(1);
  r.mutable_job()->set_steps(3);
  r.mutable_job()->set_model("tiny");
  return r;
}

TEST(JobServerTest, EndedJobs_OnlyTheNewestKeepTheirEvents) {
  JobServerOptions o;
  o.state_dir = StateDir();
  o.inventory.cpu_cores = 1;
  o.ended_jobs_with_events = 2;
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<JobServer>> server = JobServer::Open(o, notes);
  ASSERT_TRUE(server.ok()) << server.status();
  const Caller admin{"admin", control::ROLE_ADMIN};
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<control::JobInfo> job = (*server)->Submit(admin, TinyJob(absl::StrCat("s", i)));
    ASSERT_TRUE(job.ok()) << job.status();
    ids.push_back(job->id());
  }
  for (const std::string& id : ids) {
    absl::StatusOr<control::JobInfo> cancelled = (*server)->Cancel(admin, id);
    ASSERT_TRUE(cancelled.ok()) << cancelled.status();
    EXPECT_EQ(cancelled->state(), control::JOB_STATE_CANCELLED);
  }
  // The two newest: every event (queued, then cancelled).
  for (int i = 1; i < 3; ++i) {
    absl::StatusOr<EventBatch> batch = (*server)->Events(admin, ids[i], 0, true, absl::ZeroDuration());
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->events.size(), 2u) << ids[i];
    EXPECT_EQ(batch->events[0].state().state(), control::JOB_STATE_QUEUED);
    EXPECT_TRUE(batch->ended);
  }
  // The oldest: its final state only (not the queued one), numbered after what the watcher had.
  absl::StatusOr<EventBatch> oldest = (*server)->Events(admin, ids[0], 0, true, absl::ZeroDuration());
  ASSERT_TRUE(oldest.ok()) << oldest.status();
  ASSERT_EQ(oldest->events.size(), 1u);
  EXPECT_EQ(oldest->events[0].seq(), 1);
  EXPECT_EQ(oldest->events[0].state().state(), control::JOB_STATE_CANCELLED);
  EXPECT_TRUE(oldest->ended);
}

}  // namespace
}  // namespace stagehand
