// One job across two launchers on this machine (launcher --nodes=2 on loopback, node 1 an agent): the
// losses and final parameters of a 2-stage pipeline split over the two nodes match a single process
// (fp32, 1e-5 relative, as tests/pipeline_test.cc compares them); an agent killed with SIGKILL ends
// the job within 5 s naming its node; the refusals before anything starts (a non-loopback address
// without TLS, several nodes on loopback without a job token file, job flags given to an agent).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <torch/torch.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp ? tmp : "/tmp";
}

std::string Unique(const std::string& name) {
  static int counter = 0;
  return absl::StrCat(TmpDir(), "/", name, "_", getpid(), "_", counter++);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A launcher started in the background: its output in `out`, its exit code in `rc` once it ends.
struct Background {
  std::string out, rc, pid_file;
  int pid() const {
    int p = 0;
    (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(pid_file)), &p);
    return p;
  }
  // The exit code, or -1 if it did not end within `timeout`.
  int Wait(absl::Duration timeout) const {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      int code = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(rc)), &code)) return code;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return -1;
  }
  std::string Output() const { return ReadFile(out); }
};

// `command` (a line of sh) in the background, from a script file; the pid written is the script's,
// which `exec` in the command makes the launcher's own, for the kill tests.
Background StartShell(const std::string& command) {
  Background b;
  const std::string base = Unique("launcher");
  b.out = base + ".out";
  b.rc = base + ".rc";
  b.pid_file = base + ".pid";
  std::ofstream(base + ".sh") << "echo $$ > " << b.pid_file << "\n" << command << "\n";
  const std::string script = absl::StrCat("(sh ", base, ".sh > ", b.out, " 2>&1; echo $? > ", b.rc, ") &");
  EXPECT_EQ(std::system(script.c_str()), 0);
  for (int i = 0; i < 100 && b.pid() == 0; ++i) absl::SleepFor(absl::Milliseconds(20));
  return b;
}

Background Start(const std::vector<std::string>& flags) {
  std::string cmd = Runfile("launcher/launcher");
  for (const std::string& f : flags) absl::StrAppend(&cmd, " ", f);
  return StartShell("exec " + cmd);
}

int RunLauncher(const std::vector<std::string>& flags, std::string* output) {
  Background b = Start(flags);
  const int code = b.Wait(absl::Seconds(120));
  *output = b.Output();
  return code;
}

std::string TokenFile() {
  const std::string path = Unique("token");
  std::ofstream(path) << "0123456789abcdef0123456789abcdef0123456789abcdef\n";
  chmod(path.c_str(), 0600);
  return path;
}

std::vector<std::string> TinyJob(int workers, int stages, const std::string& model) {
  return {"--device=cpu",
          absl::StrCat("--workers=", workers),
          absl::StrCat("--pipeline_stages=", stages),
          "--model=" + model,
          "--fp32",
          "--schedule=1f1b",
          "--micro_batches=4",
          "--global_batch=16",
          "--steps=3",
          "--lr=0.003",
          "--partition=uniform",
          "--save_params",
          "--seed=7"};
}

std::map<int, double> Losses(const std::string& run_dir) {
  std::map<int, double> out;
  std::vector<std::string> lines = absl::StrSplit(ReadFile(run_dir + "/steps.csv"), '\n', absl::SkipEmpty());
  for (size_t i = 1; i < lines.size(); ++i) {
    std::vector<std::string> f = absl::StrSplit(lines[i], ',');
    double loss;
    int step;
    if (f.size() > 2 && !f[2].empty() && absl::SimpleAtoi(f[0], &step) && absl::SimpleAtod(f[2], &loss))
      out[step] = loss;
  }
  return out;
}

