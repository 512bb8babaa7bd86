// Tests of the job store (job_store.h) on a real SQLite file under TEST_TMPDIR: round trips, idempotent
// submits, state changes, reopening, refusal of files that are not ours, and a SIGKILL mid-insert.
#include "launcher/serve/job_store.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A fresh directory per test (not created: Open makes it).
std::string StateDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", test->name(), "_", ::getpid());
}

std::unique_ptr<JobStore> OpenOrDie(const std::string& dir) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

JobRecord Job(const std::string& id, const std::string& by = "alice") {
  JobRecord job;
  job.id = id;
  job.submission_id = "sub-" + id;
  job.submitted_by = by;
  job.spec.set_name("run-" + id);
  job.spec.set_model("allreduce");
  job.spec.set_workers(2);
  job.devices.set_cpu_workers(2);
  job.submitted = absl::FromUnixMillis(1760000000123);
  job.spec_digest = "digest-" + id;
  return job;
}

std::vector<std::string> Ids(const std::vector<JobRecord>& jobs) {
  std::vector<std::string> ids;
  for (const JobRecord& j : jobs) ids.push_back(j.id);
  return ids;
}

// Raw SQL on a file of our own making, for the refusal tests.
void RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* err = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << (err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

TEST(JobStoreTest, Insert_NewJob_RoundTripsEveryField) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  JobRecord job = Job("j1");
  job.devices.add_gpu_ordinals(3);
  absl::StatusOr<JobRecord> inserted = store->Insert(job);
  ASSERT_TRUE(inserted.ok()) << inserted.status();
  EXPECT_GT(inserted->seq, 0);
  absl::StatusOr<std::optional<JobRecord>> got = store->Get("j1");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(got->has_value());
  const JobRecord& r = **got;
  EXPECT_EQ(r.submission_id, "sub-j1");
  EXPECT_EQ(r.submitted_by, "alice");
  EXPECT_EQ(r.state, control::JOB_STATE_QUEUED);
  EXPECT_EQ(r.spec.SerializeAsString(), job.spec.SerializeAsString());
  EXPECT_EQ(r.devices.SerializeAsString(), job.devices.SerializeAsString());
  EXPECT_EQ(r.submitted, job.submitted);
  EXPECT_EQ(r.started, absl::InfinitePast());
  EXPECT_EQ(r.seq, inserted->seq);
  EXPECT_EQ(r.spec_digest, "digest-j1");
  absl::StatusOr<std::optional<JobRecord>> none = store->Get("nope");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(JobStoreTest, Insert_SameSubmissionSameDigest_ReturnsTheFirstJob) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  absl::StatusOr<JobRecord> first = store->Insert(Job("j1"));
  ASSERT_TRUE(first.ok()) << first.status();
  JobRecord retry = Job("j1");
  retry.id = "j2";  // the server picks a new id for the retried call
  absl::StatusOr<JobRecord> second = store->Insert(retry);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->id, "j1");
  EXPECT_EQ(second->seq, first->seq);
  EXPECT_THAT(Ids(*store->List(0)), ElementsAre("j1"));
}

TEST(JobStoreTest, Insert_SameSubmissionOtherDigest_IsAlreadyExists) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Insert(Job("j1")).ok());
  JobRecord other = Job("j1");
  other.id = "j2";
  other.spec_digest = "another";
  absl::StatusOr<JobRecord> r = store->Insert(other);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("submission id sub-j1 was used for another job"));
  // The same submission id from another token is another submission.
  JobRecord bob = Job("j1", "bob");
  bob.id = "j3";
  ASSERT_TRUE(store->Insert(bob).ok());
  // A job id is unique whatever the submission.
  JobRecord clash = Job("j3");
  EXPECT_EQ(store->Insert(clash).status().code(), absl::StatusCode::kAlreadyExists);
}

TEST(JobStoreTest, List_StatesAndLimit_NewestFirst) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  for (const char* id : {"a", "b", "c", "d"}) ASSERT_TRUE(store->Insert(Job(id)).ok());
  ASSERT_TRUE(store->MarkRunning("b", absl::Now(), control::Devices(), "/runs/b").ok());
  EXPECT_THAT(Ids(*store->List(0)), ElementsAre("d", "c", "b", "a"));
  EXPECT_THAT(Ids(*store->List(2)), ElementsAre("d", "c"));
  EXPECT_THAT(Ids(*store->List(0, {control::JOB_STATE_RUNNING})), ElementsAre("b"));
  EXPECT_THAT(Ids(*store->List(0, {control::JOB_STATE_SUCCEEDED})), IsEmpty());
  EXPECT_THAT(Ids(*store->Queued()), ElementsAre("a", "c", "d"));
}

