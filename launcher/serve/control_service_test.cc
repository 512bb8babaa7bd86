// The control adapter over real gRPC on loopback, with the in-memory FakeJobService behind it and
// ControlClient in front: tokens, roles, watches (resumed, fifty at once), logs, fetches, and the
// listen address's rules.
#include "launcher/serve/control_service.h"

#include <sys/stat.h>
#include <dirent.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "client/control_client.h"
#include "launcher/serve/fake_job_service.h"

namespace stagehand {
namespace {

constexpr char kAdminToken[] = "admin-secret";
constexpr char kViewToken[] = "view-secret";

std::string TempDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

class ControlServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.AddToken(kAdminToken, "root", control::ROLE_ADMIN);
    fake_.AddToken(kViewToken, "viewer", control::ROLE_VIEW);
    StartServer("127.0.0.1:0");
  }
  void StartServer(const std::string& listen) {
    ControlServerOptions options;
    options.listen = listen;
    absl::StatusOr<std::unique_ptr<ControlServer>> server = ControlServer::Start(options, &fake_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::unique_ptr<ControlClient> Client(const std::string& token, int watch_retries = 0) {
    ControlClientOptions options;
    options.server = server_->address();
    options.token = token;
    options.watch_retries = watch_retries;  // a cut stream fails the test at once unless it asks for more
    options.watch_retry_window = absl::Seconds(20);
    absl::StatusOr<std::unique_ptr<ControlClient>> client = ControlClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  // A job of `lines` output lines, ended with `exit_code`.
  void AddEndedJob(const std::string& id, int lines, int exit_code) {
    fake_.AddJob(id);
    for (int i = 0; i < lines; ++i) fake_.AddLine(id, absl::StrCat("line ", i));
    fake_.EndJob(id, exit_code == 0 ? control::JOB_STATE_SUCCEEDED : control::JOB_STATE_FAILED, exit_code);
  }

  FakeJobService fake_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(ControlServiceTest, GetJob_NoToken_IsUnauthenticated) {
  fake_.AddJob("j");
  absl::StatusOr<control::JobInfo> job = Client("")->Get("j");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "--token_file")) << job.status();
}

TEST_F(ControlServiceTest, GetJob_UnknownToken_IsUnauthenticated) {
  fake_.AddJob("j");
  EXPECT_EQ(Client("wrong")->Get("j").status().code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(ControlServiceTest, GetServerInfo_NoToken_Answers) {
  absl::StatusOr<control::GetServerInfoResponse> info = Client("")->Info();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), "fake");
  EXPECT_FALSE(info->tls());
}

TEST_F(ControlServiceTest, SubmitJob_ViewToken_PermissionDeniedPassesThrough) {
  control::SubmitJobRequest request;
  request.set_submission_id("s1");
  absl::StatusOr<control::JobInfo> job = Client(kViewToken)->Submit(request);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "token viewer (ROLE_VIEW) may not submit")) << job.status();
}

TEST_F(ControlServiceTest, SubmitJob_Repeated_ReturnsTheFirstJob) {
  control::SubmitJobRequest request;
  request.set_submission_id("s1");
  request.mutable_job()->set_name("mine");
  auto client = Client(kAdminToken);
  absl::StatusOr<control::JobInfo> first = client->Submit(request);
  absl::StatusOr<control::JobInfo> second = client->Submit(request);
  ASSERT_TRUE(first.ok() && second.ok()) << first.status() << second.status();
  EXPECT_EQ(first->id(), second->id());
  EXPECT_EQ(first->name(), "mine");
}

TEST_F(ControlServiceTest, GetJob_Missing_IsNotFound) {
  EXPECT_EQ(Client(kViewToken)->Get("nope").status().code(), absl::StatusCode::kNotFound);
}

// An error that echoes a 100 KB id: the client gets the service's code and a message cut to 2 KiB,
// not gRPC's "Stream removed" for trailers over its limit.
TEST_F(ControlServiceTest, Errors_EchoingLargeInput_AreCutTo2KiB) {
  absl::StatusOr<control::JobInfo> job = Client(kViewToken)->Get(std::string(100 * 1024, 'x'));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kNotFound) << job.status().message().substr(0, 300);
  EXPECT_LE(job.status().message().size(), 2048u);
  EXPECT_NE(job.status().message().find("cut"), absl::string_view::npos) << job.status().message().substr(0, 300);
}