std::vector<torch::Tensor> Params(const std::vector<std::string>& files) {
  std::vector<torch::Tensor> all;
  for (const std::string& f : files) {
    std::vector<torch::Tensor> part;
    torch::load(part, f);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

class TwoNodes : public ::testing::TestWithParam<std::string> {};

TEST_P(TwoNodes, LossesAndParametersMatchASingleProcess) {
  setenv("OMP_NUM_THREADS", "1", 1);  // the same reduction order in every process (pipeline_test.cc)
  const std::string model = GetParam();
  const std::string ref_dir = Unique("ref"), n0_dir = Unique("node0"), n1_dir = Unique("node1");
  std::string out;
  std::vector<std::string> ref = TinyJob(1, 1, model);
  ref.push_back("--run_dir=" + ref_dir);
  ASSERT_EQ(RunLauncher(ref, &out), 0) << out;

  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string token = TokenFile();
  std::vector<std::string> node0 = TinyJob(1, 2, model);
  for (const std::string& f : std::vector<std::string>{"--nodes=2", "--node_rank=0", "--coordinator_address=" + address,
                                                       "--job_token_file=" + token, "--run_dir=" + n0_dir}) {
    node0.push_back(f);
  }
  Background b0 = Start(node0);
  std::string agent_out;
  const int agent = RunLauncher({"--nodes=2", "--node_rank=1", "--coordinator_address=" + address,
                                 "--job_token_file=" + token, "--device=cpu", "--workers=1", "--run_dir=" + n1_dir},
                                &agent_out);
  ASSERT_EQ(b0.Wait(absl::Seconds(60)), 0) << b0.Output() << "\n--- node 1\n" << agent_out;
  ASSERT_EQ(agent, 0) << agent_out;
  EXPECT_TRUE(absl::StrContains(b0.Output(), "rank 0 on node 0 (127.0.0.1), rank 1 on node 1 (127.0.0.1)"))
      << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "no link crosses hosts") ||
              absl::StrContains(b0.Output(), "links across hosts: stage 0 -> 1 (node 0 -> 1)"))
      << b0.Output();

  std::map<int, double> want = Losses(ref_dir), got = Losses(n0_dir);
  ASSERT_EQ(want.size(), 3u) << ReadFile(ref_dir + "/steps.csv");
  ASSERT_EQ(got.size(), want.size()) << ReadFile(n0_dir + "/steps.csv");
  for (const auto& [step, loss] : want) EXPECT_NEAR(got[step], loss, 1e-5 * std::abs(loss)) << "step " << step;
  std::vector<torch::Tensor> a = Params({ref_dir + "/params_rank0.pt"});
  std::vector<torch::Tensor> b = Params({n0_dir + "/params_rank0.pt", n1_dir + "/params_rank1.pt"});
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << "parameter " << i;
    const double err = (a[i] - b[i]).abs().max().item<double>() / std::max(1e-12, a[i].abs().max().item<double>());
    EXPECT_LT(err, 1e-5) << "parameter " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TwoNodes, ::testing::Values("tiny", "llama-tiny"), [](const auto& info) {
  std::string m = info.param;
  for (char& c : m) c = c == '-' ? '_' : c;
  return m;
});

TEST(TwoNodes, AgentKilled_EndsTheJobWithin5sNamingItsNode) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string token = TokenFile();
  std::vector<std::string> node0 = TinyJob(1, 2, "tiny");
  node0[8] = "--steps=100000";  // TinyJob index 8 is --steps  // runs until the agent dies
  for (const std::string& f : std::vector<std::string>{"--nodes=2", "--node_rank=0", "--coordinator_address=" + address,
                                                       "--job_token_file=" + token, "--run_dir=" + Unique("kill0")}) {
    node0.push_back(f);
  }
  Background b0 = Start(node0);
  Background b1 = Start({"--nodes=2", "--node_rank=1", "--coordinator_address=" + address, "--job_token_file=" + token,
                         "--device=cpu", "--workers=1", "--run_dir=" + Unique("kill1")});
  for (int i = 0; i < 600 && !absl::StrContains(b0.Output(), "step 3/"); ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(absl::StrContains(b0.Output(), "step 3/")) << b0.Output() << "\n--- node 1\n" << b1.Output();
  ASSERT_EQ(kill(b1.pid(), SIGKILL), 0);
  const absl::Time killed = absl::Now();
  const int code = b0.Wait(absl::Seconds(30));
  const absl::Duration took = absl::Now() - killed;
  EXPECT_NE(code, 0) << b0.Output();
  EXPECT_LT(took, absl::Seconds(5)) << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "FAILED")) << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "node 1 at 127.0.0.1")) << b0.Output();
}

