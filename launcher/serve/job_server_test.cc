// JobServer without its serve loop (Tick is never called, so nothing starts): submissions queue, and
// cancelling them ends them; what the server keeps of ended jobs is checked here. Runs of real jobs
// are tests/serve_test's.
#include "launcher/serve/job_server.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "launcher/serve/job_store.h"

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

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A state directory whose store holds job `id`, started with run directory <state>/runs/<id> (made),
// then ended in `state` (or left running: the next server marks it lost).
std::string StateWithJob(const std::string& id, control::JobState state = control::JOB_STATE_SUCCEEDED,
                         int64_t steps = 3) {
  const std::string dir = StateDir();
  absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  if (!store.ok()) return dir;
  JobRecord r;
  r.id = id;
  r.submission_id = "sub-" + id;
  r.submitted_by = "admin";
  r.spec = TinyJob("x").job();
  r.spec.set_steps(steps);
  r.devices.set_cpu_workers(1);
  r.submitted = absl::Now();
  r.spec_digest = "digest";
  const std::string run_dir = absl::StrCat(dir, "/runs/", id);
  EXPECT_EQ(mkdir((dir + "/runs").c_str(), 0700), 0);
  EXPECT_EQ(mkdir(run_dir.c_str(), 0700), 0);
  EXPECT_TRUE((*store)->Insert(r).ok());
  EXPECT_TRUE((*store)->MarkRunning(id, absl::Now(), r.devices, run_dir).ok());
  if (state != control::JOB_STATE_RUNNING) {
    EXPECT_TRUE((*store)->MarkEnded(id, state, absl::Now(), 0, "", steps).ok());
  }
  return dir;
}

// Nothing runs here (Tick is never called), but a submission's check wants an executable worker: the
// real one is another target's (LibTorch), so any executable stands in.
constexpr char kAnyExecutable[] = "/bin/true";

std::unique_ptr<JobServer> OpenServer(const std::string& dir, bool allow_commands = false) {
  JobServerOptions o;
  o.state_dir = dir;
  o.inventory.cpu_cores = 1;
  o.worker_binary = kAnyExecutable;
  o.allow_commands = allow_commands;
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<JobServer>> server = JobServer::Open(o, notes);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

const Caller kViewer{"viewer", control::ROLE_VIEW};

TEST(JobServerTest, FetchAndLogs_RefuseLinksAndFifos_InsideTheRunDirectoryToo) {
  const std::string dir = StateWithJob("j1");
  const std::string run = dir + "/runs/j1";
  WriteFile(run + "/steps.csv", "step,rank\n0,0\n");
  WriteFile(dir + "/secret", "the admin's secret\n");
  ASSERT_EQ(symlink("steps.csv", (run + "/inside").c_str()), 0);
  ASSERT_EQ(symlink((dir + "/secret").c_str(), (run + "/rank0.log").c_str()), 0);
  ASSERT_EQ(mkdir((run + "/sub").c_str(), 0700), 0);
  WriteFile(run + "/sub/f.txt", "in a subdirectory\n");
  ASSERT_EQ(symlink("sub", (run + "/linked_dir").c_str()), 0);
  ASSERT_EQ(mkfifo((run + "/pipe").c_str(), 0600), 0);
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<FileRead> ok = server->ReadFile(kViewer, "j1", "steps.csv", 0, 1 << 20);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->data, "step,rank\n0,0\n");
  absl::StatusOr<FileRead> nested = server->ReadFile(kViewer, "j1", "sub/f.txt", 0, 1 << 20);
  ASSERT_TRUE(nested.ok()) << nested.status();
  for (const char* path : {"inside", "linked_dir/f.txt", "pipe", "rank0.log"}) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<FileRead> refused = server->ReadFile(kViewer, "j1", path, 0, 1 << 20);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << path << ": " << refused.status();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << path;
  }
  absl::StatusOr<LogRead> log = server->ReadLog(kViewer, "j1", 0, 0, 1 << 20, absl::ZeroDuration());
  EXPECT_EQ(log.status().code(), absl::StatusCode::kInvalidArgument) << log.status();
  EXPECT_TRUE(!log.ok() || !absl::StrContains(log->data, "secret"));
}