TEST_F(ControlServiceTest, WatchJob_EndedJob_StreamsEveryEventAndEndsWithFinalState) {
  AddEndedJob("j", 10, 3);
  std::vector<int64_t> seqs;
  int lines = 0;
  absl::StatusOr<control::JobInfo> final_state =
      Client(kViewToken)->Watch("j", false, 0, [&](const control::JobEvent& e) {
        seqs.push_back(e.seq());
        lines += e.has_line();
      });
  ASSERT_TRUE(final_state.ok()) << final_state.status();
  EXPECT_EQ(final_state->state(), control::JOB_STATE_FAILED);
  EXPECT_EQ(final_state->exit_code(), 3);
  EXPECT_EQ(lines, 10);
  ASSERT_EQ(seqs.size(), 12u);  // the first state, ten lines, the final state
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], static_cast<int64_t>(i) + 1);
}

TEST_F(ControlServiceTest, WatchJob_NoLines_SkipsLines) {
  fake_.AddJob("j");
  for (int i = 0; i < 5; ++i) fake_.AddLine("j", "x");
  fake_.AddStep("j", 1);
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  int events = 0, lines = 0;
  auto done = Client(kViewToken)->Watch("j", true, 0, [&](const control::JobEvent& e) {
    ++events;
    lines += e.has_line();
  });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(lines, 0);
  EXPECT_EQ(events, 3);  // the two states and the step
}

TEST_F(ControlServiceTest, WatchJob_RunningJob_ReceivesEventsAsTheyCome) {
  fake_.AddJob("j");
  absl::Notification first_seen;
  std::atomic<int> lines{0};
  absl::StatusOr<control::JobInfo> result;
  std::thread watcher([&] {
    result = Client(kViewToken)->Watch("j", false, 0, [&](const control::JobEvent& e) {
      if (e.seq() == 1) first_seen.Notify();
      lines += e.has_line();
    });
  });
  ASSERT_TRUE(first_seen.WaitForNotificationWithTimeout(absl::Seconds(10)));
  for (int i = 0; i < 3; ++i) fake_.AddLine("j", "x");
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  watcher.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), control::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(lines, 3);
}

TEST_F(ControlServiceTest, WatchJob_DisconnectAndResume_MissesNothing) {
  AddEndedJob("j", 20, 0);
  auto stub = control::Control::NewStub(grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
  int64_t last_seq = 0;
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", std::string("Bearer ") + kViewToken);
    control::WatchJobRequest request;
    request.set_id("j");
    auto reader = stub->WatchJob(&context, request);
    control::JobEvent event;
    while (last_seq < 7 && reader->Read(&event)) last_seq = event.seq();
    context.TryCancel();  // the client goes away mid-stream
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  ASSERT_EQ(last_seq, 7);
  std::vector<int64_t> seqs;
  auto done =
      Client(kViewToken)->Watch("j", false, last_seq, [&](const control::JobEvent& e) { seqs.push_back(e.seq()); });
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(seqs.size(), 15u);  // 8 .. 22
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(seqs[i], static_cast<int64_t>(i) + 8);
}

TEST_F(ControlServiceTest, Watch_StreamCutWithUnavailable_ClientResumesFromLastSeq) {
  AddEndedJob("j", 4, 0);
  fake_.FailNextEvents(absl::UnavailableError("cut"));
  std::vector<int64_t> seqs;
  auto done = Client(kViewToken, /*watch_retries=*/3)->Watch("j", false, 0, [&](const control::JobEvent& e) {
    seqs.push_back(e.seq());
  });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(seqs.size(), 6u);
}

TEST_F(ControlServiceTest, Watch_ServerRestarts_ClientResumesWithoutLossOrRepeat) {
  fake_.AddJob("j");
  fake_.AddLine("j", "before");
  const std::string address = server_->address();
  absl::Notification saw_line;
  std::vector<int64_t> seqs;
  absl::StatusOr<control::JobInfo> result;
  auto client = Client(kViewToken, /*watch_retries=*/20);
  std::thread watcher([&] {
    result = client->Watch("j", false, 0, [&](const control::JobEvent& e) {
      seqs.push_back(e.seq());
      if (e.seq() == 2) saw_line.Notify();
    });
  });
  ASSERT_TRUE(saw_line.WaitForNotificationWithTimeout(absl::Seconds(10)));
  server_->Stop();  // the stream ends with UNAVAILABLE "the server is shutting down; resume with ..."
  fake_.AddLine("j", "while down");
  StartServer(address);
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  watcher.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 3, 4}));
}

