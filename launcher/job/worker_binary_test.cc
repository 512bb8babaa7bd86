// Unit tests of the workers' environment (worker_binary.h): NCCL's network settings pass through to
// every worker, the variables the supervisor sets per worker do not, NVLink multicast is forced off,
// and OpenMP's threads are shared out unless the launcher's environment says; the `stagehand`
// module is found in the runfiles of what runs the launcher; a program's ranks on several hosts get
// Gloo's interface toward the store unless the launcher's environment names one.
#include "launcher/job/worker_binary.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stagehand {
namespace {

using ::testing::Contains;
using ::testing::Not;

TEST(WorkerEnvironmentFromTest, NcclSocketAndIbSettings_PassThroughUnchanged) {
  const std::vector<std::string> settings = {"NCCL_SOCKET_IFNAME=eth1,^docker",
                                             "NCCL_SOCKET_FAMILY=AF_INET",
                                             "NCCL_IB_HCA=mlx5_0:1,mlx5_1:1",
                                             "NCCL_IB_DISABLE=1",
                                             "NCCL_DEBUG=INFO",
                                             "NCCL_DEBUG_SUBSYS=INIT,NET",
                                             "NCCL_NET_GDR_LEVEL=PHB",
                                             "NCCL_CROSS_NIC=0"};
  std::vector<std::string> launcher_env = settings;
  launcher_env.push_back("PATH=/usr/bin");
  const std::vector<std::string> env = WorkerEnvironmentFrom(launcher_env, 2, 8);
  for (const std::string& s : settings) EXPECT_THAT(env, Contains(s));
  EXPECT_THAT(env, Contains("PATH=/usr/bin"));
}

TEST(WorkerEnvironmentFromTest, PerWorkerAndForcedVariables_AreNotTakenFromTheLauncher) {
  const std::vector<std::string> env =
      WorkerEnvironmentFrom({"CUDA_VISIBLE_DEVICES=0,1", "STAGEHAND_WORKER_INDEX=3", "STAGEHAND_SECRET_FD=9",
                             "NCCL_NVLS_ENABLE=1", "TORCH_SYMM_MEM_DISABLE_MULTICAST=0", "NVSHMEM_DISABLE_NVLS=0"},
                            2, 8);
  EXPECT_THAT(env, Not(Contains("CUDA_VISIBLE_DEVICES=0,1")));
  EXPECT_THAT(env, Not(Contains("STAGEHAND_WORKER_INDEX=3")));
  EXPECT_THAT(env, Not(Contains("STAGEHAND_SECRET_FD=9")));
  EXPECT_THAT(env, Not(Contains("NCCL_NVLS_ENABLE=1")));
  EXPECT_THAT(env, Contains("NCCL_NVLS_ENABLE=0"));
  EXPECT_THAT(env, Contains("TORCH_SYMM_MEM_DISABLE_MULTICAST=1"));
  EXPECT_THAT(env, Contains("NVSHMEM_DISABLE_NVLS=1"));
}

TEST(WorkerEnvironmentFromTest, KernelTraceVariables_PassThrough) {
  const std::vector<std::string> env =
      WorkerEnvironmentFrom({"STAGEHAND_KERNEL_TRACE=/tmp/t", "STAGEHAND_KERNEL_TRACE_STEP=3"}, 1, 8);
  EXPECT_THAT(env, Contains("STAGEHAND_KERNEL_TRACE=/tmp/t"));
  EXPECT_THAT(env, Contains("STAGEHAND_KERNEL_TRACE_STEP=3"));
}

TEST(WorkerEnvironmentFromTest, OmpThreads_SharedOutAmongWorkers_UnlessGiven) {
  EXPECT_THAT(WorkerEnvironmentFrom({}, 4, 16), Contains("OMP_NUM_THREADS=4"));
  EXPECT_THAT(WorkerEnvironmentFrom({}, 8, 2), Contains("OMP_NUM_THREADS=1"));
  const std::vector<std::string> given = WorkerEnvironmentFrom({"OMP_NUM_THREADS=3"}, 4, 16);
  EXPECT_THAT(given, Contains("OMP_NUM_THREADS=3"));
  EXPECT_THAT(given, Not(Contains("OMP_NUM_THREADS=4")));
}

// A test that runs the launcher (its runfiles at $RUNFILES_DIR) holds the module where the
// launcher's own runfiles tree does not exist.
TEST(FindProgramModuleDirTest, InTheRunfilesOfWhatRunsTheLauncher) {
  const std::string root = absl::StrCat(::testing::TempDir(), "/module_runfiles_", getpid());
  for (const char* dir : {"", "/stagehand", "/stagehand/python", "/stagehand/python/stagehand"}) {
    ASSERT_TRUE(mkdir(absl::StrCat(root, dir).c_str(), 0755) == 0 || errno == EEXIST) << dir;
  }
  const std::string init = root + "/stagehand/python/stagehand/__init__.py";
  std::ofstream(init) << "\n";
  const char* had = std::getenv("RUNFILES_DIR");
  const std::string saved = had != nullptr ? had : "";
  setenv("RUNFILES_DIR", root.c_str(), 1);
  EXPECT_EQ(FindProgramModuleDir(), root + "/stagehand/python");
  if (had != nullptr)
    setenv("RUNFILES_DIR", saved.c_str(), 1);
  else
    unsetenv("RUNFILES_DIR");
  std::remove(init.c_str());
  for (const char* dir : {"/stagehand/python/stagehand", "/stagehand/python", "/stagehand", ""}) {
    rmdir(absl::StrCat(root, dir).c_str());
  }
}

TEST(GlooSocketIfnameEntryTest, StoreOnANetworkAddress_NamesTheInterfaceTowardIt) {
  std::string asked;
  auto toward = [&asked](const std::string& host) {
    asked = host;
    return std::string("eth0");
  };
  EXPECT_EQ(GlooSocketIfnameEntry("198.18.0.11", {"PATH=/bin"}, toward), "GLOO_SOCKET_IFNAME=eth0");
  EXPECT_EQ(asked, "198.18.0.11");
}

TEST(GlooSocketIfnameEntryTest, LaunchersOwnSetting_PassesThroughInstead) {
  auto toward = [](const std::string&) { return std::string("eth0"); };
  EXPECT_EQ(GlooSocketIfnameEntry("198.18.0.11", {"GLOO_SOCKET_IFNAME=ib0"}, toward), "");
}

TEST(GlooSocketIfnameEntryTest, NoInterface_NothingAdded) {
  auto toward = [](const std::string&) { return std::string(); };
  EXPECT_EQ(GlooSocketIfnameEntry("127.0.0.1", {}, toward), "");
}

TEST(InterfaceTowardTest, LoopbackOrNoAddressLiteral_None) {
  EXPECT_EQ(InterfaceToward("127.0.0.1"), "");
  EXPECT_EQ(InterfaceToward("::1"), "");
  EXPECT_EQ(InterfaceToward("localhost"), "");  // no name is looked up
  EXPECT_EQ(InterfaceToward(""), "");
}

// Toward an address of this host's own interfaces, the interface that holds it (node 0: the store is
// on its own address). Skipped where the test sees no interface but loopback (a sandbox without a network).
TEST(InterfaceTowardTest, OwnAddress_ItsInterface) {
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  std::string name, address;
  for (const ifaddrs* i = interfaces; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) != 0 ||
        (i->ifa_flags & IFF_UP) == 0) {
      continue;
    }
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    name = i->ifa_name;
    address = text;
  }
  freeifaddrs(interfaces);
  if (name.empty()) GTEST_SKIP() << "no IPv4 interface but loopback";
  EXPECT_EQ(InterfaceToward(address), name) << address;
}

}  // namespace
}  // namespace stagehand
