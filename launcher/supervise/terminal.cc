// The bounded terminal writer, its fd sink, and the capture of the launcher's own stdout (see
// terminal.h).
#include "launcher/supervise/terminal.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/fd.h"
#include "common/logging.h"

namespace stagehand {
namespace {

// The capture cuts a line that never ends here, as the output forwarders do.
constexpr size_t kMaxLineBytes = 64 * 1024;

class FdTerminalSink : public TerminalSink {
 public:
  explicit FdTerminalSink(int fd) : fd_(fd), cancel_(eventfd(0, EFD_CLOEXEC)) {
    CHECK(cancel_ >= 0) << "eventfd: " << ErrnoText(errno);
  }
  ~FdTerminalSink() override { close(cancel_); }

  bool Write(absl::string_view data) override {
    while (!data.empty()) {
      pollfd fds[2] = {{fd_, POLLOUT, 0}, {cancel_, POLLIN, 0}};
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      if (fds[1].revents != 0) return false;
      if ((fds[0].revents & (POLLERR | POLLNVAL)) != 0) return false;
      // POLLOUT on a pipe promises room for PIPE_BUF bytes: a larger write could block.
      const ssize_t n = write(fd_, data.data(), std::min<size_t>(data.size(), PIPE_BUF));
      if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;  // EAGAIN: someone set O_NONBLOCK
      if (n < 0) return false;
      data.remove_prefix(n);
    }
    return true;
  }

  void Cancel() override {
    const uint64_t one = 1;
    if (write(cancel_, &one, sizeof one) != sizeof one) LOG(ERROR) << "eventfd write: " << ErrnoText(errno);
  }

 private:
  const int fd_;
  const int cancel_;
};

absl::Mutex stdout_mu(absl::kConstInit);
TerminalWriter* stdout_terminal ABSL_GUARDED_BY(stdout_mu) = nullptr;
int original_stdout ABSL_GUARDED_BY(stdout_mu) = STDOUT_FILENO;
absl::Notification* capture_done ABSL_GUARDED_BY(stdout_mu) = nullptr;  // the capture read EOF

// Reads the capture pipe until EOF and hands each line to the writer: this thread never writes to
// the terminal, so a printf waits at most for it to read, never for the terminal.
void DrainCapture(int pipe_fd, TerminalWriter* terminal, absl::Notification* done) {
  std::string partial;
  char buf[4096];
  while (true) {
    const ssize_t n = read(pipe_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    absl::string_view chunk(buf, n);
    for (size_t nl; (nl = chunk.find('\n')) != absl::string_view::npos; chunk.remove_prefix(nl + 1)) {
      partial.append(chunk.data(), nl);
      terminal->Submit(partial);
      partial.clear();
    }
    partial.append(chunk.data(), chunk.size());
    // A progress bar redraws its line in place: pass the redraw on now, not at the next newline.
    if (partial.find('\r') != std::string::npos) {
      terminal->SubmitPartial(partial);
      partial.clear();
    }
    if (partial.size() >= kMaxLineBytes) {
      terminal->Submit(partial);
      partial.clear();
    }
  }
  if (!partial.empty()) terminal->Submit(partial);
  close(pipe_fd);
  done->Notify();
}

}  // namespace

std::unique_ptr<TerminalSink> NewFdTerminalSink(int fd) { return std::make_unique<FdTerminalSink>(fd); }

TerminalWriter::TerminalWriter(std::unique_ptr<TerminalSink> sink, TerminalOptions options)
    : sink_(std::move(sink)), options_(options), thread_([this] { Run(); }) {}

TerminalWriter::~TerminalWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  sink_->Cancel();
  thread_.join();
}

void TerminalWriter::Submit(absl::string_view line, absl::string_view log) {
  std::string text(line);
  if (text.empty() || text.back() != '\n') text.push_back('\n');
  Queue(std::move(text), log);
}

void TerminalWriter::SubmitPartial(absl::string_view text) {
  if (!text.empty()) Queue(std::string(text), "");
}

void TerminalWriter::Queue(std::string text, absl::string_view log) {
  const size_t cost = text.size() + kEntryOverhead;
  absl::MutexLock lock(&mu_);
  if (broken_ || stop_) return;
  // An empty queue always takes one line, so that a line longer than the bound is not lost for it.
  if (!queue_.empty() && bytes_ + cost > options_.max_bytes) {
    ++dropped_;
    if (queue_.back().gap.empty()) queue_.push_back(Entry{});  // a gap is charged nothing: at most
    ++queue_.back().gap[std::string(log)];                     // one follows each queued line
    return;
  }
  bytes_ += cost;
  queue_.push_back(Entry{std::move(text), {}});
}

std::string TerminalWriter::Notices(const std::map<std::string, int64_t>& gap) {
  std::string out;
  for (const auto& [log, count] : gap) {
    if (log.empty()) {
      absl::StrAppend(&out, "[stagehand] ", count,
                      " lines of the launcher's output not shown (the terminal was not reading)\n");
    } else {
      absl::StrAppend(&out, "[stagehand] ", count,
                      " lines of worker output not shown (the terminal was not reading); see ", log, "\n");
    }
  }
  return out;
}

void TerminalWriter::Run() {
  while (true) {
    Entry entry;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TerminalWriter* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) { return w->stop_ || !w->queue_.empty(); },
          this));
      if (stop_) return;
      entry = std::move(queue_.front());
      queue_.pop_front();
      if (entry.gap.empty()) bytes_ -= entry.text.size() + kEntryOverhead;
      writing_ = true;
      write_began_ = absl::Now();
    }
    const bool ok = sink_->Write(entry.gap.empty() ? entry.text : Notices(entry.gap));
    absl::MutexLock lock(&mu_);
    writing_ = false;
    ++written_;
    if (!ok) {
      // A terminal that is gone stays gone: drop what is queued and take no more.
      broken_ = true;
      queue_.clear();
      bytes_ = 0;
      return;
    }
  }
}