// Node 0's and node 1's flags for a two-node tiny job (1 worker each, 2 stages) over loopback.
struct TwoNodeJob {
  std::vector<std::string> node0, node1;
};

TwoNodeJob TwoNodeFlags(const std::vector<std::string>& extra, const std::string& n0_dir, const std::string& n1_dir) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string token = TokenFile();
  TwoNodeJob j;
  j.node0 = TinyJob(1, 2, "tiny");
  for (const std::string& f : extra) j.node0.push_back(f);
  for (const std::string& f : std::vector<std::string>{"--nodes=2", "--node_rank=0", "--coordinator_address=" + address,
                                                       "--job_token_file=" + token, "--run_dir=" + n0_dir}) {
    j.node0.push_back(f);
  }
  j.node1 = {"--nodes=2",
             "--node_rank=1",
             "--coordinator_address=" + address,
             "--job_token_file=" + token,
             "--device=cpu",
             "--workers=1",
             "--run_dir=" + n1_dir};
  return j;
}

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// A job on two hosts (two launchers on this machine: one file system, as a shared one would be)
// writes its checkpoints whole into node 0's run directory (every rank's shard under one manifest)
// and its export whole; node 1's run directory keeps only its own files.
TEST(TwoNodes, CheckpointsAndExport_EveryRanksShardInNodeZerosRunDirectory) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string n0 = Unique("ckpt0"), n1 = Unique("ckpt1"), exported = Unique("export");
  TwoNodeJob j = TwoNodeFlags({"--checkpoint_every=2", "--export_dir=" + exported}, n0, n1);
  Background b0 = Start(j.node0), b1 = Start(j.node1);
  ASSERT_EQ(b0.Wait(absl::Seconds(90)), 0) << b0.Output() << "\n--- node 1\n" << b1.Output();
  ASSERT_EQ(b1.Wait(absl::Seconds(30)), 0) << b1.Output();
  for (const char* step : {"step_00000002", "step_00000003"}) {
    const std::string dir = absl::StrCat(n0, "/checkpoints/", step);
    const std::string manifest = ReadFile(dir + "/MANIFEST");
    EXPECT_TRUE(absl::StrContains(manifest, "file: \"rank0.safetensors\"")) << dir << ": " << manifest;
    EXPECT_TRUE(absl::StrContains(manifest, "file: \"rank1.safetensors\"")) << dir << ": " << manifest;
    EXPECT_TRUE(Exists(dir + "/rank1.safetensors")) << dir;
  }
  EXPECT_FALSE(Exists(n1 + "/checkpoints")) << "node 1 kept checkpoints of its own";
  EXPECT_TRUE(Exists(n1 + "/params_rank1.pt")) << "node 1's own files go into its run directory";
  EXPECT_TRUE(Exists(exported + "/config.json")) << b0.Output();
  const std::string index = ReadFile(exported + "/model.safetensors.index.json");
  EXPECT_TRUE(absl::StrContains(index, "model-00001-of-00002.safetensors")) << index;
  EXPECT_TRUE(absl::StrContains(index, "model-00002-of-00002.safetensors")) << index;
  EXPECT_TRUE(Exists(exported + "/model-00002-of-00002.safetensors"));
  EXPECT_TRUE(absl::StrContains(b0.Output(), "weights exported to " + exported)) << b0.Output();
}

