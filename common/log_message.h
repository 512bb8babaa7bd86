// The logger's message class without the LOG and CHECK macros, for LibTorch translation units (c10
// defines macros of those names): stagehand::LogMessage(LogSeverity::kError, __FILE__, __LINE__).stream().
#ifndef STAGEHAND_COMMON_LOG_MESSAGE_H_
#define STAGEHAND_COMMON_LOG_MESSAGE_H_

#include <sstream>
#include <string>

#include "absl/strings/string_view.h"

namespace stagehand {

enum class LogSeverity { kInfo, kWarning, kError, kFatal };

// Sets a tag printed after the severity on every line of this process (e.g. "rank 3").
void SetLogTag(absl::string_view tag);

class LogMessage {
 public:
  LogMessage(LogSeverity severity, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts for kFatal.
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogSeverity severity_;
  std::ostringstream stream_;
};

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_LOG_MESSAGE_H_
