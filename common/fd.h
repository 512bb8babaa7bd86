// File descriptors and errno for the POSIX code of the launcher and the worker: one owner of a
// descriptor that closes it on every path, and errno as text.
#ifndef STAGEHAND_COMMON_FD_H_
#define STAGEHAND_COMMON_FD_H_

#include <string.h>
#include <unistd.h>

#include <string>
#include <utility>

namespace stagehand {

class UniqueFd {
 public:
  explicit UniqueFd(int fd = -1) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// strerror, thread-safe (the GNU strerror_r returns the text).
inline std::string ErrnoText(int err) {
  char buf[256];
  return strerror_r(err, buf, sizeof buf);
}

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_FD_H_