// SIGTERM to node 1's launcher alone (Slurm's preemption signals every node; any one is enough):
// node 0 has every rank write a checkpoint at one step, and both launchers exit 75. --resume of node
// 0's run directory on one host and one stage continues with an uninterrupted run's losses.
TEST(TwoNodes, SigtermToNodeOne_CheckpointOnEveryRank_Exit75_ResumeOnOneHostContinues) {
  setenv("OMP_NUM_THREADS", "1", 1);
  const std::string n0 = Unique("term0"), n1 = Unique("term1");
  TwoNodeJob j = TwoNodeFlags({"--checkpoint_every=100000"}, n0, n1);
  j.node0[8] = "--steps=100000";  // TinyJob index 8 is --steps: runs until the signal
  Background b0 = Start(j.node0), b1 = Start(j.node1);
  for (int i = 0; i < 600 && !absl::StrContains(b0.Output(), "step 3/"); ++i) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_TRUE(absl::StrContains(b0.Output(), "step 3/")) << b0.Output() << "\n--- node 1\n" << b1.Output();
  ASSERT_EQ(kill(b1.pid(), SIGTERM), 0);
  EXPECT_EQ(b1.Wait(absl::Seconds(60)), 75) << b1.Output() << "\n--- node 0\n" << b0.Output();
  EXPECT_EQ(b0.Wait(absl::Seconds(30)), 75) << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "node 1 got SIGTERM: every rank writes a checkpoint after step"))
      << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "stopped by node 1's SIGTERM after a checkpoint at step")) << b0.Output();
  const std::string out1 = b1.Output();
  const size_t at = out1.find("after a checkpoint at step ");
  ASSERT_NE(at, std::string::npos) << out1;
  int step = 0;
  ASSERT_TRUE(absl::SimpleAtoi(out1.substr(at + 27, out1.find(' ', at + 27) - at - 27), &step)) << out1;
  EXPECT_TRUE(absl::StrContains(out1, "--resume=" + n0)) << out1;
  const std::string manifest = ReadFile(absl::StrFormat("%s/checkpoints/step_%08d/MANIFEST", n0, step));
  EXPECT_TRUE(absl::StrContains(manifest, "rank1.safetensors")) << manifest;

  // One host, one stage, two more steps; and an uninterrupted run of as many steps.
  const std::string resumed = Unique("resumed"), ref = Unique("ref");
  std::vector<std::string> flags = TinyJob(1, 1, "tiny");
  flags[8] = absl::StrCat("--steps=", step + 2);
  std::vector<std::string> r = flags;
  r.push_back("--resume=" + n0);
  r.push_back("--run_dir=" + resumed);
  std::string out;
  ASSERT_EQ(RunLauncher(r, &out), 0) << out;
  EXPECT_TRUE(absl::StrContains(out, absl::StrCat("resuming from step ", step, " of "))) << out;
  flags.push_back("--run_dir=" + ref);
  ASSERT_EQ(RunLauncher(flags, &out), 0) << out;
  std::map<int, double> want = Losses(ref), got = Losses(resumed);
  ASSERT_EQ(got.size(), 2u) << ReadFile(resumed + "/steps.csv");
  for (const auto& [s, loss] : got) {
    ASSERT_TRUE(want.count(s)) << "step " << s;
    EXPECT_NEAR(loss, want[s], 1e-5 * std::abs(want[s])) << "step " << s;
  }
}

// A host that does not see node 0's run directory (here: node 1 in a mount namespace of its own,
// an empty tmpfs over that directory) cannot keep the job's checkpoints: its workers refuse before
// the first step, and node 0's root cause says what to change.
TEST(TwoNodes, NodeZerosRunDirectoryNotShared_RefusedNamingIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (a mount namespace)";
  const std::string n0 = Unique("unshared0"), n1 = Unique("unshared1");
  ASSERT_EQ(mkdir(n0.c_str(), 0755), 0);
  TwoNodeJob j = TwoNodeFlags({"--checkpoint_every=2"}, n0, n1);
  Background b0 = Start(j.node0);
  std::string cmd;
  for (const std::string& f : j.node1) absl::StrAppend(&cmd, " ", f);
  Background b1 = StartShell(absl::StrCat("exec unshare --mount sh -c 'mount -t tmpfs none ", n0, " && exec ",
                                          Runfile("launcher/launcher"), cmd, "'"));
  const int code = b0.Wait(absl::Seconds(60));
  EXPECT_EQ(code, 1) << b0.Output() << "\n--- node 1\n" << b1.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "node 0's run directory " + n0 + " is not visible on this host"))
      << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "a shared file system")) << b0.Output();
  EXPECT_NE(b1.Wait(absl::Seconds(30)), 0) << b1.Output();
}