TEST_F(ControlServiceTest, WatchJob_FiftyWatchers_AllGetEveryEvent) {
  constexpr int kWatchers = 50, kLines = 100;
  fake_.AddJob("j");
  absl::Mutex mu;
  int started = 0;
  std::vector<int> events(kWatchers, 0);
  std::vector<absl::Status> results(kWatchers);
  std::vector<std::unique_ptr<ControlClient>> clients;
  for (int i = 0; i < kWatchers; ++i) clients.push_back(Client(kViewToken));
  std::vector<std::thread> threads;
  for (int i = 0; i < kWatchers; ++i) {
    threads.emplace_back([&, i] {
      auto done = clients[i]->Watch("j", false, 0, [&](const control::JobEvent& e) {
        absl::MutexLock lock(&mu);
        started += e.seq() == 1;
        ++events[i];
      });
      results[i] = done.status();
    });
  }
  {
    absl::MutexLock lock(&mu);
    auto all_started = [&] { return started == kWatchers; };
    // Every watcher holds an open stream at once before the job goes on.
    EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all_started), absl::Seconds(30))) << started << " started";
  }
  for (int i = 0; i < kLines; ++i) fake_.AddLine("j", absl::StrCat("line ", i));
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  for (std::thread& t : threads) t.join();  // each stream ends with the final state (retries are 0)
  for (int i = 0; i < kWatchers; ++i) {
    EXPECT_TRUE(results[i].ok()) << "watcher " << i << ": " << results[i];
    EXPECT_EQ(events[i], kLines + 2) << "watcher " << i;
  }
}

TEST_F(ControlServiceTest, Logs_Follow_ReadsUntilTheJobEnds) {
  fake_.AddJob("j");
  fake_.AppendLog("j", 1, "first\n");
  std::string got;
  absl::Notification first;
  absl::Status status;
  std::thread reader([&] {
    status = Client(kViewToken)->Logs("j", 1, 0, true, [&](absl::string_view data) {
      got.append(data.data(), data.size());
      if (!first.HasBeenNotified()) first.Notify();
    });
  });
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  fake_.AppendLog("j", 1, "second\n");
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  reader.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, "first\nsecond\n");
}

TEST_F(ControlServiceTest, Logs_FollowServerRestarts_ClientResumesAtItsOffset) {
  fake_.AddJob("j");
  fake_.AppendLog("j", 0, "first\n");
  const std::string address = server_->address();
  absl::Notification first;
  std::string got;
  absl::Status status;
  auto client = Client(kViewToken, /*watch_retries=*/20);
  std::thread reader([&] {
    status = client->Logs("j", 0, 0, true, [&](absl::string_view data) {
      got.append(data.data(), data.size());
      if (!first.HasBeenNotified()) first.Notify();
    });
  });
  ASSERT_TRUE(first.WaitForNotificationWithTimeout(absl::Seconds(10)));
  server_->Stop();
  fake_.AppendLog("j", 0, "while down\n");
  StartServer(address);
  fake_.AppendLog("j", 0, "after\n");
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  reader.join();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, "first\nwhile down\nafter\n");  // nothing lost, nothing twice
}

TEST_F(ControlServiceTest, Logs_NoFollow_ReadsWhatIsThereInChunks) {
  fake_.AddJob("j");
  const std::string log(200 * 1024 + 3, 'x');
  fake_.AppendLog("j", 0, log);
  std::string got;
  int chunks = 0;
  absl::Status status = Client(kViewToken)->Logs("j", 0, 5, false, [&](absl::string_view d) {
    got.append(d.data(), d.size());
    ++chunks;
  });
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(got, log.substr(5));
  EXPECT_EQ(chunks, 4);
}

TEST_F(ControlServiceTest, FetchFile_MultiChunk_RoundTrips) {
  std::string data;
  for (int i = 0; i < 300 * 1024 + 17; ++i) data.push_back(static_cast<char>((i * 131) % 251));
  fake_.AddJob("j");
  fake_.SetFile("j", "report.json", data);
  const std::string local = TempDir() + "/fetched.json";
  absl::StatusOr<int64_t> n = Client(kViewToken)->Fetch("j", "report.json", local);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, static_cast<int64_t>(data.size()));
  std::ifstream in(local, std::ios::binary);
  std::stringstream got;
  got << in.rdbuf();
  EXPECT_TRUE(got.str() == data);
}