// A link swapped in and out under a fetch: whatever the timing, the outside file is never read.
TEST(JobServerTest, Fetch_ALinkSwappedInDuringTheFetch_IsNeverFollowed) {
  const std::string dir = StateWithJob("j2");
  const std::string run = dir + "/runs/j2";
  WriteFile(dir + "/secret", "the admin's secret\n");
  WriteFile(run + "/plain", "plain\n");
  ASSERT_EQ(symlink((dir + "/secret").c_str(), (run + "/link").c_str()), 0);
  WriteFile(run + "/report.json", "plain\n");
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    // report.json flips between a regular file and a link out, by rename (atomic).
    for (int i = 0; !stop && i < 2000000; ++i) {
      if (i % 2 == 0) {
        (void)link((run + "/plain").c_str(), (run + "/plain2").c_str());
        (void)rename((run + "/plain2").c_str(), (run + "/report.json").c_str());
      } else {
        (void)symlink((dir + "/secret").c_str(), (run + "/link2").c_str());
        (void)rename((run + "/link2").c_str(), (run + "/report.json").c_str());
      }
    }
  });
  int leaked = 0, served = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  for (int i = 0; i < 20000 && std::chrono::steady_clock::now() < deadline; ++i) {
    absl::StatusOr<FileRead> read = server->ReadFile(kViewer, "j2", "report.json", 0, 1 << 20);
    if (read.ok()) {
      ++served;
      leaked += absl::StrContains(read->data, "secret");
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(leaked, 0) << "of " << served << " fetches served";
}

// Each of the state directory's files planted or loosened: the server refuses to open, in one line
// naming the file, and mints nothing.
TEST(JobServerTest, Open_StateFilesThatAreLinksForeignOrLoose_AreRefused) {
  struct Case {
    const char* what;
    std::function<void(const std::string& dir)> plant;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {"jobs.db a link",
       [](const std::string& d) {
         WriteFile(d + "/elsewhere.db", "");
         ASSERT_EQ(symlink((d + "/elsewhere.db").c_str(), (d + "/jobs.db").c_str()), 0);
       },
       "jobs.db is a symbolic link"},
      {"jobs.db-wal a link",
       [](const std::string& d) { ASSERT_EQ(symlink("/nonexistent", (d + "/jobs.db-wal").c_str()), 0); },
       "jobs.db-wal is a symbolic link"},
      {"jobs.lock world-writable",
       [](const std::string& d) {
         WriteFile(d + "/jobs.lock", "");
         ASSERT_EQ(chmod((d + "/jobs.lock").c_str(), 0666), 0);
       },
       "chmod go-w"},
      {"jobs.db group-writable",
       [](const std::string& d) {
         WriteFile(d + "/jobs.db", "");
         ASSERT_EQ(chmod((d + "/jobs.db").c_str(), 0660), 0);
       },
       "writable by group or others"},
      {"admin.token readable by others",
       [](const std::string& d) {
         WriteFile(d + "/admin.token", "sh_x\n");
         ASSERT_EQ(chmod((d + "/admin.token").c_str(), 0644), 0);
       },
       "chmod 600"},
      {"a token a link",
       [](const std::string& d) { ASSERT_EQ(symlink("/etc/passwd", (d + "/alice.token").c_str()), 0); },
       "alice.token is a symbolic link"},
  };
  for (const Case& c : cases) {
    const std::string dir = StateDir();
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    c.plant(dir);
    JobServerOptions o;
    o.state_dir = dir;
    o.inventory.cpu_cores = 1;
    std::vector<std::string> notes;
    absl::StatusOr<std::unique_ptr<JobServer>> server = JobServer::Open(o, notes);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << c.what << ": " << server.status();
    EXPECT_TRUE(absl::StrContains(server.status().message(), c.expect)) << c.what << ": " << server.status();
    EXPECT_EQ(std::string(server.status().message()).find('\n'), std::string::npos);
  }
  if (geteuid() == 0) {  // another user's file needs root to make
    const std::string dir = StateDir();
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
    WriteFile(dir + "/jobs.db", "");
    ASSERT_EQ(chown((dir + "/jobs.db").c_str(), 65534, 65534), 0);
    JobServerOptions o;
    o.state_dir = dir;
    std::vector<std::string> notes;
    absl::StatusOr<std::unique_ptr<JobServer>> server = JobServer::Open(o, notes);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition) << server.status();
    EXPECT_TRUE(absl::StrContains(server.status().message(), "owned by uid 65534")) << server.status();
  }
}

