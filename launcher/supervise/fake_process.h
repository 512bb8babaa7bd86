// A ProcessSpawner for unit tests of the supervisor: starts nothing, hands out fake pids, records the
// specs and signals it gets, and reports the exits a test queues with Exit() or Kill().
#ifndef STAGEHAND_LAUNCHER_SUPERVISE_FAKE_PROCESS_H_
#define STAGEHAND_LAUNCHER_SUPERVISE_FAKE_PROCESS_H_

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "launcher/supervise/process.h"

namespace stagehand {

class FakeProcessSpawner : public ProcessSpawner {
 public:
  static constexpr int kFirstPid = 1000;

  struct SentSignal {
    int pid = 0;
    int signal = 0;
    bool operator==(const SentSignal& other) const { return pid == other.pid && signal == other.signal; }
  };

  // Returns the next fake pid (1000, 1001, ...) and records the spec; or, once after FailNextSpawn,
  // returns that error and records nothing.
  absl::StatusOr<int> Spawn(const ProcessSpec& spec) override {
    absl::MutexLock lock(&mu_);
    if (!next_spawn_error_.ok()) return std::exchange(next_spawn_error_, absl::OkStatus());
    specs_.push_back(spec);
    const int pid = next_pid_++;
    running_.push_back(pid);
    return pid;
  }

  // Records the signal; with SetExitOnSignal(true), a running pid also ends by it.
  void SignalGroup(int pid, int signal) override {
    absl::MutexLock lock(&mu_);
    signals_.push_back({pid, signal});
    if (exit_on_signal_ && signal != 0 && IsRunning(pid)) QueueExit(pid, -1, signal);
  }

  std::vector<ProcessExit> Reap() override {
    absl::MutexLock lock(&mu_);
    return std::exchange(queued_exits_, {});
  }

  void DrainOutput(int pid, absl::Duration timeout) override {}

  // Makes the next Reap() report that pid exited with exit_code.
  void Exit(int pid, int exit_code) {
    absl::MutexLock lock(&mu_);
    QueueExit(pid, exit_code, 0);
  }

  // Makes the next Reap() report that pid was ended by signal.
  void Kill(int pid, int signal) {
    absl::MutexLock lock(&mu_);
    QueueExit(pid, -1, signal);
  }

  // The next Spawn() fails with status (which must not be OK).
  void FailNextSpawn(absl::Status status) {
    absl::MutexLock lock(&mu_);
    next_spawn_error_ = std::move(status);
  }

  // Off by default: a test decides when and how a process ends, e.g. one that ignores SIGTERM.
  void SetExitOnSignal(bool exit_on_signal) {
    absl::MutexLock lock(&mu_);
    exit_on_signal_ = exit_on_signal;
  }

  // The specs of successful spawns, in order; specs()[i] got pid kFirstPid + i.
  std::vector<ProcessSpec> specs() const {
    absl::MutexLock lock(&mu_);
    return specs_;
  }

  std::vector<SentSignal> signals() const {
    absl::MutexLock lock(&mu_);
    return signals_;
  }

  // Pids spawned and not yet ended by Exit(), Kill() or a signal (whether or not reaped yet).
  std::vector<int> running() const {
    absl::MutexLock lock(&mu_);
    return running_;
  }

 private:
  bool IsRunning(int pid) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find(running_.begin(), running_.end(), pid) != running_.end();
  }

  void QueueExit(int pid, int exit_code, int signal) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ProcessExit exit;
    exit.pid = pid;
    exit.exit_code = exit_code;
    exit.signal = signal;
    queued_exits_.push_back(exit);
    running_.erase(std::remove(running_.begin(), running_.end(), pid), running_.end());
  }

  mutable absl::Mutex mu_;
  int next_pid_ ABSL_GUARDED_BY(mu_) = kFirstPid;
  absl::Status next_spawn_error_ ABSL_GUARDED_BY(mu_);
  bool exit_on_signal_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<ProcessSpec> specs_ ABSL_GUARDED_BY(mu_);
  std::vector<SentSignal> signals_ ABSL_GUARDED_BY(mu_);
  std::vector<int> running_ ABSL_GUARDED_BY(mu_);
  std::vector<ProcessExit> queued_exits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stagehand

#endif  // STAGEHAND_LAUNCHER_SUPERVISE_FAKE_PROCESS_H_
