// Implementation of the minimal logger: formats a line and writes it with one write(2) call, so lines
// of concurrent threads and processes sharing a pipe do not interleave.
#include "common/logging.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace stagehand {
namespace {

absl::Mutex tag_mu(absl::kConstInit);
std::string* tag ABSL_GUARDED_BY(tag_mu) = nullptr;

char SeverityChar(LogSeverity s) {
  switch (s) {
    case LogSeverity::kInfo:
      return 'I';
    case LogSeverity::kWarning:
      return 'W';
    case LogSeverity::kError:
      return 'E';
    case LogSeverity::kFatal:
      return 'F';
  }
  return '?';
}

}  // namespace

void SetLogTag(absl::string_view t) {
  absl::MutexLock lock(&tag_mu);
  if (tag == nullptr) tag = new std::string;
  *tag = std::string(t);
}

LogMessage::LogMessage(LogSeverity severity, const char* file, int line) : severity_(severity) {
  const char* base = std::strrchr(file, '/');
  stream_ << SeverityChar(severity) << absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  {
    absl::MutexLock lock(&tag_mu);
    if (tag != nullptr && !tag->empty()) stream_ << " " << *tag;
  }
  stream_ << " " << (base ? base + 1 : file) << ":" << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << "\n";
  const std::string s = stream_.str();
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
  if (severity_ == LogSeverity::kFatal) std::abort();
}

}  // namespace stagehand
