// The client's token file (see bearer_token.h).
#include "control/bearer_token.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/fd.h"
#include "common/input_file.h"

namespace stagehand {
namespace {

constexpr off_t kMaxTokenFileBytes = 4096;

}  // namespace

absl::StatusOr<TokenFile> ReadTokenFile(const std::string& path) {
  // A regular file only (common/input_file.h): a FIFO would block open() until a writer came.
  absl::StatusOr<RegularFile> file = OpenRegularFile(path, absl::StrCat("--token_file=", path));
  if (!file.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.status().message(), "; pass the file holding the token you were given"));
  }
  const UniqueFd fd = std::move(file->fd);
  const struct stat st = file->st;
  if (st.st_size > kMaxTokenFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--token_file=", path, ": not a small regular file; it should hold the token alone"));
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  ssize_t n;
  while ((n = ::pread(fd.get(), text.data(), text.size(), 0)) < 0 && errno == EINTR) {
  }
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file=", path, ": cannot read it: ", ErrnoText(errno)));
  }
  text.resize(static_cast<size_t>(n));
  TokenFile out;
  out.token = std::string(absl::StripAsciiWhitespace(text));
  if (out.token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file=", path,
                                                   ": empty; put the token you were "
                                                   "given in it"));
  }
  if (std::any_of(out.token.begin(), out.token.end(), [](char c) { return !absl::ascii_isgraph(c); })) {
    return absl::InvalidArgumentError(absl::StrCat("--token_file=", path,
                                                   ": holds more than one word; it should "
                                                   "hold the token alone"));
  }
  if ((st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    out.warning = absl::StrFormat("warning: the token file %s can be read by others (mode %04o); chmod 600 %s", path,
                                  st.st_mode & 07777, path);
  }
  return out;
}

}  // namespace stagehand
