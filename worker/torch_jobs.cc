// LibTorch work of the worker (see torch_jobs.h). c10::Error never leaves this file: it becomes a Status.
#include "worker/torch_jobs.h"

#include <ATen/cuda/CUDAContext.h>
#include <torch/torch.h>

#include <chrono>

#include "absl/strings/str_cat.h"

namespace stagehand {

void* CurrentCudaStream() { return at::cuda::getCurrentCUDAStream(0).stream(); }

namespace {

absl::Status CheckSum(const torch::Tensor& got, const torch::Tensor& ramp, int world, int64_t step) {
  // sum over r of (ramp + r + 1 + step) = world * (ramp + step) + world * (world + 1) / 2
  auto expected = ramp * world + (world * step + world * (world + 1) / 2);
  auto wrong = (got != expected).nonzero();
  if (wrong.size(0) == 0) return absl::OkStatus();
  int64_t i = wrong[0][0].item<int64_t>();
  return absl::DataLossError(absl::StrCat("all-reduce result wrong at step ", step, ": element ", i, " is ",
                                          got[i].item<double>(), ", expected ", expected[i].item<double>(), " (",
                                          wrong.size(0), " wrong elements)"));
}

absl::Status RunSteps(const Assignment& a, Transport& transport, const StepCallback& on_step) {
  const JobSpec& job = a.job();
  const bool cuda = job.device() == "cuda";
  auto options = torch::TensorOptions().dtype(torch::kFloat32).device(cuda ? torch::kCUDA : torch::kCPU, 0);
  // Values stay small integers, so float32 sums are exact and the check can demand equality.
  auto ramp = torch::arange(job.tensor_elements(), options).remainder(1024);
  auto ramp_cpu = ramp.cpu();
  auto buf = torch::empty_like(ramp);
  for (int64_t step = 0; step < job.steps(); ++step) {
    auto t0 = std::chrono::steady_clock::now();
    buf.copy_(ramp).add_(a.rank() + 1 + step);
    if (absl::Status s = transport.AllReduceSum(buf.data_ptr(), buf.numel(), DType::kFloat32); !s.ok()) return s;
    auto got = buf.cpu();  // waits for the collective on the current stream
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (absl::Status s = CheckSum(got, ramp_cpu, a.world_size(), step); !s.ok()) return s;
    if (absl::Status s = on_step(step, secs); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RunAllReduceJob(const Assignment& a, Transport& transport, const StepCallback& on_step) {
  try {
    return RunSteps(a, transport, on_step);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace stagehand
