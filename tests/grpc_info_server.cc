// A helper process for grpc_roundtrip_test: serves Coordinator.GetServerInfo on a loopback port that
// it picks itself, prints "PORT <n>" on stdout, and serves until stdin closes.
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "grpcpp/grpcpp.h"
#include "protos/coordinator.grpc.pb.h"

namespace {

class InfoOnlyService final : public stagehand::Coordinator::Service {
  grpc::Status GetServerInfo(grpc::ServerContext*, const stagehand::GetServerInfoRequest*,
                             stagehand::GetServerInfoResponse* response) override {
    response->set_server("grpc_info_server");
    response->set_pid(getpid());
    return grpc::Status::OK;
  }
};

}  // namespace

int main() {
  InfoOnlyService service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "could not listen on 127.0.0.1\n");
    return 1;
  }
  std::printf("PORT %d\n", port);
  std::fflush(stdout);
  char c;
  while (read(STDIN_FILENO, &c, 1) > 0) {
  }
  server->Shutdown(std::chrono::system_clock::now());  // no RPC is in flight: do not wait
  server->Wait();
  return 0;
}