// The workers whose parent is `pid` (a launcher), from /proc.
std::vector<int> ChildrenOf(int pid) {
  std::vector<int> out;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return out;
  for (dirent* e = readdir(proc); e != nullptr; e = readdir(proc)) {
    int child = 0;
    if (!absl::SimpleAtoi(e->d_name, &child)) continue;
    const std::string stat = ReadFile(absl::StrCat("/proc/", child, "/stat"));
    const size_t paren = stat.rfind(')');  // "pid (comm) state ppid ...": comm may hold spaces
    if (paren == std::string::npos) continue;
    std::vector<std::string> f = absl::StrSplit(stat.substr(paren + 2), ' ');
    int ppid = 0;
    char exe[4096];
    const ssize_t n = readlink(absl::StrCat("/proc/", child, "/exe").c_str(), exe, sizeof(exe) - 1);
    if (n <= 0 || !absl::EndsWith(absl::string_view(exe, n), "/worker")) continue;
    if (f.size() > 1 && absl::SimpleAtoi(f[1], &ppid) && ppid == pid) out.push_back(child);
  }
  closedir(proc);
  return out;
}

// NAME's value in the environment `pid` started with ("" when absent).
std::string EnvOf(int pid, const std::string& name) {
  for (absl::string_view entry : absl::StrSplit(ReadFile(absl::StrCat("/proc/", pid, "/environ")), '\0')) {
    if (absl::ConsumePrefix(&entry, name + "=")) return std::string(entry);
  }
  return "";
}

// Two launchers on one machine share its cores: each worker gets cores / (every node's workers here)
// threads, not cores / its own launcher's workers (which ran 2x the threads the cores hold, and each
// step 5x slower, OpenMP's threads spinning against each other).
TEST(TwoNodes, OnOneMachine_EachWorkersThreadsCountEveryNodesWorkers) {
  unsetenv("OMP_NUM_THREADS");  // the launchers choose
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string token = TokenFile();
  std::vector<std::string> node0 = TinyJob(1, 2, "tiny");
  node0[8] = "--steps=100000";  // TinyJob index 8 is --steps  // runs until it is stopped
  for (const std::string& f :
       std::vector<std::string>{"--nodes=2", "--node_rank=0", "--coordinator_address=" + address,
                                "--job_token_file=" + token, "--run_dir=" + Unique("threads0")}) {
    node0.push_back(f);
  }
  Background b0 = Start(node0);
  Background b1 = Start({"--nodes=2", "--node_rank=1", "--coordinator_address=" + address, "--job_token_file=" + token,
                         "--device=cpu", "--workers=1", "--run_dir=" + Unique("threads1")});
  for (int i = 0; i < 600 && !absl::StrContains(b0.Output(), "step 3/"); ++i) absl::SleepFor(absl::Milliseconds(100));
  const std::string want = absl::StrCat(std::max(1u, std::thread::hardware_concurrency() / 2));
  std::vector<std::string> got;
  for (const Background* b : {&b0, &b1}) {
    for (int worker : ChildrenOf(b->pid())) got.push_back(EnvOf(worker, "OMP_NUM_THREADS"));
  }
  kill(b0.pid(), SIGTERM);  // stops the job on both nodes
  EXPECT_NE(b0.Wait(absl::Seconds(30)), -1) << b0.Output();
  EXPECT_NE(b1.Wait(absl::Seconds(30)), -1) << b1.Output();
  ASSERT_TRUE(absl::StrContains(b0.Output(), "step 3/")) << b0.Output() << "\n--- node 1\n" << b1.Output();
  EXPECT_EQ(got, std::vector<std::string>({want, want})) << "OMP_NUM_THREADS of the workers of node 0, then node 1";
}

