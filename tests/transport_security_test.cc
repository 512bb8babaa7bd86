// Integration test of the CPU transport's door through the real launcher: a running CPU job whose
// workers' transport ports are hit with junk bytes and forged hellos must log the strangers, drop them
// and still finish with exit 0.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace {

using ::stagehand::testing::ReadFile;
using ::stagehand::testing::Runfile;
using Clock = std::chrono::steady_clock;

// Polls `done` every 10 ms until it holds or `timeout` passes.
bool WaitFor(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto end = Clock::now() + timeout;
  while (Clock::now() < end) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Live processes whose command line contains `needle` (a job's workers carry --job_id=<id>).
std::vector<int> PidsWith(const std::string& needle) {
  std::vector<int> pids;
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    const int pid = atoi(e->d_name);
    if (pid <= 0 || pid == getpid()) continue;
    std::string cmd = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    const bool zombie = ReadFile(absl::StrCat("/proc/", pid, "/stat")).find(") Z ") != std::string::npos;
    if (!zombie && cmd.find(needle) != std::string::npos) pids.push_back(pid);
  }
  closedir(d);
  return pids;
}

// The launcher as a child process with its output in a file; killed (and its workers with it) if the
// test ends before it does. A trimmed copy of launcher_test.cc's, which another change is editing.
class Launcher {
 public:
  explicit Launcher(std::vector<std::string> args) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    run_dir_ = absl::StrCat(tmp ? tmp : "/tmp", "/security_run", getpid());
    output_ = run_dir_ + ".out";
    args.insert(args.begin(), Runfile("launcher/launcher"));
    args.push_back("--run_dir=" + run_dir_);
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(output_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Launcher() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string output() const { return ReadFile(output_); }
  const std::string& run_dir() const { return run_dir_; }
  // The exit code (128+signal if killed), or -1 if it is still running after `timeout`.
  int Wait(std::chrono::milliseconds timeout) {
    int status = 0;
    if (!WaitFor([&] { return exited_ || waitpid(pid_, &status, WNOHANG) == pid_; }, timeout)) return -1;
    if (!exited_) {
      exited_ = true;
      code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    return code_;
  }
  std::string JobId(std::chrono::milliseconds timeout) {
    static const std::regex re("job ([0-9a-f]+):");
    std::smatch m;
    std::string out;
    WaitFor(
        [&] {
          out = output();
          return std::regex_search(out, m, re);
        },
        timeout);
    return m.size() > 1 ? m[1].str() : "";
  }
  // Every rank has logged a line: its transport is up (the first line a rank logs says so).
  bool WaitForRanksUp(int ranks, std::chrono::milliseconds timeout) {
    return WaitFor(
        [&] {
          const std::string out = output();
          for (int r = 0; r < ranks; ++r) {
            if (out.find(absl::StrCat("[rank ", r, "]")) == std::string::npos) return false;
          }
          return true;
        },
        timeout);
  }

 private:
  int pid_ = 0;
  bool exited_ = false;
  int code_ = -1;
  std::string run_dir_, output_;
};

// The inodes of the sockets process `pid` holds ("socket:[123]" links under /proc/<pid>/fd).
std::set<std::string> SocketInodes(int pid) {
  std::set<std::string> inodes;
  const std::string dir = absl::StrCat("/proc/", pid, "/fd");
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return inodes;
  while (dirent* e = readdir(d)) {
    char target[64] = {};
    if (readlink((dir + "/" + e->d_name).c_str(), target, sizeof(target) - 1) <= 0) continue;
    std::smatch m;
    const std::string t = target;
    static const std::regex re("socket:\\[([0-9]+)\\]");
    if (std::regex_match(t, m, re)) inodes.insert(m[1].str());
  }
  closedir(d);
  return inodes;
}

// The IPv4 TCP ports `pid` listens on: its socket inodes matched against /proc/<pid>/net/tcp's LISTEN
// rows (state 0A), as `ss -ltnp` would show them.
std::vector<int> ListeningPorts(int pid) {
  const std::set<std::string> inodes = SocketInodes(pid);
  std::vector<int> ports;
  std::istringstream tcp(ReadFile(absl::StrCat("/proc/", pid, "/net/tcp")));
  std::string line;
  std::getline(tcp, line);  // the header
  while (std::getline(tcp, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 10 || f[3] != "0A" || inodes.count(f[9]) == 0) continue;
    ports.push_back(std::stoi(f[1].substr(f[1].find(':') + 1), nullptr, 16));
  }
  return ports;
}

// A connection to 127.0.0.1:port whose reads give up after 5 s.
int Dial(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes` as a stranger and reports whether the worker then closed the connection (within 5 s).
bool SentAndDropped(int port, const std::string& bytes) {
  const int fd = Dial(port);
  if (fd < 0) return false;
  bool closed = send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
  char buf[256];
  for (;;) {
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r > 0) continue;
    closed = closed && (r == 0 || errno == ECONNRESET);
    break;
  }
  close(fd);
  return closed;
}

void PutLe(uint64_t v, int bytes, std::string& out) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// A protocol-2 hello (transport/cpu_transport.cc) from only what a stranger can learn: the job id (argv,
// GetServerInfo) and so the key prefix "<job>/world", the world size, the ranks.
std::string ForgedHello(int sender, int receiver, int world_size, const std::string& key_prefix) {
  uint64_t fnv = 0xcbf29ce484222325ull;
  for (unsigned char c : key_prefix) fnv = (fnv ^ c) * 0x100000001b3ull;
  std::string h;
  PutLe(0x54434853, 4, h);
  PutLe(2, 4, h);
  PutLe(sender, 4, h);
  PutLe(receiver, 4, h);
  PutLe(world_size, 4, h);
  PutLe(fnv, 8, h);
  h.append(32, '\x42');
  return h + std::string(32, '\x17');  // and a guess at the proof
}

TEST(TransportSecurity, StrangersOnWorkerPorts_JunkAndForgedHellos_JobStillExitsZero) {
  constexpr int kWorkers = 3;
  // Long enough to be running while it is attacked (about 1 ms a step here), short enough to end well
  // inside the test's bound.
  Launcher l({"--device=cpu", absl::StrCat("--workers=", kWorkers), "--model=allreduce", "--steps=10000",
              "--tensor_elements=4096"});
  const std::string job = l.JobId(std::chrono::seconds(20));
  ASSERT_FALSE(job.empty()) << l.output();
  ASSERT_TRUE(l.WaitForRanksUp(kWorkers, std::chrono::seconds(20))) << l.output();
  std::vector<int> ports;
  ASSERT_TRUE(WaitFor(
      [&] {
        ports.clear();
        for (int pid : PidsWith("--job_id=" + job)) {
          for (int port : ListeningPorts(pid)) ports.push_back(port);
        }
        return ports.size() == kWorkers;
      },
      std::chrono::seconds(5)))
      << ports.size() << " listening ports found among the workers";

  for (int port : ports) {
    EXPECT_TRUE(SentAndDropped(port, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03junk-bytes!!", 24)))
        << "port " << port;
    for (int receiver = 0; receiver + 1 < kWorkers; ++receiver) {
      EXPECT_TRUE(SentAndDropped(port, ForgedHello(kWorkers - 1, receiver, kWorkers, job + "/world")))
          << "port " << port << " receiver " << receiver;
    }
  }
  ASSERT_EQ(l.Wait(std::chrono::milliseconds(0)), -1) << "the job ended before the attack was over; raise --steps\n"
                                                      << l.output();

  EXPECT_EQ(l.Wait(std::chrono::seconds(45)), 0) << l.output();
  EXPECT_NE(l.output().find("stagehand: done"), std::string::npos) << l.output();
  std::string logs;
  for (int r = 0; r < kWorkers; ++r) logs += ReadFile(absl::StrCat(l.run_dir(), "/rank", r, ".log"));
  EXPECT_NE(logs.find("does not speak the cpu transport protocol"), std::string::npos) << logs;
  EXPECT_NE(logs.find("claims rank 2, which is already connected"), std::string::npos) << logs;
  EXPECT_TRUE(WaitFor([&] { return PidsWith("--job_id=" + job).empty(); }, std::chrono::seconds(5)))
      << "processes of job " << job << " remain";
}

}  // namespace