TEST(JobServerTest, Submit_OverTheBound_IsRefusedWithTheBound) {
  std::unique_ptr<JobServer> server = OpenServer(StateDir());
  ASSERT_NE(server, nullptr);
  control::SubmitJobRequest big = TinyJob("big");
  big.mutable_job()->mutable_pipeline()->set_schedule_text(std::string(300 * 1024, 'F'));
  absl::StatusOr<control::JobInfo> refused = server->Submit(Caller{"alice", control::ROLE_SUBMIT}, big);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "at most 256 KiB")) << refused.status();
  EXPECT_LT(refused.status().message().size(), 400u);
}

// `client submit -- sh -c ...`: a command job on one CPU worker.
control::SubmitJobRequest CommandJob(const std::string& submission, std::vector<std::string> program) {
  control::SubmitJobRequest r;
  r.set_submission_id(submission);
  r.mutable_job()->set_device("cpu");
  r.mutable_job()->set_workers(1);
  for (const std::string& word : program) r.add_program(word);
  return r;
}

// Without --allow_commands a command is refused in one line that names the flag, for every role, and
// nothing is queued; with it, the roles that may submit jobs may submit commands, resolved on this
// host (PATH, the server's directory) and shown escaped.
TEST(JobServerTest, Submit_Command_RefusedUnlessAllowed_ThenResolvedHere) {
  const std::string dir = StateDir();
  {
    std::unique_ptr<JobServer> server = OpenServer(dir);
    ASSERT_NE(server, nullptr);
    EXPECT_FALSE(server->Info().allow_commands());
    for (const Caller& caller : {Caller{"alice", control::ROLE_SUBMIT}, Caller{"admin", control::ROLE_ADMIN}}) {
      absl::StatusOr<control::JobInfo> refused = server->Submit(caller, CommandJob("c", {"sh", "-c", "true"}));
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
      EXPECT_TRUE(absl::StrContains(refused.status().message(), "--allow_commands")) << refused.status();
      EXPECT_FALSE(absl::StrContains(refused.status().message(), "\n")) << refused.status();
    }
    absl::StatusOr<control::ListJobsResponse> none = server->List(kViewer, {});
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_EQ(none->jobs_size(), 0);
  }
  std::unique_ptr<JobServer> server = OpenServer(dir, /*allow_commands=*/true);
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->Info().allow_commands());
  EXPECT_EQ(server->Submit(kViewer, CommandJob("v", {"sh"})).status().code(), absl::StatusCode::kPermissionDenied);
  absl::StatusOr<control::JobInfo> job =
      server->Submit(Caller{"alice", control::ROLE_SUBMIT}, CommandJob("c", {"sh", "-c", "echo \x1b[2J"}));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), control::JOB_STATE_QUEUED);
  ASSERT_EQ(job->spec().program_size(), 3);
  EXPECT_TRUE(job->spec().program(0) == "/bin/sh" || job->spec().program(0) == "/usr/bin/sh") << job->spec().program(0);
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof cwd), nullptr);
  EXPECT_EQ(job->spec().program_cwd(),
            std::getenv("BUILD_WORKING_DIRECTORY") ? std::getenv("BUILD_WORKING_DIRECTORY") : std::string(cwd));
  EXPECT_EQ(job->command(), absl::StrCat(job->spec().program(0), " -c echo \\x1b[2J"));
  absl::StatusOr<control::JobInfo> got = server->Get(kViewer, job->id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->command(), job->command());
  // The foreground launch's refusals hold: a program not found, --model beside it.
  absl::StatusOr<control::JobInfo> missing =
      server->Submit(Caller{"alice", control::ROLE_SUBMIT}, CommandJob("m", {"no-such-program-anywhere"}));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "no such program on PATH")) << missing.status();
  control::SubmitJobRequest with_model = CommandJob("tiny", {"sh"});
  with_model.mutable_job()->set_model("tiny");
  EXPECT_TRUE(absl::StrContains(server->Submit(Caller{"alice", control::ROLE_SUBMIT}, with_model).status().message(),
                                "drop --model"));
}

