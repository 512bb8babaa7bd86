// cuDNN's attention kernels built ahead of step 0, beside the rest of a worker's startup.
//
// cuDNN's fused attention (--attention=cudnn, the default) generates its kernels at run time: NVRTC
// compiles them, and the CUDA driver compiles that PTX to machine code, kept in its JIT cache
// (~/.nv/ComputeCache, or CUDA_CACHE_PATH). On a machine whose cache does not have them yet (a fresh
// machine, a new driver) that took about 1.3 s of gpt-1.3b's first forward and 1.1 s of its first
// backward on an H200, inside step 0 (docs/cold_start.md). The driver compiles on several threads at
// once, so AttentionPrebuild runs each kernel's first call on a thread of its own as soon as CUDA is up:
// the forward, and for training the backward, called directly on synthetic tensors (batch 1, zeros:
// the kernels do not depend on the batch) so that it does not wait for the forward. Step 0 then finds
// the machine code in the driver's cache; cuDNN's own plans are per thread and are built again there,
// as on any launch. On an H200 it took gpt-1.3b's step 0 from 2.0-2.1 s to 0.75 s on an empty JIT
// cache, and launch to first step from 2.6-3.1 s to 2.3-2.6 s: the worker is ready for step 0 about
// 0.1 s after CUDA is up, so it mostly waits for the threads (bench/results/attention-prebuild-h200-2026-12-03.md).
// Where the cache already has the kernels, the worker waited 0.1-0.15 s for them (plans built twice).
#ifndef STAGEHAND_WORKER_ATTENTION_PREBUILD_H_
#define STAGEHAND_WORKER_ATTENTION_PREBUILD_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "models/model_family.h"

namespace stagehand {

class AttentionPrebuild {
 public:
  // Starts a thread per kernel on CUDA device `device`: for each distinct call, its forward (with the
  // logsumexp the backward needs when `backward`, else the inference variant) and, when `backward`,
  // its backward. Nothing starts for no calls. The threads use streams of their own and never fail the
  // job: a call cuDNN refuses (an older GPU, sizes it does not take) is reported by Finish.
  static std::unique_ptr<AttentionPrebuild> Start(std::vector<AttentionCall> calls, bool backward, int device);

  // Waits for the threads, returns the memory they used to the device (the caching allocator's free
  // blocks, so that the run's peak is its own), and returns one line for the log: what was built, in
  // how long, and what failed. Later calls return "" at once. Call it before any CUDA-graph capture
  // (a capture in global mode must not see another thread's allocations).
  std::string Finish();
  ~AttentionPrebuild();

  AttentionPrebuild(const AttentionPrebuild&) = delete;
  AttentionPrebuild& operator=(const AttentionPrebuild&) = delete;

 private:
  struct Kernel {
    std::string name;  // "forward heads=16 kv=16 d=128 s=1024"
    double ms = 0;
    std::string error;
  };
  AttentionPrebuild() = default;

  absl::Time start_;
  std::vector<Kernel> kernels_;  // one per thread, each written by its thread only
  std::vector<std::thread> threads_;
  bool finished_ = false;
};

// The distinct calls of `calls`, in order.
std::vector<AttentionCall> DistinctAttentionCalls(const std::vector<AttentionCall>& calls);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_ATTENTION_PREBUILD_H_
