// A gRPC round trip between two processes over loopback: the server runs in a child process and
// answers with its own pid, which must be the child's.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "protos/coordinator.grpc.pb.h"

namespace {

std::string ServerPath() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return std::string(srcdir ? srcdir : ".") + "/" + (ws ? ws : "stagehand") + "/tests/grpc_info_server";
}

TEST(GrpcRoundTrip, GetServerInfo_ServerInChildProcess_AnswersWithChildPid) {
  int to_child[2], from_child[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(from_child), 0);
  const std::string path = ServerPath();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    dup2(to_child[0], STDIN_FILENO);
    dup2(from_child[1], STDOUT_FILENO);
    close(to_child[1]);
    close(from_child[0]);
    execl(path.c_str(), path.c_str(), nullptr);
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  FILE* out = fdopen(from_child[0], "r");
  int port = 0;
  ASSERT_EQ(std::fscanf(out, "PORT %d", &port), 1) << "server did not report its port: " << path;

  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto stub = stagehand::Coordinator::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  stagehand::GetServerInfoResponse response;
  grpc::Status status = stub->GetServerInfo(&ctx, stagehand::GetServerInfoRequest(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.server(), "grpc_info_server");
  EXPECT_EQ(response.pid(), pid);
  EXPECT_NE(response.pid(), getpid());

  close(to_child[1]);  // the server exits when its stdin closes
  int wstatus = 0;
  ASSERT_EQ(waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0);
  fclose(out);
}

}  // namespace
