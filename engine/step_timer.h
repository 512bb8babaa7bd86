// How a pipeline rank uses its GPU's streams (compute beside communication, ordered by events; no-ops
// on the CPU), and the timer that turns a step's actions into non-overlapping slices for reports and
// traces (CUDA events on GPUs, the host clock on the CPU). LibTorch.
#ifndef STAGEHAND_ENGINE_STEP_TIMER_H_
#define STAGEHAND_ENGINE_STEP_TIMER_H_

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "protos/job.pb.h"
#include "schedule/schedule.h"

namespace stagehand {

// The one communication stream of this process: the NCCL transport is made with it (worker main), and
// the executor orders its compute against it.
at::cuda::CUDAStream CommStream();

// Orders work between the compute stream and the communication stream on a GPU; no-ops on the CPU,
// where every transport call is complete when it returns.
class Streams {
 public:
  explicit Streams(bool cuda) {
    if (!cuda) return;
    compute_.emplace(at::cuda::getStreamFromPool(/*isHighPriority=*/false, 0));
    comm_.emplace(CommStream());
  }
  bool cuda() const { return compute_.has_value(); }
  const at::cuda::CUDAStream& compute() const { return *compute_; }
  const at::cuda::CUDAStream& comm() const { return *comm_; }
  // The communication stream waits for what the compute stream has enqueued so far.
  void CommAfterCompute() {
    if (!cuda()) return;
    at::cuda::CUDAEvent e;
    e.record(*compute_);
    e.block(*comm_);
  }
  // An event on the communication stream, for the compute stream to wait on later.
  std::shared_ptr<at::cuda::CUDAEvent> MarkComm() {
    if (!cuda()) return nullptr;
    auto e = std::make_shared<at::cuda::CUDAEvent>();
    e->record(*comm_);
    return e;
  }
  void ComputeAfter(const std::shared_ptr<at::cuda::CUDAEvent>& e) {
    if (cuda() && e) e->block(*compute_);
  }
  // A tensor the communication stream reads must not be reused by the allocator before it is done.
  void KeepForComm(const torch::Tensor& t) {
    if (cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *comm_);
  }
  void Synchronize() {
    if (!cuda()) return;
    compute_->synchronize();
    comm_->synchronize();
  }

 private:
  std::optional<at::cuda::CUDAStream> compute_, comm_;
};

// Times a step's actions: CUDA events on the compute and communication streams on a GPU (read once
// the step has synchronised), the host clock on the CPU. Builds the rank's non-overlapping slices:
// each compute action, and before it the time its stream waited for a receive ("wait") or sat idle.
class StepTimer {
 public:
  StepTimer(bool enabled, Streams* streams) : enabled_(enabled), streams_(streams) {}

  void BeginStep() {
    if (!enabled_) return;
    entries_.clear();
    comm_.clear();
    host_start_ = Clock::now();
    start_unix_micros_ = absl::ToUnixMicros(absl::Now());
    if (streams_->cuda()) step_start_ = Record(streams_->compute());
  }
  // Brackets a compute action; `waited_for` names the receive its stream had to wait for, if any.
  void StartCompute() {
    if (!enabled_) return;
    pending_ = Mark(streams_->cuda() ? &streams_->compute() : nullptr);
  }
  void EndCompute(const Action& a, std::string waited_for) {
    if (!enabled_) return;
    entries_.push_back({ToString(a), Kind(a.kind), pending_, Mark(streams_->cuda() ? &streams_->compute() : nullptr),
                        std::move(waited_for), 0});
  }
  // Brackets a send/receive group (on the communication stream on a GPU).
  void StartComm() {
    if (!enabled_) return;
    pending_ = Mark(streams_->cuda() ? &streams_->comm() : nullptr);
  }
  void EndComm(const std::vector<Action>& group, int64_t bytes) {
    if (!enabled_) return;
    std::string name;
    for (const Action& a : group) absl::StrAppend(&name, name.empty() ? "" : " ", ToString(a));
    const bool send = group[0].kind == ActionKind::kSendForward || group[0].kind == ActionKind::kSendBackward;
    comm_.push_back(
        {name, send ? "send" : "recv", pending_, Mark(streams_->cuda() ? &streams_->comm() : nullptr), "", bytes});
  }
  // After the step's streams have synchronised.
  StepTiming Finish(int rank, int64_t step, double step_ms) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Mark_ {
    std::shared_ptr<at::cuda::CUDAEvent> event;
    Clock::time_point host;
  };
  struct Entry {
    std::string name, kind;
    Mark_ start, end;
    std::string waited_for;
    int64_t bytes;
  };
  static std::string Kind(ActionKind k) {
    switch (k) {
      case ActionKind::kForward:
        return "forward";
      case ActionKind::kOptimizerStep:
        return "optimizer";
      default:
        return "backward";
    }
  }
  static std::shared_ptr<at::cuda::CUDAEvent> Record(const at::cuda::CUDAStream& stream) {
    auto e = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // timing enabled
    e->record(stream);
    return e;
  }
  Mark_ Mark(const at::cuda::CUDAStream* stream) const { return {stream ? Record(*stream) : nullptr, Clock::now()}; }
  double Ms(const Mark_& m) const {  // since the step's start
    if (m.event) return step_start_->elapsed_time(*m.event);
    return std::chrono::duration<double, std::milli>(m.host - host_start_).count();
  }

  const bool enabled_;
  Streams* streams_;
  Clock::time_point host_start_;
  int64_t start_unix_micros_ = 0;
  std::shared_ptr<at::cuda::CUDAEvent> step_start_;
  Mark_ pending_;
  std::vector<Entry> entries_, comm_;
};

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_STEP_TIMER_H_
