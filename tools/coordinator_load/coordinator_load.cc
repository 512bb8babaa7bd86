// coordinator_load: N simulated workers against a real coordinator over real gRPC, to measure what the
// coordinator's rendezvous costs at scale. The coordinator (CoordinatorState + CoordinatorServer, as
// the launcher runs them) lives in a child process, so that its RSS and CPU time are its own; the
// workers are state machines on gRPC's callback client API over a few channels, so 10,000 in flight
// need no thread each. Each worker: Register; KeyValueSet of its address (rank 0 also the job's
// "unique id"); KeyValueGet of its right neighbour's address and of the unique id; Barrier.
#include <signal.h>
#include <sys/prctl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "launcher/coordinator/coordinator.h"
#include "launcher/coordinator/coordinator_service.h"
#include "protos/coordinator.grpc.pb.h"

ABSL_FLAG(int, workers, 10000, "simulated workers (1 to 20000)");
ABSL_FLAG(int, channels, 4, "gRPC channels (TCP connections) the workers share (1 to 64)");
ABSL_FLAG(double, timeout_s, 60, "deadline of every call; a wait not answered by then fails the run");
ABSL_FLAG(bool, client_minimal_stack, true,
          "the simulated workers' channels leave out gRPC's client filters (retries, client-side deadline timers): "
          "the same calls on the wire for the coordinator, at half the tool's CPU");
ABSL_FLAG(double, max_seconds, 0, "exit 1 when first Register to last Barrier return takes longer (0: no bound)");

namespace stagehand {
namespace {

constexpr int kMaxWorkers = 20000;  // a typo must not take a shared machine down
constexpr char kJobId[] = "coordinator-load";
constexpr char kSecret[] = "coordinator-load-secret-0123456789abcdef";
constexpr char kUniqueIdKey[] = "unique_id";  // as the NCCL unique id is brokered: rank 0 sets, all read

enum Phase { kRegister, kSet, kGet, kBarrier, kPhases };
constexpr const char* kPhaseNames[kPhases] = {"register", "kv_set", "kv_get", "barrier"};

int64_t NowNanos() { return absl::GetCurrentTimeNanos(); }

// ---- The coordinator, in a child process -------------------------------------------------------

struct ProcStats {
  int64_t rss_kib = 0;
  int64_t hwm_kib = 0;
  double cpu_s = 0;
  int64_t heap_bytes = 0;  // from the child itself (mallinfo2)
};

ProcStats ReadProcStats(pid_t pid) {
  ProcStats s;
  if (FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/status").c_str(), "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), f)) {
      long v = 0;
      if (std::sscanf(line, "VmRSS: %ld kB", &v) == 1) s.rss_kib = v;
      if (std::sscanf(line, "VmHWM: %ld kB", &v) == 1) s.hwm_kib = v;
    }
    std::fclose(f);
  }
  if (FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r")) {
    char buf[1024] = {0};
    const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = 0;
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th of them.
    if (const char* p = std::strrchr(buf, ')')) {
      unsigned long utime = 0, stime = 0;
      if (std::sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &utime, &stime) == 2) {
        s.cpu_s = static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
      }
    }
  }
  return s;
}

double SelfCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}

// The heap bytes the process holds (glibc's arenas and mmap'd blocks), which unlike its RSS falls
// again when memory is freed: what the coordinator keeps per worker, apart from what calls in flight
// borrowed.
int64_t HeapInUse() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