TEST(JobStoreTest, MarkRunningThenEnded_StoresEachChange) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Insert(Job("j1")).ok());
  control::Devices given;
  given.set_gpus(2);
  given.add_gpu_ordinals(0);
  given.add_gpu_ordinals(1);
  const absl::Time start = absl::FromUnixMillis(1760000001000), end = absl::FromUnixMillis(1760000009000);
  ASSERT_TRUE(store->MarkRunning("j1", start, given, "/state/runs/j1").ok());
  EXPECT_EQ(store->MarkRunning("j1", start, given, "x").code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(store->SetCancelledBy("j1", "bob").ok());
  ASSERT_TRUE(store->MarkEnded("j1", control::JOB_STATE_CANCELLED, end, 143, "cancelled by bob", 17).ok());
  EXPECT_EQ(store->MarkEnded("j1", control::JOB_STATE_FAILED, end, 1, "", 0).code(),
            absl::StatusCode::kFailedPrecondition);
  const JobRecord r = **store->Get("j1");
  EXPECT_EQ(r.state, control::JOB_STATE_CANCELLED);
  EXPECT_THAT(r.devices.gpu_ordinals(), ElementsAre(0, 1));
  EXPECT_EQ(r.run_dir, "/state/runs/j1");
  EXPECT_EQ(r.cancelled_by, "bob");
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_EQ(r.root_cause, "cancelled by bob");
  EXPECT_EQ(r.steps_done, 17);
  const control::JobInfo info = ToJobInfo(r);
  EXPECT_EQ(info.start_time_ms(), 1760000001000);
  EXPECT_EQ(info.end_time_ms(), 1760000009000);
  EXPECT_EQ(info.submit_time_ms(), 1760000000123);
  EXPECT_EQ(info.name(), "run-j1");
  EXPECT_EQ(info.queue_position(), 0);
}

TEST(JobStoreTest, MarkEnded_BadStateOrUnknownJob_IsRefused) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Insert(Job("j1")).ok());
  EXPECT_EQ(store->MarkEnded("j1", control::JOB_STATE_RUNNING, absl::Now(), 0, "", 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->MarkEnded("nope", control::JOB_STATE_FAILED, absl::Now(), 1, "", 0).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store->MarkRunning("nope", absl::Now(), control::Devices(), "").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->SetCancelledBy("nope", "bob").code(), absl::StatusCode::kNotFound);
  // A queued job can end without running (cancelled while waiting).
  EXPECT_TRUE(store->MarkEnded("j1", control::JOB_STATE_CANCELLED, absl::Now(), 0, "cancelled", 0).ok());
  EXPECT_EQ(ToJobInfo(**store->Get("j1")).start_time_ms(), 0);
}

TEST(JobStoreTest, MarkRunningLost_RunningJobs_BecomeLostWithTheReason) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  for (const char* id : {"a", "b", "c"}) ASSERT_TRUE(store->Insert(Job(id)).ok());
  ASSERT_TRUE(store->MarkRunning("a", absl::Now(), control::Devices(), "").ok());
  ASSERT_TRUE(store->MarkRunning("c", absl::Now(), control::Devices(), "").ok());
  const absl::Time now = absl::FromUnixSeconds(1770000000);
  absl::StatusOr<std::vector<JobRecord>> lost = store->MarkRunningLost(now, "the server restarted");
  ASSERT_TRUE(lost.ok()) << lost.status();
  EXPECT_THAT(Ids(*lost), ElementsAre("a", "c"));
  EXPECT_EQ((*lost)[0].state, control::JOB_STATE_LOST);
  const JobRecord c = **store->Get("c");
  EXPECT_EQ(c.state, control::JOB_STATE_LOST);
  EXPECT_EQ(c.ended, now);
  EXPECT_EQ(c.root_cause, "the server restarted");
  EXPECT_EQ((**store->Get("b")).state, control::JOB_STATE_QUEUED);
  EXPECT_THAT(Ids(*store->MarkRunningLost(now, "again")), IsEmpty());
}

