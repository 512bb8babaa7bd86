// Helpers shared by the multi-process tests: runfile paths, whole-file reads, and a small tmpfs for
// full-disk tests.
#ifndef STAGEHAND_TESTS_TEST_UTIL_H_
#define STAGEHAND_TESTS_TEST_UTIL_H_

#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

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
    static const bool own_namespace = unshare(CLONE_NEWNS) == 0 &&
                                      mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0;
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
