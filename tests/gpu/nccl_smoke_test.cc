// GPU smoke test (tag gpu; runs on a GPU host through the bundle): an NCCL all-reduce across every
// visible GPU on LibTorch tensors, and a LibTorch matmul on each GPU, both checked against values
// computed independently on the CPU.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <nccl.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "gtest/gtest.h"

#define ASSERT_NCCL_OK(call)                                               \
  do {                                                                     \
    ncclResult_t r_ = (call);                                              \
    ASSERT_EQ(r_, ncclSuccess) << #call << ": " << ncclGetErrorString(r_); \
  } while (0)

namespace {

int DeviceCount() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

TEST(GpuSmoke, Matmul_EachGpu_MatchesCpuDouble) {
  const int n = DeviceCount();
  ASSERT_GE(n, 1) << "no GPU visible";
  torch::manual_seed(1);
  auto a = torch::randn({512, 384}, torch::kFloat64);
  auto b = torch::randn({384, 256}, torch::kFloat64);
  auto expected = torch::matmul(a, b);
  for (int d = 0; d < n; ++d) {
    auto dev = torch::Device(torch::kCUDA, d);
    auto got = torch::matmul(a.to(dev, torch::kFloat32), b.to(dev, torch::kFloat32)).to(torch::kCPU, torch::kFloat64);
    EXPECT_TRUE(torch::allclose(got, expected, 1e-3, 1e-3))
        << "GPU " << d << " max error " << (got - expected).abs().max().item<double>();
  }
}

TEST(GpuSmoke, NcclAllReduce_AllGpus_SumIsExact) {
  const int n = DeviceCount();
  ASSERT_GE(n, 1) << "no GPU visible";
  int version = 0;
  ASSERT_NCCL_OK(ncclGetVersion(&version));
  std::printf("NCCL %d, %d GPU(s)\n", version, n);
  std::vector<ncclComm_t> comms(n);
  std::vector<int> devs(n);
  for (int d = 0; d < n; ++d) devs[d] = d;
  ASSERT_NCCL_OK(ncclCommInitAll(comms.data(), n, devs.data()));

  for (int64_t elements : {int64_t{1} << 10, int64_t{1} << 27}) {  // 4 KiB and 512 MiB of fp32
    std::vector<torch::Tensor> bufs;
    for (int d = 0; d < n; ++d) {
      // Rank d holds d+1 everywhere, plus a ramp so that misplaced elements are caught.
      auto dev = torch::Device(torch::kCUDA, d);
      bufs.push_back(
          torch::arange(elements, torch::TensorOptions().dtype(torch::kFloat32).device(dev)).remainder(1024) + (d + 1));
    }
    for (int d = 0; d < n; ++d) at::cuda::getCurrentCUDAStream(d).synchronize();
    auto t0 = std::chrono::steady_clock::now();
    ASSERT_NCCL_OK(ncclGroupStart());
    for (int d = 0; d < n; ++d) {
      ASSERT_NCCL_OK(ncclAllReduce(bufs[d].data_ptr(), bufs[d].data_ptr(), elements, ncclFloat32, ncclSum, comms[d],
                                   at::cuda::getCurrentCUDAStream(d).stream()));
    }
    ASSERT_NCCL_OK(ncclGroupEnd());
    for (int d = 0; d < n; ++d) at::cuda::getCurrentCUDAStream(d).synchronize();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto ramp = torch::arange(elements, torch::kFloat32).remainder(1024);
    auto expected = ramp * n + n * (n + 1) / 2.0;
    for (int d = 0; d < n; ++d) {
      EXPECT_TRUE(torch::equal(bufs[d].cpu(), expected)) << "GPU " << d << ", " << elements << " elements";
    }
    double bytes = elements * 4.0;
    std::printf("all-reduce %10lld bytes  %9.3f ms  algbw %7.1f GB/s  busbw %7.1f GB/s (first call, includes setup)\n",
                static_cast<long long>(bytes), secs * 1e3, bytes / secs / 1e9, bytes / secs / 1e9 * 2.0 * (n - 1) / n);
  }
  for (auto c : comms) ASSERT_NCCL_OK(ncclCommDestroy(c));
}

}  // namespace
