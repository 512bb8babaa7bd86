// stagehand/step.h: what a C++ program run by `launcher -- PROGRAM` tells the launcher, as the Python
// module `stagehand` does (python/stagehand/__init__.py, docs/programs.md). Header only, C++17, POSIX,
// no dependency: copy it, or add include/ to the include path (Bazel: //include:stagehand_step).
//
//   #include "stagehand/step.h"
//   for (...) {
//     const double loss = TrainStep(batch);
//     stagehand::Step({.loss = loss, .tokens = global_batch_tokens});  // C++20; in C++17 set the fields
//   }
//
// Each call ends a step: its time (since the previous call, or since the program started), and what
// the caller knows. Call it on every rank. The launcher prints the progress line, appends the step to steps.csv,
// counts it for report.json (step time, tokens/s, samples/s, TFLOP/s and MFU from the FLOPs given)
// and stops the job as hung when a rank that has reported stops reporting for --progress_timeout_ms.
// Outside the launcher (STAGEHAND_STEPS_FILE unset) it does nothing. Thread-safe.
#ifndef STAGEHAND_INCLUDE_STAGEHAND_STEP_H_
#define STAGEHAND_INCLUDE_STAGEHAND_STEP_H_

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>

namespace stagehand {

// What a step processed and measured. tokens, samples: the whole job's in this step (the global
// batch, the same number on every rank); flops: the floating-point operations of this step on the
// whole job (left out unless a finite number of 0 or more).
struct StepInfo {
  std::optional<double> loss = std::nullopt;
  std::optional<int64_t> tokens = std::nullopt;
  std::optional<int64_t> samples = std::nullopt;
  std::optional<double> flops = std::nullopt;
};

namespace step_internal {

struct State {
  std::mutex mu;
  bool opened = false;
  int fd = -1;  // -1: not under the launcher, or the file could not be opened
  int64_t step = 0;
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
};

// Made before main() (so the first step's time counts from the program's start), never destroyed (a
// step may be reported from a static destructor).
inline State* const state = new State;
inline State& Get() { return *state; }

inline void Append(std::string& line, const char* format, ...) __attribute__((format(printf, 2, 3)));
inline void Append(std::string& line, const char* format, ...) {
  char buf[64];
  va_list args;
  va_start(args, format);
  const int n = std::vsnprintf(buf, sizeof(buf), format, args);
  va_end(args);
  if (n > 0) line.append(buf, static_cast<size_t>(n) < sizeof(buf) ? static_cast<size_t>(n) : sizeof(buf) - 1);
}

}  // namespace step_internal

// Ends a step (see the top of this file).
inline void Step(const StepInfo& info = {}) {
  step_internal::State& s = step_internal::Get();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - s.last).count();
  s.last = now;
  if (!s.opened) {
    s.opened = true;
    const char* path = std::getenv("STAGEHAND_STEPS_FILE");
    if (path != nullptr && *path != '\0') s.fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  }
  if (s.fd >= 0) {
    std::string line;
    step_internal::Append(line, "step=%lld seconds=%.6f", static_cast<long long>(s.step), seconds);
    if (info.loss) {
      const double v = *info.loss;
      if (std::isfinite(v)) {
        step_internal::Append(line, " loss=%.17g", v);
      } else {
        line += std::isnan(v) ? " loss=nan" : " loss=inf";
      }
    }
    if (info.tokens && *info.tokens >= 0) {
      step_internal::Append(line, " tokens=%lld", static_cast<long long>(*info.tokens));
    }
    if (info.samples && *info.samples >= 0) {
      step_internal::Append(line, " samples=%lld", static_cast<long long>(*info.samples));
    }
    if (info.flops && std::isfinite(*info.flops) && *info.flops >= 0) {
      step_internal::Append(line, " flops=%.17g", *info.flops);
    }
    line += '\n';
    // One write of the whole line, appended: the launcher never reads half a line.
    (void)!::write(s.fd, line.data(), line.size());
  }
  ++s.step;
}

// The same with only a loss.
inline void Step(double loss) { Step(StepInfo{loss, std::nullopt, std::nullopt, std::nullopt}); }

}  // namespace stagehand

#endif  // STAGEHAND_INCLUDE_STAGEHAND_STEP_H_