TEST(JobStoreTest, Tokens_AddFindRevoke_KeepNamesUnique) {
  auto store = OpenOrDie(StateDir());
  ASSERT_NE(store, nullptr);
  const absl::Time created = absl::FromUnixSeconds(1760000000);
  ASSERT_TRUE(store->AddToken({"bob", control::ROLE_VIEW, "h1", created}).ok());
  ASSERT_TRUE(store->AddToken({"admin", control::ROLE_ADMIN, "h2", created}).ok());
  absl::Status dup = store->AddToken({"bob", control::ROLE_SUBMIT, "h3", created});
  EXPECT_EQ(dup.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(dup.message()), HasSubstr("'bob'"));
  std::vector<TokenRecord> tokens = *store->FindTokens();
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens[0].name, "admin");
  EXPECT_EQ(tokens[1].role, control::ROLE_VIEW);
  EXPECT_EQ(tokens[1].hash, "h1");
  EXPECT_EQ(tokens[1].created, created);
  const absl::Time revoked = absl::FromUnixSeconds(1760000100);
  ASSERT_TRUE(store->RevokeToken("bob", revoked).ok());
  absl::Status again = store->RevokeToken("bob", revoked);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.message()), HasSubstr("already revoked"));
  EXPECT_EQ(store->RevokeToken("nobody", revoked).code(), absl::StatusCode::kNotFound);
  // The revoked record stays (marked), and its name is never given to another token: the jobs it
  // submitted keep their owner.
  tokens = *store->FindTokens();
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_FALSE(tokens[0].is_revoked());
  EXPECT_EQ(tokens[1].revoked, revoked);
  absl::Status reuse = store->AddToken({"bob", control::ROLE_ADMIN, "h4", created});
  EXPECT_EQ(reuse.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(reuse.message()), HasSubstr("was revoked"));
}

TEST(JobStoreTest, Open_SchemaVersion1_IsMigratedKeepingTokensAndJobs) {
  const std::string dir = StateDir();
  // A version-1 store: its tokens table has no revoked_us column.
  {
    auto store = OpenOrDie(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Insert(Job("a")).ok());
    ASSERT_TRUE(store->AddToken({"bob", control::ROLE_VIEW, "h1", absl::FromUnixSeconds(1760000000)}).ok());
  }
  RawSql(dir + "/jobs.db",
         "BEGIN; CREATE TABLE t AS SELECT name, role, hash, created_us FROM tokens; DROP TABLE tokens; "
         "CREATE TABLE tokens (name TEXT PRIMARY KEY, role INTEGER NOT NULL, hash TEXT NOT NULL, created_us INTEGER); "
         "INSERT INTO tokens SELECT * FROM t; DROP TABLE t; PRAGMA user_version = 1; COMMIT;");
  auto store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Get("a").ok());
  std::vector<TokenRecord> tokens = *store->FindTokens();
  ASSERT_EQ(tokens.size(), 1u);
  EXPECT_EQ(tokens[0].name, "bob");
  EXPECT_FALSE(tokens[0].is_revoked());
  ASSERT_TRUE(store->RevokeToken("bob", absl::Now()).ok());
  EXPECT_TRUE(store->CheckIntegrity().ok());
}

TEST(JobStoreTest, Open_Reopened_KeepsJobsAndTokens) {
  const std::string dir = StateDir();
  {
    auto store = OpenOrDie(dir);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Insert(Job("a")).ok());
    ASSERT_TRUE(store->Insert(Job("b")).ok());
    ASSERT_TRUE(store->MarkRunning("a", absl::Now(), control::Devices(), "/runs/a").ok());
    ASSERT_TRUE(store->AddToken({"bob", control::ROLE_SUBMIT, "h", absl::Now()}).ok());
  }
  auto store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_THAT(Ids(*store->List(0)), ElementsAre("b", "a"));
  EXPECT_EQ((**store->Get("a")).run_dir, "/runs/a");
  EXPECT_EQ(store->FindTokens()->size(), 1u);
  // seq keeps growing across restarts.
  absl::StatusOr<JobRecord> c = store->Insert(Job("c"));
  ASSERT_TRUE(c.ok());
  EXPECT_GT(c->seq, (**store->Get("b")).seq);
  EXPECT_TRUE(store->CheckIntegrity().ok());
}

TEST(JobStoreTest, Open_SecondStoreOnTheDir_IsFailedPrecondition) {
  const std::string dir = StateDir();
  auto first = OpenOrDie(dir);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<JobStore>> second = JobStore::Open(dir);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr(absl::StrCat("pid ", ::getpid())));
}

