// The launcher's terminal: every line meant for stdout (the workers' and the launcher's own) goes
// through one bounded buffer that one thread writes out, so that a terminal that stops reading stalls
// that thread only, never supervision. Lines that do not fit are dropped from the terminal (the rank
// logs get every line: the forwarders write them first) and a notice counts them once it moves again.
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_TERMINAL_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_TERMINAL_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace stagehand {

// Where the writer's thread writes: the terminal, or a fake (fake_terminal.h).
class TerminalSink {
 public:
  virtual ~TerminalSink() = default;
  // Writes all of `data`, waiting while the terminal does not read. False once Cancel() was called
  // (then promptly, even mid-wait) or when the terminal is gone (EPIPE, EIO).
  virtual bool Write(absl::string_view data) = 0;
  virtual void Cancel() = 0;
};

// Writes to `fd` (not owned) in pieces of at most PIPE_BUF after poll() says it takes them, so that a
// write never blocks past Cancel(). The fd is left blocking: O_NONBLOCK would be set on the open file
// description, which the shell and the other processes of a pipeline share.
std::unique_ptr<TerminalSink> NewFdTerminalSink(int fd);

struct TerminalOptions {
  // The bound on buffered lines, in bytes (each line is charged its text plus kEntryOverhead): with
  // typical 100-byte lines about 6,000 of them, a few seconds of a chatty job.
  size_t max_bytes = 1 << 20;
};

class TerminalWriter {
 public:
  static constexpr size_t kEntryOverhead = 64;

  explicit TerminalWriter(std::unique_ptr<TerminalSink> sink, TerminalOptions options = {});
  // Cancels the sink and joins the thread; what is still buffered is lost (Flush first).
  ~TerminalWriter();
  TerminalWriter(const TerminalWriter&) = delete;
  TerminalWriter& operator=(const TerminalWriter&) = delete;

  // Queues `line` (a newline is added when it lacks one). Never waits for the terminal: when the
  // buffer is full the line is dropped, counted against `log`, the file where the line can still be
  // read ("" for the launcher's own lines), and in its place the terminal later gets
  //   [stagehand] 1234 lines of worker output not shown (the terminal was not reading); see <log>
  void Submit(absl::string_view line, absl::string_view log = "");
  // The same, for text that does not end a line: a progress bar's redraw ("\r[####...] 40%").
  void SubmitPartial(absl::string_view text);

  // Waits until every queued line is written; gives up (false) once the terminal has taken nothing
  // for `patience`, counting the time it was stalled before the call: at the end of a run during
  // which the terminal did not read, it returns at once. A slow terminal that keeps moving gets all.
  bool Flush(absl::Duration patience);

  int64_t dropped() const;  // lines dropped from the terminal so far, in all

 private:
  // A line, or (text empty, gap not) the place of the lines dropped there: log -> how many.
  struct Entry {
    std::string text;
    std::map<std::string, int64_t> gap;
  };
  static std::string Notices(const std::map<std::string, int64_t>& gap);
  void Queue(std::string text, absl::string_view log);
  void Run();

  const std::unique_ptr<TerminalSink> sink_;
  const TerminalOptions options_;
  mutable absl::Mutex mu_;
  std::deque<Entry> queue_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;        // charged by the lines in queue_
  bool writing_ ABSL_GUARDED_BY(mu_) = false;    // the thread holds an entry it has not written yet
  absl::Time write_began_ ABSL_GUARDED_BY(mu_);  // when it took that entry
  int64_t written_ ABSL_GUARDED_BY(mu_) = 0;     // entries written: Flush's measure of progress
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // the sink failed: lines are discarded uncounted
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members above exist
};

// The process's writer on its stdout, created on first use (on fd 1 as it is then, or on the
// original stdout once CaptureStdout() has run). Never destroyed: forwarders may outlive main.
TerminalWriter& StdoutTerminal();

// For the launcher's main(): the launcher's own stdout (printf, progress, the root cause) goes
// through StdoutTerminal() too. fd 1 becomes a pipe that a thread drains line by line into the
// writer, which writes to a duplicate of the original fd 1; so no printf anywhere blocks for long,
// and code that prints (launch.cc, progress.cc) needs no change. Call before starting any thread
// that prints, and with stdout not yet written to.
absl::Status CaptureStdout();

// The end of main(): flushes stdio into the capture, waits until the capture has passed it on, and
// flushes the writer with `patience` (a stalled terminal loses the last lines rather than keep the
// launcher from exiting). Later writes to fd 1 go to /dev/null.
void FinishStdout(absl::Duration patience);

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_TERMINAL_H_