// The JobSpec's own program field (a job file's, or a client's that sets it) is refused with commands
// allowed too: a command travels only as SubmitJobRequest.program.
TEST(JobServerTest, Submit_ProgramFieldOfTheJob_RefusedEvenWithCommandsAllowed) {
  std::unique_ptr<JobServer> server = OpenServer(StateDir(), /*allow_commands=*/true);
  ASSERT_NE(server, nullptr);
  for (bool with_command : {false, true}) {
    control::SubmitJobRequest r = with_command ? CommandJob("f1", {"sh"}) : TinyJob("f0");
    r.mutable_job()->add_program("/bin/sh");
    absl::StatusOr<control::JobInfo> refused = server->Submit(Caller{"alice", control::ROLE_SUBMIT}, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "the job names a program")) << refused.status();
  }
}

// A command job queued when the server stopped: the next start runs it only with --allow_commands;
// without, it fails with one line (exit 2) and is not queued.
TEST(JobServerTest, Restart_QueuedCommandJob_RunsOnlyWhereCommandsAreAllowed) {
  const std::string dir = StateDir();
  std::string command_id, model_id;
  {
    std::unique_ptr<JobServer> server = OpenServer(dir, /*allow_commands=*/true);
    ASSERT_NE(server, nullptr);
    absl::StatusOr<control::JobInfo> command =
        server->Submit(Caller{"alice", control::ROLE_SUBMIT}, CommandJob("c", {"sh", "-c", "true"}));
    absl::StatusOr<control::JobInfo> model = server->Submit(Caller{"alice", control::ROLE_SUBMIT}, TinyJob("m"));
    ASSERT_TRUE(command.ok() && model.ok()) << command.status() << model.status();
    command_id = command->id();
    model_id = model->id();
  }
  {
    std::unique_ptr<JobServer> server = OpenServer(dir, /*allow_commands=*/true);  // allowed still: queued again
    ASSERT_NE(server, nullptr);
    absl::StatusOr<control::JobInfo> command = server->Get(kViewer, command_id);
    ASSERT_TRUE(command.ok()) << command.status();
    EXPECT_EQ(command->state(), control::JOB_STATE_QUEUED);
    EXPECT_EQ(command->queue_position(), 1);
  }
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<control::JobInfo> command = server->Get(kViewer, command_id);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->state(), control::JOB_STATE_FAILED);
  EXPECT_EQ(command->exit_code(), 2);
  EXPECT_TRUE(absl::StrContains(command->root_cause(), "--allow_commands")) << command->root_cause();
  EXPECT_FALSE(absl::StrContains(command->root_cause(), "\n")) << command->root_cause();
  absl::StatusOr<control::JobInfo> model = server->Get(kViewer, model_id);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->state(), control::JOB_STATE_QUEUED);
  EXPECT_EQ(model->queue_position(), 1);  // the failed command holds no place
}

