// See lt_gemm.h.
#include "kernels/lt_gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace stagehand {
namespace {

// The cuBLASLt functions this file calls, from the copy already in the process.
struct LtApi {
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulPreferenceDestroy) pref_destroy = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool ok = false;
};

template <typename F>
bool Find(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return f != nullptr;
}

const LtApi& Api() {
  static const LtApi api = [] {
    LtApi a;
    a.ok = Find(a.desc_create, "cublasLtMatmulDescCreate") && Find(a.desc_set, "cublasLtMatmulDescSetAttribute") &&
           Find(a.desc_destroy, "cublasLtMatmulDescDestroy") && Find(a.layout_create, "cublasLtMatrixLayoutCreate") &&
           Find(a.layout_destroy, "cublasLtMatrixLayoutDestroy") &&
           Find(a.pref_create, "cublasLtMatmulPreferenceCreate") &&
           Find(a.pref_set, "cublasLtMatmulPreferenceSetAttribute") &&
           Find(a.pref_destroy, "cublasLtMatmulPreferenceDestroy") &&
           Find(a.heuristic, "cublasLtMatmulAlgoGetHeuristic") && Find(a.matmul, "cublasLtMatmul");
    return a;
  }();
  return api;
}

// The largest power of two (up to 256) that divides the address: what the heuristic may assume.
uint32_t Alignment(const void* p) {
  uint32_t a = 1;
  const auto v = reinterpret_cast<uintptr_t>(p);
  while (a < 256 && v % (2 * a) == 0) a *= 2;
  return a;
}

// Descriptors and the chosen algorithm for one shape and alignment; made once, used from any thread
// (cuBLASLt's descriptors are read-only in cublasLtMatmul).
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, cd = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::string error;  // non-empty: this shape cannot run here
  ~Plan() {
    const LtApi& api = Api();
    if (desc != nullptr) api.desc_destroy(desc);
    if (a != nullptr) api.layout_destroy(a);
    if (b != nullptr) api.layout_destroy(b);
    if (cd != nullptr) api.layout_destroy(cd);
  }
};

// The bias pointer is part of the key (a parameter keeps its address), so that a plan never changes after it
// is made and threads can share it.
using PlanKey =
    std::tuple<void*, int64_t, int64_t, int64_t, const float*, uint32_t, uint32_t, uint32_t, uint32_t, size_t>;

// What the algorithm choice depends on: PlanKey without the bias's address (only whether there is a bias).
// Every layer of one shape shares the choice, so a model times each shape once rather than once per
// layer (gpt-1.3b: 2 shapes, not 48 timings in the first forward), and its layers run one algorithm
// (until a process with more than 256 shapes clears the cache).
using AlgoKey = std::tuple<void*, int64_t, int64_t, int64_t, bool, uint32_t, uint32_t, uint32_t, uint32_t, size_t>;
using AlgoCache = std::map<AlgoKey, cublasLtMatmulAlgo_t>;

AlgoKey AlgoKeyOf(const PlanKey& key) {
  auto [handle, m, n, k, bias, align_x, align_w, align_c, align_d, workspace_bytes] = key;
  return AlgoKey{handle, m, n, k, bias != nullptr, align_x, align_w, align_c, align_d, workspace_bytes};
}

std::atomic<int64_t> timings{0};  // LtAlgorithmTimings(): FastestAlgorithm calls that chose by timing

// The call MakePlan tunes with: its operands (d is written; it must not be c) and stream.
struct Operands {
  const void *x, *w;
  const float* c;
  float* d;
  void* workspace;
  cudaStream_t stream;
};