TEST(JobStoreTest, Open_GarbageFile_IsRefusedNamingThePath) {
  const std::string dir = StateDir();
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  std::ofstream(dir + "/jobs.db") << std::string(4096, 'x');
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()),
              HasSubstr(absl::StrCat(dir, "/jobs.db is not a stagehand job store")));
}

TEST(JobStoreTest, Open_AnotherProgramsDatabase_IsRefused) {
  const std::string dir = StateDir();
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  RawSql(dir + "/jobs.db", "CREATE TABLE recipes (name TEXT)");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("another program's SQLite database"));
}

TEST(JobStoreTest, Open_NewerSchema_IsRefused) {
  const std::string dir = StateDir();
  { ASSERT_NE(OpenOrDie(dir), nullptr); }
  RawSql(dir + "/jobs.db", "PRAGMA user_version = 99");
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("newer stagehand (schema version 99"));
}

TEST(JobStoreTest, SubmissionDigest_SameJobOtherSubmissionId_IsTheSame) {
  control::SubmitJobRequest a;
  a.set_submission_id("x");
  a.mutable_job()->set_model("allreduce");
  a.set_gpus(2);
  control::SubmitJobRequest b = a;
  b.set_submission_id("y");
  EXPECT_EQ(SubmissionDigest(a), SubmissionDigest(b));
  EXPECT_EQ(SubmissionDigest(a).size(), 64u);
  b.set_gpus(1);
  EXPECT_NE(SubmissionDigest(a), SubmissionDigest(b));
}

// The child inserts jobs and reports each committed one on the pipe; it never returns.
[[noreturn]] void InsertUntilKilled(const std::string& dir, int report_fd) {
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  if (!store.ok()) _exit(2);
  for (int32_t i = 0; i < 5000; ++i) {
    if (!(*store)->Insert(Job(absl::StrCat("j", i))).ok()) _exit(3);
    if (::write(report_fd, &i, sizeof i) != sizeof i) _exit(4);
  }
  _exit(0);
}

// Reads the child's reports until it has committed `want` jobs or `deadline` passes.
std::vector<int32_t> ReadReports(int fd, size_t want, absl::Time deadline) {
  std::vector<int32_t> done;
  while (done.size() < want) {
    const int ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (ms <= 0 || ::poll(&p, 1, ms) <= 0) break;
    int32_t i;
    if (::read(fd, &i, sizeof i) != sizeof i) break;  // EOF: the child is gone
    done.push_back(i);
  }
  return done;
}

TEST(JobStoreTest, Open_AfterSigkillMidInsert_IsIntactWithEveryReportedJob) {
  const std::string dir = StateDir();
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    InsertUntilKilled(dir, fds[1]);
  }
  ::close(fds[1]);
  // Killed while inserting: once it has committed (a loaded machine may take seconds to start it),
  // after 300 more commits or 1 s, whichever comes first.
  std::vector<int32_t> done = ReadReports(fds[0], 1, absl::Now() + absl::Seconds(10));
  const std::vector<int32_t> more = ReadReports(fds[0], 300, absl::Now() + absl::Seconds(1));
  done.insert(done.end(), more.begin(), more.end());
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child ended before the kill, status " << status;
  const std::vector<int32_t> rest = ReadReports(fds[0], SIZE_MAX, absl::Now() + absl::Seconds(1));
  done.insert(done.end(), rest.begin(), rest.end());
  ::close(fds[0]);
  ASSERT_FALSE(done.empty()) << "the child committed nothing in 10 s";
  RecordProperty("committed_before_the_kill", static_cast<int>(done.size()));

  auto store = OpenOrDie(dir);
  ASSERT_NE(store, nullptr);
  EXPECT_TRUE(store->CheckIntegrity().ok()) << store->CheckIntegrity();
  for (int32_t i : done) {
    absl::StatusOr<std::optional<JobRecord>> job = store->Get(absl::StrCat("j", i));
    ASSERT_TRUE(job.ok() && job->has_value()) << "job j" << i << " was reported committed but is missing";
  }
  // At most the one insert in flight at the kill is there unreported.
  const size_t stored = store->List(0)->size();
  EXPECT_GE(stored, done.size());
  EXPECT_LE(stored, done.size() + 1);
}

}  // namespace
}  // namespace stagehand
