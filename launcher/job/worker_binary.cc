// The worker binary and its environment (see worker_binary.h).
#include "launcher/job/worker_binary.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/fd.h"
#include "launcher/job/run_dir.h"

extern char** environ;

namespace stagehand {
namespace {

std::vector<std::string> LauncherEnvironment() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
  return env;
}

std::string ExeDir() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string exe(buf, n);
  return exe.substr(0, exe.rfind('/'));
}

}  // namespace

// The worker sits beside the launcher in the bundle, and in ../worker/ in bazel-bin.
absl::StatusOr<std::string> FindWorker(const std::string& given) {
  std::vector<std::string> candidates;
  if (!given.empty()) {
    candidates = {UserPath(given)};
  } else {
    candidates = {ExeDir() + "/worker", ExeDir() + "/../worker/worker"};
  }
  for (const std::string& c : candidates) {
    if (access(c.c_str(), X_OK) == 0) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("no worker binary at ", candidates[0],
                                                 given.empty() ? " or beside the launcher's bazel-bin folder" : "",
                                                 "; pass --worker_binary=PATH"));
}

std::string FindProgramModuleDir() {
  std::vector<std::string> dirs = {ExeDir() + "/python", ExeDir() + "/launcher.runfiles/stagehand/python"};
  // Run by a test (or a binary) of this workspace that has //python:stagehand in its data: the
  // launcher's own runfiles tree exists only where //launcher was built by itself.
  for (const char* var : {"RUNFILES_DIR", "TEST_SRCDIR"}) {
    if (const char* root = std::getenv(var); root != nullptr && *root != '\0') {
      dirs.push_back(absl::StrCat(root, "/stagehand/python"));
    }
  }
  for (const std::string& dir : dirs) {
    if (access((dir + "/stagehand/__init__.py").c_str(), R_OK) == 0) return dir;
  }
  return "";
}

std::vector<std::string> ProgramStoreEnv(const std::string& host, int port) {
  std::vector<std::string> env = {absl::StrCat("MASTER_ADDR=", host), absl::StrCat("MASTER_PORT=", port)};
  if (const std::string module = FindProgramModuleDir(); !module.empty()) {
    const char* had = std::getenv("PYTHONPATH");
    env.push_back(absl::StrCat("PYTHONPATH=", module, had != nullptr && *had ? ":" : "", had != nullptr ? had : ""));
  }
  if (std::string gloo = GlooSocketIfnameEntry(host, LauncherEnvironment(), InterfaceToward); !gloo.empty()) {
    env.push_back(std::move(gloo));
  }
  return env;
}

std::string InterfaceToward(const std::string& host) {
  sockaddr_storage to{};
  socklen_t to_len = 0;
  auto* to4 = reinterpret_cast<sockaddr_in*>(&to);
  auto* to6 = reinterpret_cast<sockaddr_in6*>(&to);
  if (inet_pton(AF_INET, host.c_str(), &to4->sin_addr) == 1) {
    to4->sin_family = AF_INET;
    to4->sin_port = htons(9);  // connect() of a datagram socket only picks the route: nothing is sent
    to_len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &to6->sin6_addr) == 1) {
    to6->sin6_family = AF_INET6;
    to6->sin6_port = htons(9);
    to_len = sizeof(sockaddr_in6);
  } else {
    return "";
  }
  UniqueFd fd(socket(to.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  sockaddr_storage from{};
  socklen_t from_len = sizeof(from);
  if (!fd.valid() || connect(fd.get(), reinterpret_cast<sockaddr*>(&to), to_len) != 0 ||
      getsockname(fd.get(), reinterpret_cast<sockaddr*>(&from), &from_len) != 0) {
    return "";
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return "";
  std::string name;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != from.ss_family) continue;
    const bool same =
        from.ss_family == AF_INET
            ? reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr ==
                  reinterpret_cast<const sockaddr_in*>(&from)->sin_addr.s_addr
            : std::memcmp(&reinterpret_cast<const sockaddr_in6*>(i->ifa_addr)->sin6_addr,
                          &reinterpret_cast<const sockaddr_in6*>(&from)->sin6_addr, sizeof(in6_addr)) == 0;
    if (!same) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) == 0) name = i->ifa_name;
    break;
  }
  freeifaddrs(interfaces);
  return name;
}

std::string GlooSocketIfnameEntry(const std::string& store_host, const std::vector<std::string>& launcher_env,
                                  const std::function<std::string(const std::string&)>& interface_toward) {
  for (const std::string& e : launcher_env) {
    if (absl::StartsWith(e, "GLOO_SOCKET_IFNAME=")) return "";
  }
  const std::string interface = interface_toward(store_host);
  return interface.empty() ? "" : absl::StrCat("GLOO_SOCKET_IFNAME=", interface);
}

std::vector<std::string> WorkerEnvironment(int workers, int cores) {
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return WorkerEnvironmentFrom(LauncherEnvironment(), workers, cores);
}

std::vector<std::string> WorkerEnvironmentFrom(const std::vector<std::string>& launcher_env, int workers, int cores) {
  std::vector<std::string> env;
  // Like torchrun: workers share the cores instead of each spinning up a thread per core, which
  // oversubscribes the machine (OpenMP threads busy-wait) and slows every worker down.
  const bool omp_given = std::any_of(launcher_env.begin(), launcher_env.end(),
                                     [](const std::string& e) { return absl::StartsWith(e, "OMP_NUM_THREADS="); });
  if (!omp_given) env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, cores / std::max(1, workers))));
  for (const std::string& entry : launcher_env) {
    absl::string_view v(entry);
    // Set per worker by the supervisor, or forced below. The developer's kernel trace
    // (STAGEHAND_KERNEL_TRACE*, docs/profiling.md) passes through.
    if (absl::StartsWith(v, "CUDA_VISIBLE_DEVICES=") ||
        (absl::StartsWith(v, "STAGEHAND_") && !absl::StartsWith(v, "STAGEHAND_KERNEL_TRACE")) ||
        absl::StartsWith(v, "NCCL_NVLS_ENABLE=") || absl::StartsWith(v, "TORCH_SYMM_MEM_DISABLE_MULTICAST=") ||
        absl::StartsWith(v, "NVSHMEM_DISABLE_NVLS=")) {
      continue;
    }
    env.emplace_back(v);
  }
  // NVLink multicast can take shared GPUs out of service: off in every process we start.
  env.push_back("NCCL_NVLS_ENABLE=0");
  env.push_back("TORCH_SYMM_MEM_DISABLE_MULTICAST=1");
  env.push_back("NVSHMEM_DISABLE_NVLS=1");
  return env;
}

}  // namespace stagehand
