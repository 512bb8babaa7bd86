// See gemm_residual.h. As in gemm_gelu.cu, the row-major d[m, n] = x[m, k] W[n, k]^T is, read column-major,
// d^T = W x^T with both operands K-major: CUTLASS's M is our n, its N our m, the bias per row of its
// output, and c and d are [n, m] column-major. Compiled for sm_90a only.
#include "worker/gemm_residual.h"

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"

namespace stagehand {
namespace {

using namespace cute;
using Bf16 = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // W [n, k]: K-major
using LayoutB = cutlass::layout::ColumnMajor;  // x^T [k, m] with x row-major: K-major
using LayoutD = cutlass::layout::ColumnMajor;  // c^T, d^T [n, m] column-major = [m, n] row-major
constexpr int kAlignAB = 8;                    // bf16 elements in 16 bytes
constexpr int kAlignCD = 4;                    // fp32 elements in 16 bytes

template <class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule>
struct Config {
  // d = alpha * acc + beta * c + bias (per row of CUTLASS's output: per column of ours), all in fp32.
  using Fusion = cutlass::epilogue::fusion::LinCombPerRowBias<float, float, float, float>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, float, LayoutD, kAlignCD, float, LayoutD,
      kAlignCD, EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, kAlignAB, Bf16, LayoutB, kAlignAB, float,
      Tile, Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

int SmCount() {
  int device = 0, sms = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) return 132;
  return sms;
}

template <class C>
cudaError_t Run(const uint16_t* x, const uint16_t* w, const float* bias, const float* c, float* d, int m, int n,
                int k, int swizzle, cudaStream_t stream) {
  using Gemm = typename C::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  static const int sms = SmCount();
  const StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(n, k, 1));
  const StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(m, k, 1));
  const StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, make_shape(n, m, 1));
  const StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(n, m, 1));
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {n, m, k, 1},
                                {reinterpret_cast<const Bf16*>(w), sa, reinterpret_cast<const Bf16*>(x), sb},
                                {{}, c, sc, d, sd}};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.f;
  fusion.beta = 1.f;
  fusion.bias_ptr = bias;  // null: a zero bias (the broadcast's null default)
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return cudaErrorInvalidDevice;
  args.hw_info.device_id = device;
  args.hw_info.sm_count = sms;
  args.scheduler.max_swizzle_size = swizzle;
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  // These schedules need no workspace (as in gemm_gelu.cu: one that did is refused, not improvised).
  if (Gemm::get_workspace_size(args) != 0) return cudaErrorNotSupported;
  if (gemm.initialize(args, nullptr, stream) != cutlass::Status::kSuccess) return cudaErrorInvalidValue;
  if (gemm.run(stream) != cutlass::Status::kSuccess) {
    const cudaError_t e = cudaGetLastError();
    return e != cudaSuccess ? e : cudaErrorLaunchFailure;
  }
  return cudaGetLastError();
}

using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingpongEpilogue = cutlass::epilogue::TmaWarpSpecialized;

template <class Tile, class Cluster>
using PingpongConfig = Config<Tile, Cluster, Pingpong, PingpongEpilogue>;
template <class Tile, class Cluster>
using CooperativeConfig = Config<Tile, Cluster, Cooperative, CooperativeEpilogue>;

// Variant 0, the model's: by the depth of the product. A short K (gpt-1.3b's proj, k = 2048) leaves the
// fp32 epilogue (read c, write d: 8 bytes an element) a large part of each tile's time, which ping-pong
// hides behind the other warp group's MMAs; a long K (fc2, k = 8192) amortises it, and the cooperative
// 128x256 tile's lower operand traffic per FLOP wins (worker:residual_gemm_bench on an H200 under its
// power limit, bench/results/2026-12-02-one-gpu-speed-6.md).
constexpr int64_t kPingpongMaxK = 4096;