// Runs in the child: serves a job of `workers` until the parent closes `control` (or dies). Each
// byte the parent writes on `control` is answered on `reply` with the heap in use.
[[noreturn]] void ServeCoordinator(int workers, int reply_fd, int control_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  JobSpec job;
  job.set_workers(workers);
  job.set_model("allreduce");  // needs no profile and no partition
  job.set_device("cpu");
  auto state = std::make_unique<CoordinatorState>(job, kJobId, kSecret);
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> server = CoordinatorServer::Start("127.0.0.1:0", state.get());
  std::string reply = server.ok() ? absl::StrCat("ok ", (*server)->address(), "\n")
                                  : absl::StrCat("error ", server.status().message(), "\n");
  if (write(reply_fd, reply.data(), reply.size()) < 0) _exit(1);
  char c;
  while (read(control_fd, &c, 1) > 0) {
    const std::string heap = absl::StrCat(HeapInUse(), "\n");
    if (write(reply_fd, heap.data(), heap.size()) < 0) _exit(1);
  }
  if (server.ok()) (*server)->Stop();
  _exit(0);
}

struct Child {
  pid_t pid = -1;
  int control_fd = -1;  // closing it ends the child
  int reply_fd = -1;
  std::string address;
};

// Reads one line from `fd` (the child's answers are short lines).
std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (read(fd, &c, 1) == 1 && c != '\n') line.push_back(c);
  return line;
}

int64_t ChildHeapInUse(const Child& child) {
  int64_t bytes = 0;
  if (write(child.control_fd, "m", 1) != 1 || !absl::SimpleAtoi(ReadLine(child.reply_fd), &bytes)) return -1;
  return bytes;
}

absl::StatusOr<Child> StartCoordinator(int workers) {
  int port_pipe[2], control_pipe[2];
  if (pipe(port_pipe) != 0 || pipe(control_pipe) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();  // before this process touches gRPC: nothing of it is shared
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    close(port_pipe[0]);
    close(control_pipe[1]);
    ServeCoordinator(workers, port_pipe[1], control_pipe[0]);
  }
  close(port_pipe[1]);
  close(control_pipe[0]);
  Child child{pid, control_pipe[1], port_pipe[0], ""};
  const std::string reply = ReadLine(child.reply_fd);
  if (reply.rfind("ok ", 0) != 0) {
    close(child.control_fd);
    close(child.reply_fd);
    waitpid(pid, nullptr, 0);
    return absl::UnavailableError(absl::StrCat("the coordinator did not start: ", reply));
  }
  child.address = reply.substr(3);
  return child;
}

// ---- The simulated workers ---------------------------------------------------------------------

struct PhaseStats {
  std::atomic<int64_t> first_start{INT64_MAX};
  std::atomic<int64_t> last_end{0};
  std::atomic<int64_t> calls{0};
  std::atomic<int64_t> failed{0};
  std::vector<int64_t> latency_ns;  // per call slot, written once each
};

void AtomicMin(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t cur = a.load(); v < cur && !a.compare_exchange_weak(cur, v);) {
  }
}
void AtomicMax(std::atomic<int64_t>& a, int64_t v) {
  for (int64_t cur = a.load(); v > cur && !a.compare_exchange_weak(cur, v);) {
  }
}

