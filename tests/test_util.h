// Helpers shared by the multi-process tests: runfile paths, whole-file reads, a launcher run and its
// losses, and a small tmpfs for full-disk tests.
#ifndef STAGEHAND_TESTS_TEST_UTIL_H_
#define STAGEHAND_TESTS_TEST_UTIL_H_

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace stagehand::testing {

// A file of this workspace's runfiles, e.g. "launcher/launcher".
inline std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/stagehand/" + path;
}

// The whole file, or "" when it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A path of the test's own: <TEST_TMPDIR>/<prefix>_<pid>_<n>, a new one each call.
inline std::string TmpPath(const std::string& prefix) {
  static int counter = 0;
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + prefix + "_" + std::to_string(getpid()) + "_" +
         std::to_string(counter++);
}

inline bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// The shell command that runs the real launcher with `flags` and --run_dir, its output into <run_dir>.out.
inline std::string LauncherCommand(const std::vector<std::string>& flags, const std::string& run_dir) {
  std::string cmd = Runfile("launcher/launcher");
  for (const std::string& f : flags) cmd += " " + f;
  return cmd + " --run_dir=" + run_dir + " > " + run_dir + ".out 2>&1";
}

struct RunResult {
  int exit_code = -1;
  std::string output;  // what the launcher printed, stdout and stderr
  std::string run_dir;
};

// Runs the real launcher with `flags` and --run_dir=TmpPath(prefix), and waits for it.
inline RunResult Launch(const std::vector<std::string>& flags, const std::string& prefix) {
  RunResult r;
  r.run_dir = TmpPath(prefix);
  const int status = std::system(LauncherCommand(flags, r.run_dir).c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.output = ReadFile(r.run_dir + ".out");
  return r;
}

// step -> loss, from a run's steps.csv (the loss comes from the rank holding the head; steps without
// one are left out).
inline std::map<int, double> Losses(const std::string& run_dir) {
  std::map<int, double> out;
  std::istringstream csv(ReadFile(run_dir + "/steps.csv"));
  std::string line;
  int loss_column = -1;
  for (bool header = true; std::getline(csv, line); header = false) {
    std::vector<std::string> f;
    std::istringstream fields(line);
    for (std::string x; std::getline(fields, x, ',');) f.push_back(x);
    if (header) {
      for (size_t i = 0; i < f.size(); ++i) {
        if (f[i] == "loss") loss_column = static_cast<int>(i);
      }
      continue;
    }
    if (loss_column < 0 || static_cast<int>(f.size()) <= loss_column || f[loss_column].empty() || f[0].empty())
      continue;
    out[std::stoi(f[0])] = std::stod(f[loss_column]);
  }
  return out;
}

// A tmpfs mounted at `dir` for the life of the object (size like "256k", options like "ro"), so a
// test can fill a disk. Needs root; ok() is false (with why()) otherwise, and the test skips. The
// first mount moves this process into a mount namespace of its own when it can, so that a mount left
// by a test that was killed dies with the process instead of outliving it; the destructor unmounts
// (lazily, should a file still be open) in any case.
class ScopedTmpfs {
 public:
  ScopedTmpfs(const std::string& dir, const std::string& size, const std::string& options = "") : dir_(dir) {
    if (geteuid() != 0) {
      why_ = "not root: mounting a tmpfs needs root";
      return;
    }
    static const bool own_namespace =
        unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
    (void)own_namespace;
    ::mkdir(dir.c_str(), 0755);
    // "ro" is a mount flag, not a tmpfs option; anything else goes to tmpfs.
    const std::string data = "size=" + size + (options.empty() || options == "ro" ? "" : "," + options);
    const unsigned long flags = options == "ro" ? MS_RDONLY : 0;
    if (mount("tmpfs", dir.c_str(), "tmpfs", flags, data.c_str()) != 0) {
      why_ = std::string("mount -t tmpfs failed: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  ~ScopedTmpfs() {
    if (mounted_ && umount2(dir_.c_str(), 0) != 0) umount2(dir_.c_str(), MNT_DETACH);
  }
  ScopedTmpfs(const ScopedTmpfs&) = delete;
  ScopedTmpfs& operator=(const ScopedTmpfs&) = delete;

  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& dir() const { return dir_; }

  // Fills the file system with a file of zeros until about `leave` bytes are free. Returns false if
  // it could not.
  bool LeaveFree(long leave) {
    struct statvfs v;
    if (statvfs(dir_.c_str(), &v) != 0) return false;
    const long free_bytes = static_cast<long>(v.f_bavail) * static_cast<long>(v.f_bsize);
    if (free_bytes <= leave) return true;
    std::ofstream filler(dir_ + "/filler", std::ios::binary);
    filler << std::string(free_bytes - leave, '\0');
    return static_cast<bool>(filler.flush());
  }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string why_;
};

}  // namespace stagehand::testing

#endif  // STAGEHAND_TESTS_TEST_UTIL_H_
