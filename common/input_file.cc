// Inputs opened as regular files only (see input_file.h).
#include "common/input_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace stagehand {

std::string FileKind(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a file";
}

absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path, const std::string& what) {
  RegularFile f;
  int fd;
  while ((fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY)) < 0 && errno == EINTR) {
  }
  if (fd < 0) {
    const int err = errno;
    const std::string line = absl::StrCat(what, ": cannot read it: ", ErrnoText(err));
    return err == ENOENT ? absl::NotFoundError(line) : absl::InvalidArgumentError(line);
  }
  f.fd.reset(fd);
  if (::fstat(fd, &f.st) != 0)
    return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read it: ", ErrnoText(errno)));
  if (!S_ISREG(f.st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": not a regular file but ", FileKind(f.st.st_mode), "; pass a regular file"));
  }
  // A regular file never blocks; reads are plain from here on.
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return f;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path, const std::string& what, int64_t max_bytes) {
  absl::StatusOr<RegularFile> f = OpenRegularFile(path, what);
  if (!f.ok()) return f.status();
  if (f->st.st_size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": ", f->st.st_size, " bytes, more than the ", max_bytes, " it may hold"));
  }
  std::string text;
  // Bounded by max_bytes + 1 whatever the size said (a file that grows, /proc's size 0).
  char buf[64 * 1024];
  for (;;) {
    const ssize_t n = ::read(f->fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": cannot read it: ", ErrnoText(errno)));
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > max_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": more than the ", max_bytes, " bytes it may hold"));
    }
  }
  return text;
}

std::string ClipInput(absl::string_view input, size_t max_bytes) {
  if (input.size() <= max_bytes) return absl::CHexEscape(input);
  return absl::StrCat(absl::CHexEscape(input.substr(0, max_bytes)), "... (", input.size(), " bytes)");
}

}  // namespace stagehand