// 40 jobs of 200 KiB each (8 MiB, twice gRPC's limit): each page stays near 1 MiB, and the pages
// together are every job once, newest first.
TEST(JobServerTest, List_LargeJobs_ComeInPagesUnderOneMiB) {
  const std::string dir = StateDir();
  {
    absl::StatusOr<std::unique_ptr<JobStore>> store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 40; ++i) {
      JobRecord r;
      r.id = absl::StrCat("j", i);
      r.submission_id = r.id;
      r.submitted_by = "admin";
      r.spec = TinyJob("x").job();
      r.spec.mutable_pipeline()->set_schedule_text(std::string(200 * 1024, 'F'));
      r.devices.set_cpu_workers(1);
      r.submitted = absl::Now();
      r.spec_digest = "d";
      ASSERT_TRUE((*store)->Insert(r).ok());
      ASSERT_TRUE((*store)->MarkEnded(r.id, control::JOB_STATE_CANCELLED, absl::Now(), 143, "", 0).ok());
    }
  }
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  std::vector<std::string> seen;
  control::ListJobsRequest request;
  request.set_page_size(1000);
  int pages = 0;
  for (; pages < 100; ++pages) {
    absl::StatusOr<control::ListJobsResponse> page = server->List(kViewer, request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->ByteSizeLong(), kMaxListReplyBytes + kMaxSubmissionBytes);
    for (const control::JobInfo& j : page->jobs()) seen.push_back(j.id());
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  EXPECT_GT(pages, 4);
  ASSERT_EQ(seen.size(), 40u);
  for (int i = 0; i < 40; ++i) EXPECT_EQ(seen[i], absl::StrCat("j", 39 - i));
  // page_size alone pages too.
  control::ListJobsRequest two;
  two.set_page_size(2);
  absl::StatusOr<control::ListJobsResponse> first = server->List(kViewer, two);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->jobs_size(), 2);
  EXPECT_FALSE(first->next_page_token().empty());
  two.set_page_token("not-a-token");
  EXPECT_EQ(server->List(kViewer, two).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobServerTest, Delete_AdminOnly_EndedOnly_KeepsTheRunDirectory) {
  const std::string dir = StateWithJob("done");
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  const Caller admin{"admin", control::ROLE_ADMIN};
  absl::StatusOr<control::JobInfo> queued = server->Submit(admin, TinyJob("q"));
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(server->Delete(admin, queued->id()).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(server->Delete(Caller{"alice", control::ROLE_SUBMIT}, "done").status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<std::string> run_dir = server->Delete(admin, "done");
  ASSERT_TRUE(run_dir.ok()) << run_dir.status();
  EXPECT_EQ(*run_dir, dir + "/runs/done");
  struct stat st;
  EXPECT_EQ(stat(run_dir->c_str(), &st), 0) << "the run directory was removed";
  EXPECT_EQ(server->Get(admin, "done").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(server->Delete(admin, "done").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<control::ListJobsResponse> list = server->List(admin, {});
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->jobs_size(), 1);
  EXPECT_EQ(list->jobs(0).id(), queued->id());
}

// A FIFO named as an input: refused at once, before anything reads it (a read would block forever).
TEST(JobServerTest, Submit_FifoAsAnInput_IsRefusedAtOnce) {
  const std::string dir = StateDir();
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(mkdir((dir + "/data").c_str(), 0700), 0);  // a job root by default
  const std::string fifo = dir + "/data/profiles.fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const char* field : {"layout_profiles", "data"}) {
    control::SubmitJobRequest r = TinyJob(absl::StrCat("fifo-", field));
    if (std::string(field) == "data") {
      r.mutable_job()->set_data(fifo);
    } else {
      r.mutable_job()->set_layout("auto");
      r.mutable_job()->set_layout_profiles(fifo);
    }
    auto result = std::make_shared<absl::StatusOr<control::JobInfo>>(absl::UnknownError("no answer"));
    auto done = std::make_shared<absl::Notification>();
    JobServer* s = server.get();
    std::thread([s, r, result, done] {
      *result = s->Submit(Caller{"alice", control::ROLE_SUBMIT}, r);
      done->Notify();
    }).detach();
    const bool answered = done->WaitForNotificationWithTimeout(absl::Seconds(10));
    if (!answered) {  // unblock the reader, so that the thread ends before the server does
      const int w = open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (w >= 0) close(w);
      done->WaitForNotificationWithTimeout(absl::Seconds(10));
    }
    ASSERT_TRUE(answered) << field << ": the submission blocked on a FIFO";
    EXPECT_EQ(result->status().code(), absl::StatusCode::kInvalidArgument) << field << ": " << result->status();
    EXPECT_TRUE(absl::StrContains(result->status().message(), "not a regular file")) << result->status();
  }
}

// Checks run on threads of their own: a slow one is answered DEADLINE_EXCEEDED at the deadline, a
// retry joins it, no more than max_validations run at once, and Shutdown answers a waiting one at once.
TEST(JobServerTest, Submit_SlowChecks_DeadlineBoundAndShutdown) {
  auto gate = std::make_shared<absl::Notification>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  JobServerOptions o;
  o.state_dir = StateDir();
  o.inventory.cpu_cores = 1;
  o.worker_binary = kAnyExecutable;
  o.max_validations = 2;
  o.validation_deadline = absl::Milliseconds(300);
  o.validate = [gate, calls](const LaunchOptions& lo, const DeviceInventory& inventory) {
    ++*calls;
    gate->WaitForNotificationWithTimeout(absl::Seconds(60));
    return ValidateLaunch(lo, inventory);
  };
  std::vector<std::string> notes;
  absl::StatusOr<std::unique_ptr<JobServer>> opened = JobServer::Open(o, notes);
  ASSERT_TRUE(opened.ok()) << opened.status();
  JobServer& server = **opened;
  const Caller alice{"alice", control::ROLE_SUBMIT};
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(server.Submit(alice, TinyJob("a")).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(server.ValidationsRunning(), 1);
  EXPECT_EQ(server.Submit(alice, TinyJob("a")).status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(calls->load(), 1) << "a retry started a second check";
  EXPECT_EQ(server.Submit(alice, TinyJob("b")).status().code(), absl::StatusCode::kDeadlineExceeded);
  absl::StatusOr<control::JobInfo> third = server.Submit(alice, TinyJob("c"));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted) << third.status();
  gate->Notify();
  for (int i = 0; i < 500 && server.ValidationsRunning() > 0; ++i) absl::SleepFor(absl::Milliseconds(20));
  ASSERT_EQ(server.ValidationsRunning(), 0);
  absl::StatusOr<control::JobInfo> now = server.Submit(alice, TinyJob("c"));
  EXPECT_TRUE(now.ok()) << now.status();

  // Shutdown while a check runs: its caller is answered at once, not at the deadline.
  auto gate2 = std::make_shared<absl::Notification>();
  JobServerOptions o2 = o;
  o2.state_dir = StateDir();
  o2.validation_deadline = absl::Seconds(60);
  o2.validate = [gate2](const LaunchOptions& lo, const DeviceInventory& inventory) {
    gate2->WaitForNotificationWithTimeout(absl::Seconds(60));
    return ValidateLaunch(lo, inventory);
  };
  absl::StatusOr<std::unique_ptr<JobServer>> second = JobServer::Open(o2, notes);
  ASSERT_TRUE(second.ok()) << second.status();
  JobServer* s2 = second->get();
  auto answer = std::make_shared<absl::StatusOr<control::JobInfo>>(absl::UnknownError("no answer"));
  auto answered = std::make_shared<absl::Notification>();
  std::thread([s2, alice, answer, answered] {
    *answer = s2->Submit(alice, TinyJob("slow"));
    answered->Notify();
  }).detach();
  absl::SleepFor(absl::Milliseconds(200));
  const auto stop = std::chrono::steady_clock::now();
  s2->Shutdown(false);
  ASSERT_TRUE(answered->WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_LT(std::chrono::steady_clock::now() - stop, std::chrono::seconds(2));
  EXPECT_EQ(answer->status().code(), absl::StatusCode::kUnavailable) << answer->status();
  EXPECT_EQ(s2->ValidationsRunning(), 1);
  gate2->Notify();
  for (int i = 0; i < 500 && s2->ValidationsRunning() > 0; ++i) absl::SleepFor(absl::Milliseconds(20));
}

// Whatever a client sends, an error echoes at most about 200 bytes of it.
TEST(JobServerTest, Errors_EchoAtMost200BytesOfInput) {
  std::unique_ptr<JobServer> server = OpenServer(StateDir());
  ASSERT_NE(server, nullptr);
  const std::string huge(1 << 20, 'x');
  const Caller admin{"admin", control::ROLE_ADMIN};
  absl::StatusOr<control::JobInfo> get = server->Get(admin, huge);
  EXPECT_EQ(get.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(get.status().message().size(), 400u);
  EXPECT_LT(server->MintToken(admin, huge, control::ROLE_VIEW).status().message().size(), 400u);
  EXPECT_LT(server->RevokeToken(admin, huge).message().size(), 400u);
  EXPECT_LT(server->Submit(admin, TinyJob(huge)).status().message().size(), 400u);
  EXPECT_LT(server->Delete(admin, huge).status().message().size(), 400u);
  control::ListJobsRequest list;
  list.set_page_token(huge);
  EXPECT_LT(server->List(admin, list).status().message().size(), 400u);
}

// A job the server died under: its steps are counted from its steps.csv (two ranks, 120 steps).
TEST(JobServerTest, LostJob_StepsDoneFromItsStepsCsv) {
  const std::string dir = StateWithJob("lost", control::JOB_STATE_RUNNING, 100000);
  std::string csv = "step,rank,loss,seconds,tokens,peak_memory_bytes\n";
  for (int step = 0; step < 120; ++step) {
    for (int rank = 0; rank < 2; ++rank) absl::StrAppend(&csv, step, ",", rank, ",1.5,0.01,64,0\n");
  }
  WriteFile(dir + "/runs/lost/steps.csv", csv);
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  absl::StatusOr<control::JobInfo> job = server->Get(kViewer, "lost");
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), control::JOB_STATE_LOST);
  EXPECT_EQ(job->steps_done(), 120);
}

// A job's paths are the server's, read as its user: only those under the job roots are taken, links
// resolved, and a refusal says nothing of the file (its size, whether it exists).
TEST(JobServerTest, Submit_PathsOutsideTheJobRoots_AreRefused) {
  const std::string dir = StateDir();
  std::unique_ptr<JobServer> server = OpenServer(dir);
  ASSERT_NE(server, nullptr);
  ASSERT_EQ(mkdir((dir + "/data").c_str(), 0700), 0);
  WriteFile(dir + "/secret.bin", std::string(4096, '\1'));
  ASSERT_EQ(symlink((dir + "/secret.bin").c_str(), (dir + "/data/linked.bin").c_str()), 0);
  const Caller alice{"alice", control::ROLE_SUBMIT};
  struct Case {
    const char* field;
    std::string path;
  };
  const std::vector<Case> cases = {
      {"data", "/etc/shadow"},
      {"data", "/etc/no-such-file"},
      {"data", dir + "/secret.bin"},
      {"data", dir + "/data/../secret.bin"},
      {"data", dir + "/data/linked.bin"},
      {"data", "relative.bin"},
      {"layout_profiles", "/etc/passwd"},
      {"init_from", "/etc"},
      {"resume", "/tmp"},
      {"export_dir", "/tmp/stagehand_export_test_never"},
  };
  int n = 0;
  for (const Case& c : cases) {
    control::SubmitJobRequest r = TinyJob(absl::StrCat("roots", n++));
    JobSpec* j = r.mutable_job();
    const std::string field = c.field;
    if (field == "data") j->set_data(c.path);
    if (field == "layout_profiles") {
      j->set_layout("auto");
      j->set_layout_profiles(c.path);
    }
    if (field == "init_from") j->set_init_from(c.path);
    if (field == "resume") j->set_resume(c.path);
    if (field == "export_dir") j->set_export_dir(c.path);
    absl::StatusOr<control::JobInfo> refused = server->Submit(alice, r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << field << " " << c.path;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "--job_roots=")) << refused.status();
    EXPECT_FALSE(absl::StrContains(refused.status().message(), "4096")) << refused.status();
  }
  // Inside a root: past the roots, to the file's own check.
  control::SubmitJobRequest inside = TinyJob("inside");
  inside.mutable_job()->set_data(dir + "/data/missing.bin");
  absl::StatusOr<control::JobInfo> missing = server->Submit(alice, inside);
  EXPECT_FALSE(absl::StrContains(missing.status().message(), "--job_roots=")) << missing.status();
}

TEST(JobServerTest, EndedJobs_OnlyTheNewestKeepTheirEvents) {
  JobServerOptions o;
  o.state_dir = StateDir();
  o.inventory.cpu_cores = 1;
  o.ended_jobs_with_events = 2;
  o.worker_binary = kAnyExecutable;
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