TEST_F(ControlServiceTest, FetchFile_EmptyFile_WritesAnEmptyFile) {
  fake_.AddJob("j");
  fake_.SetFile("j", "empty.txt", "");
  const std::string local = TempDir() + "/empty.txt";
  absl::StatusOr<int64_t> n = Client(kViewToken)->Fetch("j", "empty.txt", local);
  ASSERT_TRUE(n.ok()) << n.status();
  struct stat st;
  ASSERT_EQ(stat(local.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST_F(ControlServiceTest, FetchFile_Missing_IsNotFoundAndLeavesNothing) {
  fake_.AddJob("j");
  const std::string dir = TempDir() + "/fetch_missing";
  mkdir(dir.c_str(), 0755);
  absl::StatusOr<int64_t> n = Client(kViewToken)->Fetch("j", "nope.csv", dir + "/nope.csv");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kNotFound);
  DIR* d = opendir(dir.c_str());
  int entries = 0;
  while (dirent* e = readdir(d)) entries += e->d_name[0] != '.';
  closedir(d);
  EXPECT_EQ(entries, 0);  // no half-written file, no temporary left behind
}

TEST_F(ControlServiceTest, FetchFile_PathOutsideRunDir_IsInvalidArgument) {
  fake_.AddJob("j");
  auto n = Client(kViewToken)->Fetch("j", "../../etc/passwd", TempDir() + "/passwd");
  EXPECT_EQ(n.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ControlServiceTest, CancelJob_SubmitTokenOfAnother_PermissionDenied) {
  fake_.AddToken("bob-secret", "bob", control::ROLE_SUBMIT);
  fake_.AddJob("j");  // alice's
  auto job = Client("bob-secret")->Cancel("j");
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(job.status().message(), "only its own jobs")) << job.status();
}

TEST_F(ControlServiceTest, MintToken_ThenUse_Works) {
  auto token = Client(kAdminToken)->Mint("carol", control::ROLE_VIEW);
  ASSERT_TRUE(token.ok()) << token.status();
  fake_.AddJob("j");
  EXPECT_TRUE(Client(*token)->Get("j").ok());
  auto tokens = Client(kAdminToken)->ListTokens();
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  EXPECT_TRUE(std::any_of(tokens->begin(), tokens->end(), [](const control::TokenInfo& t) {
    return t.name() == "carol" && t.role() == control::ROLE_VIEW;
  }));
  EXPECT_EQ(Client(kViewToken)->ListTokens().status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Client(kAdminToken)->Revoke("carol").ok());
  EXPECT_EQ(Client(*token)->Get("j").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Client(kViewToken)->Mint("dave", control::ROLE_ADMIN).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST(ControlServerTest, Start_NonLoopbackWithoutTls_IsInvalidArgument) {
  FakeJobService fake;
  for (const char* listen : {"198.18.0.1:7000", "0.0.0.0:0", "[::]:0"}) {
    ControlServerOptions options;
    options.listen = listen;
    auto server = ControlServer::Start(options, &fake);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << listen;
    EXPECT_TRUE(absl::StrContains(
        server.status().message(),
        absl::StrCat("--listen=", listen,
                     " is not a loopback address: pass --tls_cert=FILE "
                     "--tls_key=FILE (and --tls_client_ca=FILE for mutual TLS), or listen on 127.0.0.1")))
        << server.status();
  }
}

TEST(ControlServerTest, Start_Malformed_IsInvalidArgument) {
  FakeJobService fake;
  for (const char* listen : {"127.0.0.1", "127.0.0.1:99999", ":80", "[::1]7000"}) {
    ControlServerOptions options;
    options.listen = listen;
    EXPECT_EQ(ControlServer::Start(options, &fake).status().code(), absl::StatusCode::kInvalidArgument) << listen;
  }
}

TEST(ControlServerTest, Start_PortInUse_IsUnavailableNamingTheAddress) {
  FakeJobService fake;
  ControlServerOptions options;
  options.listen = "127.0.0.1:0";
  auto first = ControlServer::Start(options, &fake);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = (*first)->address();
  auto second = ControlServer::Start(options, &fake);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(second.status().message(), options.listen)) << second.status();
  EXPECT_TRUE(absl::StrContains(second.status().message(), "in use")) << second.status();
}

TEST(ControlServerTest, Start_MissingCertificate_IsInvalidArgumentNamingThePath) {
  FakeJobService fake;
  ControlServerOptions options;
  options.listen = "127.0.0.1:0";
  options.tls_cert = "/nonexistent/server.pem";
  options.tls_key = "/nonexistent/server.key";
  auto server = ControlServer::Start(options, &fake);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(server.status().message(), "--tls_cert=/nonexistent/server.pem")) << server.status();
}

}  // namespace
}  // namespace stagehand