class Load {
 public:
  Load(int workers, const std::string& address, int channels, bool minimal_stack, absl::Duration timeout)
      : workers_(workers), timeout_(timeout), remaining_(workers), gets_left_(workers), get_failed_(workers) {
    for (int i = 0; i < channels; ++i) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one TCP connection per channel
      args.SetInt("stagehand.load_channel", i);
      if (minimal_stack) args.SetInt(GRPC_ARG_MINIMAL_STACK, 1);
      stubs_.push_back(
          Coordinator::NewStub(grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args)));
    }
    stats_[kRegister].latency_ns.resize(workers);
    stats_[kSet].latency_ns.resize(workers + 1);
    stats_[kGet].latency_ns.resize(2 * workers);
    stats_[kBarrier].latency_ns.resize(workers);
    for (int r = 0; r < workers; ++r) gets_left_[r].store(2);
  }

  // Starts every worker and waits for the last Barrier (or the first failure's end of all calls).
  void Run() {
    for (int r = 0; r < workers_; ++r) Register(r);
    done_.WaitForNotification();
  }

  const PhaseStats& stats(Phase p) const { return stats_[p]; }
  std::string first_error() {
    absl::MutexLock lock(&mu_);
    return first_error_;
  }

 private:
  // One RPC in flight: its context, request and response live until its completion.
  template <typename Request, typename Response>
  struct Call {
    grpc::ClientContext context;
    Request request;
    Response response;
  };

  Coordinator::Stub::async_interface* Stub(int rank) { return stubs_[rank % stubs_.size()]->async(); }

  template <typename C>
  std::unique_ptr<C> NewCall() {
    auto call = std::make_unique<C>();
    call->context.AddMetadata("authorization", absl::StrCat("Bearer ", kSecret));
    call->context.set_wait_for_ready(true);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    return call;
  }

  // Records a finished call of `phase` (slot: its latency's index); false when it failed (the
  // caller ends the worker's run).
  bool Finished(Phase phase, int slot, int64_t start, const grpc::Status& s, int rank) {
    const int64_t end = NowNanos();
    PhaseStats& p = stats_[phase];
    AtomicMin(p.first_start, start);
    AtomicMax(p.last_end, end);
    p.calls.fetch_add(1);
    p.latency_ns[slot] = end - start;
    if (s.ok()) return true;
    p.failed.fetch_add(1);
    {
      absl::MutexLock lock(&mu_);
      if (first_error_.empty()) {
        first_error_ = absl::StrCat(kPhaseNames[phase], " of rank ", rank, ": ", s.error_message());
      }
    }
    return false;
  }

  void WorkerDone() {
    if (remaining_.fetch_sub(1) == 1) done_.Notify();
  }

  void Register(int rank) {
    using C = Call<RegisterRequest, RegisterResponse>;
    std::shared_ptr<C> call = NewCall<C>();
    call->request.set_job_id(kJobId);
    call->request.set_worker_index(rank);
    call->request.set_incarnation(1);
    call->request.set_host(absl::StrCat("sim-", rank));
    call->request.set_pid(100000 + rank);
    call->request.mutable_device()->set_kind(DEVICE_KIND_CPU);
    call->request.mutable_device()->set_name("cpu");
    const int64_t start = NowNanos();
    Stub(rank)->Register(&call->context, &call->request, &call->response, [this, call, rank, start](grpc::Status s) {
      if (Finished(kRegister, rank, start, s, rank)) return Publish(rank);
      WorkerDone();
    });
  }

  // The worker's address; rank 0 also the unique id (after its address, so each Set is one call).
  void Publish(int rank) {
    Set(rank, rank, absl::StrCat("addr/", rank), absl::StrCat("198.18.0.", 1 + rank % 250, ":", 30000 + rank),
        [this, rank] {
          if (rank != 0) return Lookup(rank);
          Set(rank, workers_, kUniqueIdKey, std::string(128, 'u'), [this, rank] { Lookup(rank); });
        });
  }

  void Set(int rank, int slot, const std::string& key, const std::string& value, std::function<void()> next) {
    using C = Call<KeyValueSetRequest, KeyValueSetResponse>;
    std::shared_ptr<C> call = NewCall<C>();
    call->request.set_key(key);
    call->request.set_value(value);
    call->request.set_rank(rank);
    call->request.set_incarnation(1);
    const int64_t start = NowNanos();
    Stub(rank)->KeyValueSet(&call->context, &call->request, &call->response,
                            [this, call, rank, slot, start, next = std::move(next)](grpc::Status s) {
                              if (Finished(kSet, slot, start, s, rank)) return next();
                              WorkerDone();
                            });
  }

  // The right neighbour's address and the unique id, in parallel; the second answer goes on.
  void Lookup(int rank) {
    Get(rank, 2 * rank, absl::StrCat("addr/", (rank + 1) % workers_));
    Get(rank, 2 * rank + 1, kUniqueIdKey);
  }

  void Get(int rank, int slot, const std::string& key) {
    using C = Call<KeyValueGetRequest, KeyValueGetResponse>;
    std::shared_ptr<C> call = NewCall<C>();
    call->request.set_key(key);
    call->request.set_timeout_ms(absl::ToInt64Milliseconds(timeout_));
    const int64_t start = NowNanos();
    Stub(rank)->KeyValueGet(&call->context, &call->request, &call->response,
                            [this, call, rank, slot, start](grpc::Status s) {
                              if (s.ok() && call->response.value().empty()) {
                                s = grpc::Status(grpc::StatusCode::INTERNAL, "empty value");
                              }
                              if (!Finished(kGet, slot, start, s, rank)) get_failed_[rank].store(true);
                              if (gets_left_[rank].fetch_sub(1) != 1) return;  // the other is out
                              if (get_failed_[rank].load()) return WorkerDone();
                              Barrier(rank);
                            });
  }

  void Barrier(int rank) {
    using C = Call<BarrierRequest, BarrierResponse>;
    std::shared_ptr<C> call = NewCall<C>();
    call->request.set_barrier_id("load");
    call->request.set_rank(rank);
    call->request.set_incarnation(1);
    call->request.set_timeout_ms(absl::ToInt64Milliseconds(timeout_));
    const int64_t start = NowNanos();
    Stub(rank)->Barrier(&call->context, &call->request, &call->response, [this, call, rank, start](grpc::Status s) {
      Finished(kBarrier, rank, start, s, rank);
      WorkerDone();
    });
  }

  const int workers_;
  const absl::Duration timeout_;
  std::vector<std::unique_ptr<Coordinator::Stub>> stubs_;
  PhaseStats stats_[kPhases];
  std::atomic<int> remaining_;
  std::vector<std::atomic<int>> gets_left_;  // per rank: Gets not yet answered
  std::vector<std::atomic<bool>> get_failed_;
  absl::Notification done_;
  absl::Mutex mu_;
  std::string first_error_ ABSL_GUARDED_BY(mu_);
};