// A worker that cannot be started on an agent (here its binary names an interpreter that does not
// exist, so exec fails) is reported to node 0 at once: the job ends with exit 4 naming the rank and
// the error, well before the registration deadline (30 s here).
TEST(TwoNodes, AgentCannotStartItsWorker_EndsTheJobAtOnceWithExit4) {
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  const std::string token = TokenFile();
  const std::string bad = Unique("worker_without_interpreter");
  std::ofstream(bad) << "#!/nonexistent/interpreter\n";
  ASSERT_EQ(chmod(bad.c_str(), 0700), 0);
  std::vector<std::string> node0 = TinyJob(1, 2, "tiny");
  for (const std::string& f : std::vector<std::string>{"--nodes=2", "--node_rank=0", "--coordinator_address=" + address,
                                                       "--job_token_file=" + token, "--register_timeout_ms=30000",
                                                       "--run_dir=" + Unique("nostart0")}) {
    node0.push_back(f);
  }
  const absl::Time start = absl::Now();
  Background b0 = Start(node0);
  Background b1 = Start({"--nodes=2", "--node_rank=1", "--coordinator_address=" + address, "--job_token_file=" + token,
                         "--device=cpu", "--workers=1", "--worker_binary=" + bad, "--run_dir=" + Unique("nostart1")});
  const int code = b0.Wait(absl::Seconds(60));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(code, 4) << b0.Output() << "\n--- node 1\n" << b1.Output();
  EXPECT_LT(took, absl::Seconds(15)) << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "rank 1 (node 1 at 127.0.0.1")) << b0.Output();
  EXPECT_TRUE(absl::StrContains(b0.Output(), "could not be started: cannot execute")) << b0.Output();
  EXPECT_EQ(b1.Wait(absl::Seconds(10)), 4) << b1.Output();
}

TEST(Refusals, NonLoopbackAddressWithoutTls_Exit2SayingWhatToPass) {
  std::string out;
  // 198.18.0.0/24 (benchmark testing) and refused before anything binds or connects.
  EXPECT_EQ(RunLauncher({"--device=cpu", "--workers=1", "--nodes=2", "--coordinator_address=198.18.0.1:29500",
                         "--run_dir=" + Unique("refused")},
                        &out),
            2)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "--tls_cert")) << out;
  EXPECT_EQ(RunLauncher({"--nodes=2", "--node_rank=1", "--coordinator_address=198.18.0.1:29500", "--device=cpu"}, &out),
            2)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "--tls_ca")) << out;
}

TEST(Refusals, SeveralNodesOnLoopbackWithoutTokenOrTls_Exit2) {
  std::string out;
  EXPECT_EQ(RunLauncher({"--device=cpu", "--workers=1", "--nodes=2", "--run_dir=" + Unique("notoken")}, &out), 2)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "--job_token_file")) << out;
}

TEST(Refusals, SlurmWithNodeFlagsOrOutsideAJob_Exit2SayingWhatToDo) {
  std::string out;
  EXPECT_EQ(RunLauncher({"--slurm", "--nodes=2", "--device=cpu"}, &out), 2) << out;
  EXPECT_TRUE(absl::StrContains(out, "--nodes with --slurm: Slurm's job step says it; drop --nodes")) << out;
  unsetenv("SLURM_JOB_ID");  // the test's environment is no job step
  EXPECT_EQ(RunLauncher({"--slurm", "--device=cpu"}, &out), 2) << out;
  EXPECT_TRUE(absl::StrContains(out, "SLURM_JOB_ID is not set; run it under srun")) << out;
}

TEST(Refusals, JobFlagOnAnAgent_Exit2) {
  std::string out;
  EXPECT_EQ(RunLauncher({"--nodes=2", "--node_rank=1", "--coordinator_address=127.0.0.1:29500", "--model=tiny"}, &out),
            2)
      << out;
  EXPECT_TRUE(absl::StrContains(out, "--model with --node_rank=1")) << out;
}

}  // namespace
