// Inputs read before anything starts (a job file, a schedule, layer profiles, a checkpoint's MANIFEST,
// exported weights, token files, PEM files): opened as regular files only. A FIFO, a terminal or any
// other device would block open() or read() forever, or never end; they are refused with one line.
#ifndef STAGEHAND_COMMON_INPUT_FILE_H_
#define STAGEHAND_COMMON_INPUT_FILE_H_

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/fd.h"

namespace stagehand {

struct RegularFile {
  UniqueFd fd;        // blocking again, close-on-exec
  struct stat st {};  // fstat of fd: st_size, st_mode
};

// Opens `path` with O_RDONLY | O_NONBLOCK | O_CLOEXEC (a FIFO opens at once, with no writer), fstats
// the descriptor (not the path, so nothing can swap the file in between) and refuses anything but a
// regular file. `what` names the input in the message, as the user gave it ("--schedule_file=s.txt"):
// "<what>: not a regular file but a FIFO; pass a regular file". NOT_FOUND when it does not exist,
// INVALID_ARGUMENT otherwise.
absl::StatusOr<RegularFile> OpenRegularFile(const std::string& path, const std::string& what);

// OpenRegularFile, then the whole file, at most `max_bytes` (more is INVALID_ARGUMENT saying so).
absl::StatusOr<std::string> ReadRegularFile(const std::string& path, const std::string& what,
                                            int64_t max_bytes = int64_t{1} << 30);

// "a FIFO", "a directory", "a character device", ...: what a non-regular st_mode is, for messages.
std::string FileKind(mode_t mode);

// User input as an error message may echo it: its first `max_bytes` bytes with non-printable bytes
// escaped, and "... (N bytes)" when it is longer, so that a 100 MB name makes a short line.
std::string ClipInput(absl::string_view input, size_t max_bytes = 200);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_INPUT_FILE_H_