bool TerminalWriter::Flush(absl::Duration patience) {
  absl::MutexLock lock(&mu_);
  while (true) {
    if (broken_ || (queue_.empty() && !writing_)) return true;
    const int64_t before = written_;
    struct Args {
      TerminalWriter* w;
      int64_t before;
    } args{this, before};
    const absl::Time deadline = (writing_ ? write_began_ : absl::Now()) + patience;
    const bool moved = mu_.AwaitWithDeadline(absl::Condition(
                                                 +[](Args* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                                   return a->w->broken_ || a->w->written_ != a->before ||
                                                          (a->w->queue_.empty() && !a->w->writing_);
                                                 },
                                                 &args),
                                             deadline);
    if (!moved) return false;
  }
}

int64_t TerminalWriter::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

TerminalWriter& StdoutTerminal() {
  absl::MutexLock lock(&stdout_mu);
  if (stdout_terminal == nullptr) stdout_terminal = new TerminalWriter(NewFdTerminalSink(original_stdout));
  return *stdout_terminal;
}

absl::Status CaptureStdout() {
  absl::MutexLock lock(&stdout_mu);
  if (stdout_terminal != nullptr) return absl::FailedPreconditionError("the stdout writer already exists");
  const int original = fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);
  if (original < 0) return absl::ErrnoToStatus(errno, "cannot duplicate stdout");
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    close(original);
    return absl::ErrnoToStatus(errno, "pipe2");
  }
  if (dup2(fds[1], STDOUT_FILENO) < 0) {
    const int err = errno;
    close(original);
    close(fds[0]);
    close(fds[1]);
    return absl::ErrnoToStatus(err, "cannot redirect stdout");
  }
  close(fds[1]);  // fd 1 is now the only write end: closing it is the capture's EOF
  // A pipe makes stdio buffer stdout in blocks; line buffering lets the terminal see each line as it comes.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  original_stdout = original;
  stdout_terminal = new TerminalWriter(NewFdTerminalSink(original));
  capture_done = new absl::Notification;
  std::thread(DrainCapture, fds[0], stdout_terminal, capture_done).detach();
  return absl::OkStatus();
}

void FinishStdout(absl::Duration patience) {
  std::fflush(stdout);
  absl::Notification* done;
  {
    absl::MutexLock lock(&stdout_mu);
    done = capture_done;
  }
  if (done != nullptr) {
    const int dev_null = open("/dev/null", O_WRONLY | O_CLOEXEC);
    // Replacing fd 1 closes the capture's last write end (children have their own fd 1).
    if (dev_null >= 0 && dup2(dev_null, STDOUT_FILENO) >= 0) done->WaitForNotificationWithTimeout(patience);
    if (dev_null >= 0) close(dev_null);
  }
  StdoutTerminal().Flush(patience);
}

}  // namespace stagehand
