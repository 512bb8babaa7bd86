// The `client` binary against a control server in this process (FakeJobService behind it): verbs,
// their output and exit codes, the token and server from the environment, fetch into the user's
// directory.
#include <sys/wait.h>

#include <cstdlib>
#include <sys/stat.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "launcher/serve/control_service.h"
#include "launcher/serve/fake_job_service.h"
#include "tests/test_util.h"

namespace stagehand {
namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

std::string Tmp() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

struct Result {
  int code = -1;
  std::string out, err;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fake_.AddToken("admin-t", "root", control::ROLE_ADMIN);
    std::ofstream(Tmp() + "/token") << "  admin-t\n";
    chmod((Tmp() + "/token").c_str(), 0600);  // a token file others can read draws a warning line
    ControlServerOptions options;
    options.listen = "127.0.0.1:0";
    auto server = ControlServer::Start(options, &fake_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  // Runs the client with `args` (a shell word list), the server and token from the environment.
  // `timeout` bounds it, so a client that hangs fails the test instead of stalling it.
  Result Client(const std::string& args) {
    const std::string out = Tmp() + "/client.out", err = Tmp() + "/client.err";
    const std::string command =
        absl::StrCat("cd ", Tmp(), " && STAGEHAND_SERVER=", server_->address(), " STAGEHAND_TOKEN_FILE=", Tmp(),
                     "/token BUILD_WORKING_DIRECTORY=", Tmp(), " timeout 30 ", Runfile("client/client"), " ", args,
                     " >", out, " 2>", err);
    const int status = std::system(command.c_str());
    return Result{WIFEXITED(status) ? WEXITSTATUS(status) : -1, ReadFile(out), ReadFile(err)};
  }

  FakeJobService fake_;
  std::unique_ptr<ControlServer> server_;
};

TEST_F(ClientTest, Submit_JobFlags_PrintsTheIdLastAndSendsTheMergedSpec) {
  std::ofstream(Tmp() + "/job.textproto") << "name: \"mine\" steps: 3\n";
  Result r = Client("submit --job=job.textproto --steps=9 --gpus=2");
  EXPECT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines = absl::StrSplit(r.out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines.back(), "job1");
  control::SubmitJobRequest sent = fake_.last_submit();
  EXPECT_EQ(sent.job().name(), "mine");
  EXPECT_EQ(sent.job().steps(), 9);
  EXPECT_EQ(sent.gpus(), 2);
  EXPECT_TRUE(absl::StartsWith(sent.submission_id(), "sub-"));
}

// A command job: PROGRAM ARGS travel as given (the server resolves them), beside the job flags; status
// and list show the command.
TEST_F(ClientTest, Submit_Command_SendsTheWordsAfterDashDash) {
  Result r = Client("submit --device=cpu --workers=2 -- python3 train.py --epochs 3");
  EXPECT_EQ(r.code, 0) << r.err;
  control::SubmitJobRequest sent = fake_.last_submit();
  EXPECT_EQ(std::vector<std::string>(sent.program().begin(), sent.program().end()),
            (std::vector<std::string>{"python3", "train.py", "--epochs", "3"}));
  EXPECT_EQ(sent.job().workers(), 2);
  EXPECT_EQ(sent.job().program_size(), 0);  // never the JobSpec's own field, which servers refuse
  Result status = Client("status job1");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, "  command: python3 train.py --epochs 3\n")) << status.out;
  Result list = Client("list");
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_TRUE(absl::StrContains(list.out, "python3 train.py --epochs 3")) << list.out;
  // A job of stagehand's worker carries none.
  ASSERT_EQ(Client("submit --device=cpu --workers=2").code, 0);
  EXPECT_EQ(fake_.last_submit().program_size(), 0);
}

// A server of control protocol 1 would drop the command and run the job without it: refused first.
TEST_F(ClientTest, Submit_CommandToAProtocol1Server_RefusedBeforeSending) {
  fake_.SetProtocol(1);
  Result r = Client("submit --device=cpu -- python3 train.py");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "control protocol 1")) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(fake_.submit_calls(), 0);
}

TEST_F(ClientTest, Watch_FailedJob_PrintsLinesAndStatesAndExitsWithItsCode) {
  fake_.AddJob("j");
  fake_.AddLine("j", "hello from rank 0");
  fake_.EndJob("j", control::JOB_STATE_FAILED, 3);
  Result r = Client("watch j");
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_EQ(r.out, "job j: running\nhello from rank 0\njob j: failed (exit code 3)\n");
}

TEST_F(ClientTest, Watch_NoLines_PrintsStates) {
  fake_.AddJob("j");
  fake_.AddLine("j", "hidden");
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  Result r = Client("watch --no_lines j");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_FALSE(absl::StrContains(r.out, "hidden"));
  EXPECT_TRUE(absl::StrContains(r.out, "job j: succeeded (exit code 0)")) << r.out;
}

