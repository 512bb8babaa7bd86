// libFuzzer target for the coordinator's state machine (launcher/coordinator/coordinator.h), one Coordinator request
// kind per run: STAGEHAND_FUZZ_TARGET names it (Register, KeyValueSet, KeyValueGet, Barrier, Heartbeat,
// ReportMilestone, ReportStep, Finish, WaitForStop). An input is a sequence of requests of that kind,
// each a 2-byte little-endian length and the serialized proto (what the gRPC adapter would hand the
// state), applied to a 3-worker job whose rank 0 has registered. Waits get deadlines that have already
// passed, so no input can block. After every request the state's invariants are checked: every step
// recorded once per (rank, incarnation, step), three worker slots, a stopped job stays stopped.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <tuple>

#include "absl/time/clock.h"
#include "google/protobuf/stubs/logging.h"
#include "launcher/coordinator/coordinator.h"
#include "protos/coordinator.pb.h"

namespace stagehand {
namespace {

enum class Rpc { kRegister, kKeyValueSet, kKeyValueGet, kBarrier, kHeartbeat, kMilestone, kStep, kFinish, kStop };

Rpc Target() {
  static const Rpc rpc = [] {
    const char* name = std::getenv("STAGEHAND_FUZZ_TARGET");
    const std::string n = name ? name : "";
    if (n == "Register") return Rpc::kRegister;
    if (n == "KeyValueSet") return Rpc::kKeyValueSet;
    if (n == "KeyValueGet") return Rpc::kKeyValueGet;
    if (n == "Barrier") return Rpc::kBarrier;
    if (n == "Heartbeat") return Rpc::kHeartbeat;
    if (n == "ReportMilestone") return Rpc::kMilestone;
    if (n == "ReportStep") return Rpc::kStep;
    if (n == "Finish") return Rpc::kFinish;
    if (n == "WaitForStop") return Rpc::kStop;
    std::fprintf(stderr, "coordinator_fuzz: set STAGEHAND_FUZZ_TARGET to a Coordinator request (Register, ...)\n");
    std::abort();
  }();
  return rpc;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "coordinator_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request& r) {
  return r.ParseFromArray(data, static_cast<int>(size));
}

void Apply(CoordinatorState& state, const uint8_t* data, size_t size) {
  const absl::Time past = absl::Now() - absl::Seconds(1);
  switch (Target()) {
    case Rpc::kRegister: {
      RegisterRequest r;
      if (Parse(data, size, r)) state.RegisterAsync(r, past, [](absl::StatusOr<Assignment>) {});
      break;
    }
    case Rpc::kKeyValueSet: {
      KeyValueSetRequest r;
      if (Parse(data, size, r)) (void)state.KeyValueSet(r.rank(), r.incarnation(), r.key(), r.value());
      break;
    }
    case Rpc::kKeyValueGet: {
      KeyValueGetRequest r;
      if (Parse(data, size, r)) state.KeyValueGetAsync(r.key(), past, [](absl::StatusOr<std::string>) {});
      break;
    }
    case Rpc::kBarrier: {
      BarrierRequest r;
      if (Parse(data, size, r))
        state.BarrierAsync(r.barrier_id(), r.rank(), r.incarnation(), past, [](absl::Status) {});
      break;
    }
    case Rpc::kHeartbeat: {
      HeartbeatRequest r;
      if (Parse(data, size, r)) (void)state.Heartbeat(r);
      break;
    }
    case Rpc::kMilestone: {
      ReportMilestoneRequest r;
      if (Parse(data, size, r)) (void)state.ReportMilestone(r);
      break;
    }
    case Rpc::kStep: {
      ReportStepRequest r;
      if (Parse(data, size, r)) (void)state.ReportStep(r);
      break;
    }
    case Rpc::kFinish: {
      FinishRequest r;
      if (Parse(data, size, r)) (void)state.Finish(r);
      break;
    }
    case Rpc::kStop: {
      WaitForStopRequest r;
      if (Parse(data, size, r)) {
        state.WaitForStopAsync(r.rank(), r.incarnation(), past, [](absl::StatusOr<WaitForStopResponse>) {});
      }
      break;
    }
  }
}

void CheckInvariants(const CoordinatorState& state, bool was_stopping) {
  Check(state.Workers().size() == 3, "the job keeps its three worker slots");
  std::set<std::tuple<int, int64_t, int64_t>> seen;
  for (const ReportStepRequest& r : state.Steps()) {
    Check(seen.insert({r.rank(), r.incarnation(), r.step()}).second, "a step is recorded once");
    Check(r.rank() >= 0 && r.rank() < 3, "a recorded step has a rank of the job");
  }
  Check(!was_stopping || state.stopping(), "a stopped job stays stopped");
}

}  // namespace
}  // namespace stagehand

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Invalid UTF-8 in string fields is what fuzzing sends; protobuf's parser refuses it with a log line.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace stagehand;
  JobSpec job;
  job.set_workers(3);
  job.set_model("allreduce");
  CoordinatorState state(job, "fuzzjob", "secret");
  RegisterRequest zero;
  zero.set_job_id("fuzzjob");
  zero.set_worker_index(0);
  zero.set_incarnation(1);
  zero.set_pid(100);
  state.RegisterAsync(zero, absl::Now() - absl::Seconds(1), [](absl::StatusOr<Assignment>) {});
  while (size >= 2) {
    const size_t n = std::min<size_t>(data[0] | (data[1] << 8), size - 2);
    const bool was_stopping = state.stopping();
    Apply(state, data + 2, n);
    CheckInvariants(state, was_stopping);
    data += 2 + n;
    size -= 2 + n;
  }
  return 0;
}