// Times each algorithm the heuristic offers on the call's own operands (d = x w^T + b + c, the same
// value every run, since d is not c; 2 warm-up runs, then the best of 3 repeats of 3 runs, so that one
// noisy sample in step 0, while the clock ramps, does not choose for every layer of the shape) and
// returns the fastest one's index, or nullopt where it timed nothing: a single candidate, d == c, the
// stream being captured into a CUDA graph (nothing may synchronise then), events that cannot be made,
// or no candidate that ran. The heuristic's first choice for this bf16 x bf16 + fp32 -> fp32 product is
// not always the fastest (its tile choice for an fp32 output).
std::optional<int> FastestAlgorithm(const LtApi& api, cublasLtHandle_t handle, const Plan& plan,
                                    const std::vector<cublasLtMatmulHeuristicResult_t>& results, const Operands& o,
                                    size_t workspace_bytes) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (results.size() < 2 || o.d == o.c || cudaStreamIsCapturing(o.stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return std::nullopt;
  }
  cudaEvent_t start, stop;
  if (cudaEventCreate(&start) != cudaSuccess) return std::nullopt;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    cudaEventDestroy(start);
    return std::nullopt;
  }
  const float alpha = 1.0f, beta = 1.0f;
  int best = -1;  // none ran yet
  float best_ms = 0;
  bool broken = false;  // an event failed: what was timed so far is not to be trusted
  for (size_t i = 0; i < results.size() && !broken; ++i) {
    auto run = [&] {
      return api.matmul(handle, plan.desc, &alpha, o.w, plan.a, o.x, plan.b, &beta, o.c, plan.cd, o.d, plan.cd,
                        &results[i].algo, o.workspace, workspace_bytes, o.stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;  // an algorithm that fails is not taken
    run();
    constexpr int kRepeats = 3, kRuns = 3;
    float fastest = -1;
    for (int rep = 0; rep < kRepeats; ++rep) {
      cudaEventRecord(start, o.stream);
      for (int r = 0; r < kRuns; ++r) run();
      cudaEventRecord(stop, o.stream);
      float ms = 0;
      if (cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess) {
        broken = true;
        break;
      }
      if (fastest < 0 || ms < fastest) fastest = ms;
    }
    if (broken) break;
    if (best < 0 || fastest < best_ms) {
      best = static_cast<int>(i);
      best_ms = fastest;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (broken || best < 0) return std::nullopt;  // the heuristic's first choice (an error shows at the call)
  timings.fetch_add(1, std::memory_order_relaxed);
  return best;
}

// Row-major d[m, n] = x[m, k] w[n, k]^T + c is, column-major, d^T[n, m] = op_T(W)[n, k] x^T[k, m] + c^T:
// A = w as a k x n column-major matrix (transposed), B = x as k x m (not), C = D = n x m, bias per row of D.
// `algos` holds the choices made so far (the caller's lock guards it); one that the heuristic no longer
// offers for this plan is timed again.
std::shared_ptr<Plan> MakePlan(const PlanKey& key, const Operands& operands, AlgoCache& algos) {
  const LtApi& api = Api();
  auto [handle, m, n, k, bias, align_x, align_w, align_c, align_d, workspace_bytes] = key;
  const bool has_bias = bias != nullptr;
  auto plan = std::make_shared<Plan>();
  auto fail = [&](const char* what, cublasStatus_t s) {
    plan->error =
        absl::StrCat("cuBLASLt ", what, " failed (status ", static_cast<int>(s), ") for m=", m, " n=", n, " k=", k);
    return std::move(plan);
  };
  cublasStatus_t s = api.desc_create(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("MatmulDescCreate", s);
  const cublasOperation_t transa = CUBLAS_OP_T, transb = CUBLAS_OP_N;
  api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &transa, sizeof(transa));
  api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &transb, sizeof(transb));
  const cublasLtEpilogue_t epilogue = has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue));
  if (has_bias) {
    const cudaDataType_t bias_type = CUDA_R_32F;
    api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type));
    api.desc_set(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
  }
  if ((s = api.layout_create(&plan->a, CUDA_R_16BF, k, n, k)) != CUBLAS_STATUS_SUCCESS) return fail("layout A", s);
  if ((s = api.layout_create(&plan->b, CUDA_R_16BF, k, m, k)) != CUBLAS_STATUS_SUCCESS) return fail("layout B", s);
  if ((s = api.layout_create(&plan->cd, CUDA_R_32F, n, m, n)) != CUBLAS_STATUS_SUCCESS) return fail("layout C", s);
  cublasLtMatmulPreference_t pref = nullptr;
  if ((s = api.pref_create(&pref)) != CUBLAS_STATUS_SUCCESS) return fail("MatmulPreferenceCreate", s);
  const uint64_t ws = workspace_bytes;
  api.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_w, sizeof(align_w));
  api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_x, sizeof(align_x));
  api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  api.pref_set(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof(align_d));
  constexpr int kCandidates = 8;
  std::vector<cublasLtMatmulHeuristicResult_t> results(kCandidates);
  int found = 0;
  s = api.heuristic(static_cast<cublasLtHandle_t>(handle), plan->desc, plan->a, plan->b, plan->cd, plan->cd, pref,
                    kCandidates, results.data(), &found);
  api.pref_destroy(pref);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("MatmulAlgoGetHeuristic", s);
  if (found == 0) return fail("MatmulAlgoGetHeuristic (no algorithm)", CUBLAS_STATUS_NOT_SUPPORTED);
  results.resize(found);
  const AlgoKey algo_key = AlgoKeyOf(key);
  if (auto known = algos.find(algo_key); known != algos.end()) {
    for (const cublasLtMatmulHeuristicResult_t& r : results) {
      if (std::memcmp(&r.algo, &known->second, sizeof(r.algo)) == 0) {
        plan->algo = r.algo;
        return plan;
      }
    }
  }
  const std::optional<int> fastest =
      FastestAlgorithm(api, static_cast<cublasLtHandle_t>(handle), *plan, results, operands, workspace_bytes);
  plan->algo = results[fastest.value_or(0)].algo;
  // Shared only when timed, or when there was no other to choose: an untimed first choice (inside graph
  // capture, in place) is this plan's alone, and the next plan of the shape may still time.
  if (fastest.has_value() || results.size() == 1) algos[algo_key] = plan->algo;
  return plan;
}

}  // namespace

