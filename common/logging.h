// Minimal streaming logger (Debian's abseil 20220623 has no absl/log): LOG(INFO) << "text";
// One line per message on stderr, prefixed with severity, time and an optional process tag.
// LibTorch's c10 defines LOG and CHECK too: do not include this header in a LibTorch translation unit;
// common/log_message.h has the class without the macros.
#ifndef STAGEHAND_COMMON_LOGGING_H_
#define STAGEHAND_COMMON_LOGGING_H_

#include "common/log_message.h"

#define STAGEHAND_LOG_INFO ::stagehand::LogSeverity::kInfo
#define STAGEHAND_LOG_WARNING ::stagehand::LogSeverity::kWarning
#define STAGEHAND_LOG_ERROR ::stagehand::LogSeverity::kError
#define STAGEHAND_LOG_FATAL ::stagehand::LogSeverity::kFatal
#define LOG(severity) ::stagehand::LogMessage(STAGEHAND_LOG_##severity, __FILE__, __LINE__).stream()
#define CHECK(cond) \
  if (!(cond)) LOG(FATAL) << "check failed: " #cond " "

#endif  // STAGEHAND_COMMON_LOGGING_H_