TEST_F(ClientTest, LostJob_ShowsNoExitCode) {
  fake_.AddJob("j");
  fake_.EndJob("j", control::JOB_STATE_LOST, 0);
  Result watch = Client("watch j");
  EXPECT_EQ(watch.code, 1) << watch.err;
  EXPECT_TRUE(absl::StrContains(watch.out, "job j: lost\n")) << watch.out;
  EXPECT_FALSE(absl::StrContains(watch.out, "exit code")) << watch.out;
  Result status = Client("status j");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_FALSE(absl::StrContains(status.out, "exit code:")) << status.out;
  EXPECT_TRUE(absl::StrContains(status.out, "no exit code (lost)")) << status.out;
}

TEST_F(ClientTest, Cancel_RunningJob_PrintsCancelled) {
  fake_.AddJob("j");
  Result r = Client("cancel j");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "cancelled\n");
}

TEST_F(ClientTest, Fetch_RelativeOutput_LandsInTheUserDirectory) {
  fake_.AddJob("j");
  fake_.SetFile("j", "sub/steps.csv", "a,b\n1,2\n");
  Result r = Client("fetch j sub/steps.csv");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(ReadFile(Tmp() + "/steps.csv"), "a,b\n1,2\n");
}

TEST_F(ClientTest, Fetch_OutputDash_WritesToStdout) {
  fake_.AddJob("j");
  fake_.SetFile("j", "report.json", "{\"steps\": 3}\n");
  Result r = Client("fetch j report.json --output=-");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "{\"steps\": 3}\n");
  struct stat st;
  EXPECT_NE(stat((Tmp() + "/-").c_str(), &st), 0) << "a file named - was written";
}

TEST_F(ClientTest, Logs_Launcher_ShowsTheLaunchersOwnLines) {
  fake_.AddJob("j");
  fake_.AppendLog("j", 0, "rank 0 says\n");
  fake_.AppendLog("j", -1, "stagehand: job j: 2 cpu workers\n");
  Result rank = Client("logs j");
  EXPECT_EQ(rank.code, 0) << rank.err;
  EXPECT_EQ(rank.out, "rank 0 says\n");
  Result launcher = Client("logs j --launcher");
  EXPECT_EQ(launcher.code, 0) << launcher.err;
  EXPECT_EQ(launcher.out, "stagehand: job j: 2 cpu workers\n");
}

TEST_F(ClientTest, ListAndStatus_ShowTheJob) {
  fake_.AddJob("j");
  Result list = Client("list");
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_TRUE(absl::StrContains(list.out, "SUBMITTED BY")) << list.out;
  EXPECT_TRUE(absl::StrContains(list.out, "running")) << list.out;
  Result status = Client("status j");
  EXPECT_EQ(status.code, 0) << status.err;
  EXPECT_TRUE(absl::StrContains(status.out, "job j (j): running")) << status.out;
}

TEST_F(ClientTest, List_ManyPages_ShowsEveryJob) {
  fake_.SetPageSize(2);
  for (const char* id : {"a1", "a2", "a3", "a4", "a5"}) fake_.AddJob(id);
  Result list = Client("list");
  EXPECT_EQ(list.code, 0) << list.err;
  for (const char* id : {"a1", "a2", "a3", "a4", "a5"}) EXPECT_TRUE(absl::StrContains(list.out, id)) << id << list.out;
  Result limited = Client("list --limit=3");
  EXPECT_EQ(limited.code, 0) << limited.err;
  EXPECT_TRUE(absl::StrContains(limited.out, "a3")) << limited.out;
  EXPECT_FALSE(absl::StrContains(limited.out, "a4")) << limited.out;
}

TEST_F(ClientTest, Delete_EndedJob_SaysTheRunDirectoryStays) {
  fake_.AddJob("j");
  Result running = Client("delete j");
  EXPECT_EQ(running.code, 1);
  fake_.EndJob("j", control::JOB_STATE_SUCCEEDED, 0);
  Result r = Client("delete j");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(absl::StrContains(r.out, "deleted job j; its run directory stays on the server: /runs/j")) << r.out;
  EXPECT_EQ(Client("status j").code, 1);
}

TEST_F(ClientTest, Submit_OverTheBound_RefusedBeforeSending) {
  std::ofstream(Tmp() + "/big.txt") << std::string(300 * 1024, 'F');
  Result r = Client("submit --schedule_file=big.txt");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, "at most 256 KiB")) << r.err;
  EXPECT_EQ(fake_.submit_calls(), 0);
}

TEST_F(ClientTest, TokenMint_PrintsTheToken) {
  Result r = Client("token mint carol --role=view");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "tok-carol\n");
  EXPECT_EQ(Client("token mint dave --role=boss").code, 2);
}

