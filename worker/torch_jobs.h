// The checked all-reduce job of a worker (--model=allreduce): a collective per step on a tensor whose
// exact result every rank checks. A translation unit of its own (LibTorch headers are heavy to compile).
#ifndef STAGEHAND_WORKER_TORCH_JOBS_H_
#define STAGEHAND_WORKER_TORCH_JOBS_H_

#include <functional>

#include "absl/status/status.h"
#include "protos/job.pb.h"
#include "transport/transport.h"

namespace stagehand {

// The cudaStream_t LibTorch uses on device 0, for transports that must order with its kernels.
void* CurrentCudaStream();

// Called after every step with its index and duration; a non-OK status stops the job.
using StepCallback = std::function<absl::Status(int64_t step, double seconds)>;

// Each step: rank r fills a tensor with (r + 1 + step) plus a ramp, all-reduces it, and checks every
// element against the exact sum. Fails with DATA_LOSS naming the first wrong element.
absl::Status RunAllReduceJob(const Assignment& assignment, Transport& transport, const StepCallback& on_step);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_TORCH_JOBS_H_
