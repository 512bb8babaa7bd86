// See gemm_gelu.h. A row-major PyTorch y[m, n] = x[m, k] W[n, k]^T is, read column-major, the problem
// y^T = W x^T with both operands K-major ("TN"): CUTLASS's M is our n, its N our m, and the bias is per
// row of its output. Compiled for sm_90a only (warp-specialized TMA kernels and wgmma).
#include "kernels/gemm_gelu.h"

#include <cuda_runtime.h>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/operations.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "kernels/cutlass_launch.cuh"

namespace stagehand {
namespace {

using namespace cute;
using Bf16 = cutlass::bfloat16_t;
using LayoutA = cutlass::layout::RowMajor;     // W [n, k]: K-major
using LayoutB = cutlass::layout::ColumnMajor;  // x^T [k, m] with x row-major: K-major
using LayoutD = cutlass::layout::ColumnMajor;  // y^T [n, m] column-major = y [m, n] row-major
constexpr int kAlign = 8;                      // bf16 elements in 16 bytes

template <class Tile, class Cluster, class KernelSchedule, class EpilogueSchedule, bool kAux>
struct Config {
  using Fusion = std::conditional_t<
      kAux,
      cutlass::epilogue::fusion::LinCombPerRowBiasEltActAux<LayoutD, cutlass::epilogue::thread::GELU, Bf16, float, Bf16,
                                                            Bf16>,
      cutlass::epilogue::fusion::LinCombPerRowBiasEltAct<cutlass::epilogue::thread::GELU, Bf16, float, Bf16>>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, LayoutD, kAlign, Bf16, LayoutD, kAlign,
      EpilogueSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Bf16, LayoutA, kAlign, Bf16, LayoutB, kAlign, float, Tile,
      Cluster,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      KernelSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

template <class C>
cudaError_t Run(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* a, uint16_t* h, int m, int n,
                int k, int swizzle, cudaStream_t stream) {
  using Gemm = typename C::Gemm;
  using StrideA = typename Gemm::GemmKernel::StrideA;
  using StrideB = typename Gemm::GemmKernel::StrideB;
  using StrideC = typename Gemm::GemmKernel::StrideC;
  using StrideD = typename Gemm::GemmKernel::StrideD;
  // CUTLASS's problem: M = n (W's rows), N = m (x's rows), K = k.
  const StrideA sa = cutlass::make_cute_packed_stride(StrideA{}, make_shape(n, k, 1));
  const StrideB sb = cutlass::make_cute_packed_stride(StrideB{}, make_shape(m, k, 1));
  const StrideC sc = cutlass::make_cute_packed_stride(StrideC{}, make_shape(n, m, 1));
  const StrideD sd = cutlass::make_cute_packed_stride(StrideD{}, make_shape(n, m, 1));
  typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                {n, m, k, 1},
                                {reinterpret_cast<const Bf16*>(w), sa, reinterpret_cast<const Bf16*>(x), sb},
                                {{}, nullptr, sc, reinterpret_cast<Bf16*>(a), sd}};
  auto& fusion = args.epilogue.thread;
  fusion.alpha = 1.f;
  fusion.beta = 0.f;
  fusion.bias_ptr = reinterpret_cast<const Bf16*>(bias);
  if constexpr (C::Fusion::IsAuxOutSupported) {
    fusion.aux_ptr = reinterpret_cast<Bf16*>(h);
    fusion.dAux = sd;
  }
  return cutlass_launch::Launch<Gemm>(args, swizzle, stream);
}

using Cooperative = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using CooperativeEpilogue = cutlass::epilogue::TmaWarpSpecializedCooperative;
using Pingpong = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using PingpongEpilogue = cutlass::epilogue::TmaWarpSpecialized;

// The tile configurations: the model's one in the build (two kernels, with and without the
// pre-activation output, a minute of nvcc on a small machine); eight more in the microbenchmark's. Variant 0 is what
// the model uses: ping-pong (one warp group's GELU epilogue overlaps the other's MMAs), 128x128x64 tiles, and for each
// output the cluster and swizzle that were fastest on an H200 for gpt-1.3b's shapes (worker:gemm_gelu_bench,
// bench/results/ gemm-gelu-h200-2026-12-01.md): with h, 2x1 and swizzle 8 (training, m = 8192); without, 1x2 and
// swizzle 1 (inference, m = 16384). The others are for the microbenchmark.
template <class Tile, class Cluster, bool kAux>
using PingpongConfig = Config<Tile, Cluster, Pingpong, PingpongEpilogue, kAux>;

template <bool kAux>
cudaError_t Dispatch(int variant, const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* a, uint16_t* h,
                     int m, int n, int k, cudaStream_t stream) {
  switch (variant) {
    case 0:
      if constexpr (kAux) {
        return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_2, _1, _1>, kAux>>(x, w, bias, a, h, m, n, k, 8,
                                                                                    stream);
      } else {
        return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_1, _2, _1>, kAux>>(x, w, bias, a, h, m, n, k, 1,
                                                                                    stream);
      }
#ifdef STAGEHAND_GEMM_GELU_VARIANTS
    case 1:
      return Run<Config<Shape<_128, _256, _64>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue, kAux>>(
          x, w, bias, a, h, m, n, k, 8, stream);
    case 2:
      return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_1, _2, _1>, kAux>>(x, w, bias, a, h, m, n, k, 8, stream);
    case 3:
      return Run<PingpongConfig<Shape<_128, _128, _64>, Shape<_2, _1, _1>, kAux>>(x, w, bias, a, h, m, n, k, 1, stream);
    case 4:
      return Run<Config<Shape<_256, _128, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue, kAux>>(
          x, w, bias, a, h, m, n, k, 1, stream);
    case 5:
      return Run<PingpongConfig<Shape<_128, _192, _64>, Shape<_1, _2, _1>, kAux>>(x, w, bias, a, h, m, n, k, 1, stream);
    case 6:
      return Run<Config<Shape<_256, _192, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue, kAux>>(
          x, w, bias, a, h, m, n, k, 1, stream);
    case 7:
      return Run<Config<Shape<_128, _192, _64>, Shape<_2, _1, _1>, Cooperative, CooperativeEpilogue, kAux>>(
          x, w, bias, a, h, m, n, k, 8, stream);
    case 8:
      return Run<Config<Shape<_128, _192, _64>, Shape<_1, _2, _1>, Cooperative, CooperativeEpilogue, kAux>>(
          x, w, bias, a, h, m, n, k, 1, stream);
#endif
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

bool GemmGeluAvailable() { return cutlass_launch::Sm90Available(); }

bool GemmGeluSupports(int64_t m, int64_t n, int64_t k) {
  return cutlass_launch::ProblemFits(m, n, k) && n % kAlign == 0 && k % kAlign == 0;
}

int GemmGeluVariants() {
#ifdef STAGEHAND_GEMM_GELU_VARIANTS
  return 9;
#else
  return 1;
#endif
}

const char* GemmGeluVariantName(int variant) {
  switch (variant) {
    case 0:
      return "model's: pp 128x128 h:2x1/8 else:1x2/1";
    case 1:
      return "coop 128x256x64 cl 2x1 sw8";
    case 2:
      return "pingpong 128x128x64 cl 1x2 sw8";
    case 3:
      return "pingpong 128x128x64 cl 2x1 sw1";
    case 4:
      return "coop 256x128x64 cl 1x2 sw1";
    case 5:
      return "pingpong 128x192x64 cl 1x2 sw1";
    case 6:
      return "coop 256x192x64 cl 1x2 sw1";
    case 7:
      return "coop 128x192x64 cl 2x1 sw8";
    case 8:
      return "coop 128x192x64 cl 1x2 sw1";
    default:
      return "?";
  }
}

cudaError_t GemmBiasGelu(const uint16_t* x, const uint16_t* w, const uint16_t* bias, uint16_t* a, uint16_t* h,
                         int64_t m, int64_t n, int64_t k, cudaStream_t stream, int variant) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (!GemmGeluSupports(m, n, k) || !aligned(x) || !aligned(w) || !aligned(bias) || !aligned(a) ||
      (h != nullptr && !aligned(h))) {
    return cudaErrorInvalidValue;
  }
  if (!GemmGeluAvailable()) return cudaErrorNotSupported;
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  return h != nullptr ? Dispatch<true>(variant, x, w, bias, a, h, mi, ni, ki, stream)
                      : Dispatch<false>(variant, x, w, bias, a, h, mi, ni, ki, stream);
}

}  // namespace stagehand