TEST_F(ClientTest, TokenMint_Output_WritesAPrivateFileAndNeverOverwrites) {
  const std::string path = Tmp() + "/erin.token";
  unlink(path.c_str());
  Result r = Client("token mint erin --role=view --output=erin.token");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(ReadFile(path), "tok-erin\n");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result again = Client("token mint frank --role=view --output=erin.token");
  EXPECT_EQ(again.code, 2) << again.err;
  EXPECT_TRUE(absl::StrContains(again.err, "exists")) << again.err;
  EXPECT_EQ(ReadFile(path), "tok-erin\n");
}

TEST_F(ClientTest, Errors_OneLineEach_WithTheirExitCodes) {
  Result unknown = Client("frobnicate");
  EXPECT_EQ(unknown.code, 2);
  EXPECT_TRUE(absl::StrContains(unknown.err, "unknown verb 'frobnicate'")) << unknown.err;
  EXPECT_EQ(Client("watch").code, 2);
  EXPECT_EQ(Client("--bogus list").code, 2);
  // A command goes after --, and -- needs one.
  Result stray = Client("submit --device=cpu python3 train.py");
  EXPECT_EQ(stray.code, 2) << stray.err;
  EXPECT_TRUE(absl::StrContains(stray.err, "a command goes after --")) << stray.err;
  EXPECT_EQ(std::count(stray.err.begin(), stray.err.end(), '\n'), 1) << stray.err;
  Result empty = Client("submit --device=cpu --");
  EXPECT_EQ(empty.code, 2) << empty.err;
  EXPECT_TRUE(absl::StrContains(empty.err, "-- with no program after it")) << empty.err;
  EXPECT_EQ(fake_.submit_calls(), 0);
  Result missing = Client("status nope");
  EXPECT_EQ(missing.code, 1);
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1) << missing.err;
  Result bad_token = Client("--token_file=/nonexistent list");
  EXPECT_EQ(bad_token.code, 2);
  EXPECT_TRUE(absl::StrContains(bad_token.err, "--token_file=/nonexistent")) << bad_token.err;
}

TEST_F(ClientTest, Errors_EchoingLargeInput_StayShort) {
  Result r = Client(absl::StrCat("status ", std::string(100 * 1024, 'y')));
  EXPECT_EQ(r.code, 1) << r.err.substr(0, 300);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
  EXPECT_LT(r.err.size(), 2200u);
  EXPECT_FALSE(absl::StrContains(r.err, "Stream removed")) << r.err.substr(0, 300);
  Result verb = Client(std::string(100 * 1024, 'v'));
  EXPECT_EQ(verb.code, 2);
  EXPECT_LT(verb.err.size(), 600u);
}

// A TLS server whose certificate another CA signed: the client says so in one line of its own, with
// none of gRPC's log lines before it (unless GRPC_VERBOSITY asks for them).
TEST_F(ClientTest, WrongCa_OneLineWithoutGrpcsOwnLog) {
  const std::string dir = Tmp() + "/wrong_ca";
  const std::string sh = absl::StrCat(
      "mkdir -p ", dir, " && cd ", dir,
      " && (openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem "
      "-subj /CN=ca -days 2 && openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.pem "
      "-subj /CN=other -days 2 && printf 'subjectAltName=IP:127.0.0.1\\n' >server.ext && openssl req -newkey "
      "rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=server && openssl x509 -req -in server.csr "
      "-CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext) >openssl.log 2>&1");
  ASSERT_EQ(std::system(sh.c_str()), 0) << ReadFile(dir + "/openssl.log");
  ControlServerOptions options;
  options.listen = "127.0.0.1:0";
  options.tls_cert = dir + "/server.pem";
  options.tls_key = dir + "/server.key";
  auto tls = ControlServer::Start(options, &fake_);
  ASSERT_TRUE(tls.ok()) << tls.status();
  const std::string args = absl::StrCat("--server=", (*tls)->address(), " --tls_ca=", dir, "/other.pem list");
  Result r = Client(args);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(absl::StrContains(r.err, "ssl_transport_security")) << r.err;
  EXPECT_TRUE(absl::StartsWith(r.err, "client: ")) << r.err;
}

TEST_F(ClientTest, Help_ListsVerbsAndExitCodes) {
  Result r = Client("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(absl::StrContains(r.out, "Exit codes:"));
  EXPECT_TRUE(absl::StrContains(r.out, "--token_file"));
  EXPECT_TRUE(absl::StrContains(r.out, "--steps"));  // the job flags too
  // By topic, the client's own first; every flag in one.
  EXPECT_LT(r.out.find("\n\nThe client"), r.out.find("\n  --token_file (")) << r.out;
  EXPECT_LT(r.out.find("\n  --token_file ("), r.out.find("\n\nThe job:")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "Other flags:")) << r.out;
  EXPECT_FALSE(absl::StrContains(r.out, "Several hosts:")) << r.out;
}

}  // namespace
}  // namespace stagehand
