// The step timer (see step_timer.h). LibTorch translation unit.
#include "engine/step_timer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace stagehand {

at::cuda::CUDAStream CommStream() {
  static const at::cuda::CUDAStream stream = at::cuda::getStreamFromPool(/*isHighPriority=*/true, 0);
  return stream;
}

StepTiming StepTimer::Finish(int rank, int64_t step, double step_ms) const {
  StepTiming t;
  t.set_rank(rank);
  t.set_step(step);
  t.set_step_ms(step_ms);
  t.set_start_unix_micros(start_unix_micros_);
  if (!enabled_) return t;
  auto add = [&](const std::string& name, const std::string& kind, double start, double end, int64_t bytes) {
    if (end - start <= 0) return;
    ActionTiming* a = t.add_actions();
    a->set_name(name);
    a->set_kind(kind);
    a->set_start_ms(start);
    a->set_duration_ms(end - start);
    a->set_bytes(bytes);
    if (kind == "forward") t.set_forward_ms(t.forward_ms() + end - start);
    if (kind == "backward") t.set_backward_ms(t.backward_ms() + end - start);
    if (kind == "optimizer") t.set_optimizer_ms(t.optimizer_ms() + end - start);
    if (kind == "wait" || kind == "send" || kind == "recv") t.set_wait_ms(t.wait_ms() + end - start);
  };
  // On the CPU communication blocks the one thread, so it is part of the rank's sequence of slices;
  // on a GPU it runs beside compute and shows only as the waits it causes.
  std::vector<const Entry*> track;
  for (const Entry& e : entries_) track.push_back(&e);
  if (!streams_->cuda()) {
    for (const Entry& e : comm_) track.push_back(&e);
    std::sort(track.begin(), track.end(), [](const Entry* a, const Entry* b) { return a->start.host < b->start.host; });
  }
  double prev = 0;
  for (const Entry* e : track) {
    const double start = std::max(prev, Ms(e->start)), end = std::max(start, Ms(e->end));
    add(e->waited_for.empty() ? "idle" : "wait " + e->waited_for, e->waited_for.empty() ? "idle" : "wait", prev, start,
        0);
    add(e->name, e->kind, start, end, e->bytes);
    prev = end;
  }
  int64_t bytes = 0;
  double comm_ms = 0;
  for (const Entry& e : comm_) {
    bytes += e.bytes;
    comm_ms += std::max(0.0, Ms(e.end) - Ms(e.start));
  }
  t.set_comm_bytes(bytes);
  t.set_comm_ms(comm_ms);
  t.set_idle_ms(std::max(0.0, step_ms - t.forward_ms() - t.backward_ms() - t.optimizer_ms() - t.wait_ms()));
  return t;
}

}  // namespace stagehand
