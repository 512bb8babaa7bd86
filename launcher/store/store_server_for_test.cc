// A c10d store for tests/c10d_store_test.sh: serves on 127.0.0.1 at a free port, prints the port on
// a line of its own, and runs until its stdin closes or it gets SIGTERM (then exits 0).
//   store_server_for_test [--max_value_bytes=N]
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "common/fd.h"
#include "launcher/store/c10d_store.h"

int main(int argc, char** argv) {
  stagehand::C10dStoreOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const std::string flag = "--max_value_bytes=";
    if (!absl::StartsWith(arg, flag) || !absl::SimpleAtoi(arg.substr(flag.size()), &options.limits.max_value_bytes)) {
      std::fprintf(stderr, "store_server_for_test: unknown argument '%s' (takes --max_value_bytes=N)\n", arg.c_str());
      return 2;
    }
  }
  // SIGTERM is read from a signalfd; blocked before the loop thread starts, so in it too.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  stagehand::UniqueFd signal_fd(signalfd(-1, &signals, SFD_CLOEXEC));
  stagehand::C10dStoreServer server(options);
  absl::StatusOr<int> port = server.Start("127.0.0.1", 0);
  if (!port.ok()) {
    std::fprintf(stderr, "store_server_for_test: %s\n", std::string(port.status().message()).c_str());
    return 1;
  }
  std::printf("%d\n", *port);
  std::fflush(stdout);
  for (;;) {
    pollfd fds[2] = {{STDIN_FILENO, POLLIN, 0}, {signal_fd.get(), POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) continue;
    if (fds[1].revents != 0) break;
    if (fds[0].revents != 0) {
      char buffer[256];
      if (read(STDIN_FILENO, buffer, sizeof buffer) <= 0) break;
    }
  }
  server.Stop();
  std::fprintf(stderr, "store_server_for_test: stopped\n");
  return 0;
}