// ---- The report --------------------------------------------------------------------------------

double Percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0;
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + i, v.end());
  return v[i] / 1e6;
}

// Returns the wall time in seconds, first Register to last Barrier return.
double PrintReport(const Load& load, int workers, int channels, pid_t coordinator, const ProcStats& before,
                   const ProcStats& after, double tool_cpu_s) {
  const int64_t t0 = load.stats(kRegister).first_start.load();
  const int64_t t1 = load.stats(kBarrier).last_end.load();
  std::printf("# coordinator_load: %d workers over %d channels%s; the coordinator is pid %d\n", workers, channels,
              absl::GetFlag(FLAGS_client_minimal_stack) ? " (minimal client stack)" : "",
              static_cast<int>(coordinator));
  std::printf("#%-9s %8s %8s %10s %10s %10s %9s %9s\n", "phase", "rpcs", "#failed", "start_ms", "end_ms", "span_ms",
              "p50_ms", "p99_ms");
  int64_t rpcs = 0, failed = 0;
  for (int p = 0; p < kPhases; ++p) {
    const PhaseStats& s = load.stats(static_cast<Phase>(p));
    const int64_t calls = s.calls.load();
    rpcs += calls;
    failed += s.failed.load();
    const double start = calls ? (s.first_start.load() - t0) / 1e6 : 0;
    const double end = calls ? (s.last_end.load() - t0) / 1e6 : 0;
    std::vector<int64_t> lat(s.latency_ns.begin(), s.latency_ns.end());
    lat.erase(std::remove(lat.begin(), lat.end(), 0), lat.end());
    std::printf(" %-9s %8ld %8ld %10.1f %10.1f %10.1f %9.1f %9.1f\n", kPhaseNames[p], static_cast<long>(calls),
                static_cast<long>(s.failed.load()), start, end, end - start, Percentile(lat, 0.5),
                Percentile(lat, 0.99));
  }
  const double wall = t1 > t0 ? (t1 - t0) / 1e9 : 0;
  std::printf("# total: %ld RPCs, %ld failed, in %.3f s (first Register to last Barrier return): %.0f RPCs/s\n",
              static_cast<long>(rpcs), static_cast<long>(failed), wall, wall > 0 ? rpcs / wall : 0);
  std::printf("# coordinator: heap in use %.1f MiB before, %.1f MiB after: %.2f KiB per worker kept\n",
              before.heap_bytes / 1048576.0, after.heap_bytes / 1048576.0,
              (after.heap_bytes - before.heap_bytes) / 1024.0 / workers);
  std::printf(
      "# coordinator: RSS %.1f MiB before, %.1f MiB after, peak %.1f MiB: %.2f KiB per worker at the "
      "peak (%d calls in flight); CPU %.2f s\n",
      before.rss_kib / 1024.0, after.rss_kib / 1024.0, after.hwm_kib / 1024.0,
      (after.hwm_kib - before.rss_kib) / static_cast<double>(workers), workers, after.cpu_s - before.cpu_s);
  std::printf("# the simulated workers (this process): CPU %.2f s\n", tool_cpu_s);
  return wall;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "coordinator_load --workers=N: N simulated workers register, publish and read keys, and pass a barrier "
      "against a real coordinator over gRPC; prints per-phase times, RPCs/s and the coordinator's memory");
  absl::ParseCommandLine(argc, argv);
  // Debian's abseil is built with the mutex deadlock detector on: it keeps a global lock graph that
  // every absl::Mutex of gRPC updates, the largest single cost in a profile of 10,000 workers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const int workers = absl::GetFlag(FLAGS_workers);
  const int channels = absl::GetFlag(FLAGS_channels);
  if (workers < 1 || workers > kMaxWorkers) {
    std::fprintf(stderr, "coordinator_load: --workers=%d: pass 1 to %d\n", workers, kMaxWorkers);
    return 2;
  }
  if (channels < 1 || channels > 64) {
    std::fprintf(stderr, "coordinator_load: --channels=%d: pass 1 to 64\n", channels);
    return 2;
  }
  // A few descriptors per channel on each side, not one per worker.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < static_cast<rlim_t>(4 * channels + 64)) {
    std::fprintf(stderr, "coordinator_load: ulimit -n is %lu; %d channels need %d: raise it or pass fewer\n",
                 static_cast<unsigned long>(nofile.rlim_cur), channels, 4 * channels + 64);
    return 2;
  }
  absl::StatusOr<Child> child = StartCoordinator(workers);
  if (!child.ok()) {
    std::fprintf(stderr, "coordinator_load: %s\n", std::string(child.status().message()).c_str());
    return 1;
  }
  ProcStats before = ReadProcStats(child->pid);
  before.heap_bytes = ChildHeapInUse(*child);
  double wall = 0;
  std::string error;
  {
    Load load(workers, child->address, channels, absl::GetFlag(FLAGS_client_minimal_stack),
              absl::Seconds(absl::GetFlag(FLAGS_timeout_s)));
    const double cpu_before = SelfCpuSeconds();
    load.Run();
    const double tool_cpu = SelfCpuSeconds() - cpu_before;
    ProcStats after = ReadProcStats(child->pid);
    after.heap_bytes = ChildHeapInUse(*child);
    wall = PrintReport(load, workers, channels, child->pid, before, after, tool_cpu);
    error = load.first_error();
  }
  close(child->control_fd);
  close(child->reply_fd);
  int status = 0;
  waitpid(child->pid, &status, 0);
  if (!error.empty()) {
    std::printf("# FAILED: %s\n", error.c_str());
    return 1;
  }
  const double bound = absl::GetFlag(FLAGS_max_seconds);
  if (bound > 0 && wall > bound) {
    std::printf("# FAILED: %.3f s is over --max_seconds=%g\n", wall, bound);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace stagehand

int main(int argc, char** argv) { return stagehand::Main(argc, argv); }