// STAGEHAND_GEMM_RESIDUAL_VARIANT=1|2 (a developer's switch for A/B runs of whole jobs, read once): that
// schedule for every shape in place of the rule.
int VariantOverride() {
  static const int v = [] {
    const char* e = std::getenv("STAGEHAND_GEMM_RESIDUAL_VARIANT");
    return e != nullptr && (std::strcmp(e, "1") == 0 || std::strcmp(e, "2") == 0) ? std::atoi(e) : 0;
  }();
  return v;
}

cudaError_t Dispatch(int variant, const uint16_t* x, const uint16_t* w, const float* bias, const float* c, float* d,
                     int m, int n, int k, cudaStream_t stream) {
  if (variant == 0) variant = VariantOverride();
  if (variant == 0) variant = k <= kPingpongMaxK ? 1 : 2;
  switch (variant) {
    case 1:
      return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_1, _2, _1>>>(x, w, bias, c, d, m, n, k, 1, stream);
    case 2:
      return Run<CooperativeConfig<Shape<_128, _256, _64>, Shape<_2, _1, _1>>>(x, w, bias, c, d, m, n, k, 8, stream);
#ifdef STAGEHAND_GEMM_RESIDUAL_VARIANTS
    case 3:
      return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_2, _1, _1>>>(x, w, bias, c, d, m, n, k, 8, stream);
    case 4:
      return Run<CooperativeConfig<Shape<_256, _128, _64>, Shape<_1, _2, _1>>>(x, w, bias, c, d, m, n, k, 1, stream);
    case 5:
      return Run<PingpongConfig<Shape<_64, _256, _64>, Shape<_1, _2, _1>>>(x, w, bias, c, d, m, n, k, 1, stream);
    case 6:
      return Run<PingpongConfig<Shape<_128, _192, _64>, Shape<_1, _2, _1>>>(x, w, bias, c, d, m, n, k, 1, stream);
    case 7:
      return Run<CooperativeConfig<Shape<_256, _192, _64>, Shape<_1, _2, _1>>>(x, w, bias, c, d, m, n, k, 1, stream);
#endif
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool GemmResidualAvailable() {
  static const bool available = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) return false;
    return major == 9 && minor == 0;
  }();
  return available;
}

bool GemmResidualSupports(int64_t m, int64_t n, int64_t k) {
  constexpr int64_t kMax = (int64_t{1} << 31) - 1;
  return m > 0 && n > 0 && k > 0 && m <= kMax && n <= kMax && k <= kMax && n % kAlignCD == 0 && k % kAlignAB == 0;
}

int GemmResidualVariants() {
#ifdef STAGEHAND_GEMM_RESIDUAL_VARIANTS
  return 8;
#else
  return 3;
#endif
}

const char* GemmResidualVariantName(int variant) {
  switch (variant) {
    case 0: return "model's: k <= 4096 ? 1 : 2";
    case 1: return "pingpong 128x128x64 cl 1x2 sw1";
    case 2: return "coop 128x256x64 cl 2x1 sw8";
    case 3: return "pingpong 128x128x64 cl 2x1 sw8";
    case 4: return "coop 256x128x64 cl 1x2 sw1";
    case 5: return "pingpong 64x256x64 cl 1x2 sw1";
    case 6: return "pingpong 128x192x64 cl 1x2 sw1";
    case 7: return "coop 256x192x64 cl 1x2 sw1";
    default: return "?";
  }
}

cudaError_t GemmResidualFp32(const uint16_t* x, const uint16_t* w, const float* bias, const float* c, float* d,
                             int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!GemmResidualSupports(m, n, k) || !aligned(x) || !aligned(w) || (bias != nullptr && !aligned(bias)) ||
      !aligned(c) || !aligned(d)) {
    return cudaErrorInvalidValue;
  }
  if (!GemmResidualAvailable()) return cudaErrorNotSupported;
  return Dispatch(variant, x, w, bias, c, d, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), stream);
}

}  // namespace stagehand