bool LtAvailable() { return Api().ok; }

int64_t LtAlgorithmTimings() { return timings.load(std::memory_order_relaxed); }

std::string LtLinearAddFp32(void* lt_handle, void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            const void* x, const void* w, const float* bias, const float* c, float* d, int64_t m,
                            int64_t n, int64_t k) {
  const LtApi& api = Api();
  if (!api.ok) return "cuBLASLt is not loaded in this process";
  if (m <= 0 || n <= 0 || k <= 0) return absl::StrCat("empty product m=", m, " n=", n, " k=", k);
  const PlanKey key{lt_handle, m, n, k, bias, Alignment(x), Alignment(w), Alignment(c), Alignment(d), workspace_bytes};
  // Never destroyed: plans may be in use by threads still running at exit.
  static absl::Mutex* mu = new absl::Mutex();
  static auto* plans = new std::map<PlanKey, std::shared_ptr<const Plan>>();
  static auto* algos = new AlgoCache();
  std::shared_ptr<const Plan> plan;  // held: another thread may clear the cache meanwhile
  {
    absl::MutexLock lock(mu);
    auto it = plans->find(key);
    if (it == plans->end()) {
      // A model has a handful of shapes; a process that sees thousands is not ours to cache for.
      if (plans->size() >= 256) plans->clear();
      if (algos->size() >= 256) algos->clear();
      it = plans->emplace(key, MakePlan(key, Operands{x, w, c, d, workspace, stream}, *algos)).first;
    }
    plan = it->second;
  }
  if (!plan->error.empty()) return plan->error;
  const float alpha = 1.0f, beta = 1.0f;
  const cublasStatus_t s =
      api.matmul(static_cast<cublasLtHandle_t>(lt_handle), plan->desc, &alpha, w, plan->a, x, plan->b, &beta, c,
                 plan->cd, d, plan->cd, &plan->algo, workspace, workspace_bytes, stream);
  if (s != CUBLAS_STATUS_SUCCESS) return absl::StrCat("cublasLtMatmul failed (status ", static_cast<int>(s), ")");
  return "";
}

}  // namespace stagehand
