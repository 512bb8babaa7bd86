#!/usr/bin/env bash
# Issue 16, session 7: one family on one H200, side by side in one call: ours and torch.compile, training
# and inference in chunks of 16 and of 32 (bench/bench_pipeline FAMILY train_1gpu train_1gpu_compile
# infer_1gpu infer_1gpu_compile infer_1gpu_m2 infer_1gpu_compile_c32); `bench`: the GEMM
# microbenchmarks under the power limit instead (residual_gemm_bench, gemm_gelu_bench with their tile
# variants). Usage: s7_final.sh gpt|llama|bench. One tarball; the table last.
set -uo pipefail
fam=${1:?usage: s7_final.sh gpt|llama|bench}
out=${OUT:-/tmp/s7final}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s7final_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s7final_$fam.tgz" --exclude="*.pt" --exclude="trace.json" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
if [ "$fam" = bench ]; then  # the microbenchmarks alone (a call of their own)
  timeout 120 $run residual_gemm_bench 20 150 >"$logs/residual_gemm_bench.txt" 2>&1
  timeout 120 $run gemm_gelu_bench 20 150 >"$logs/gemm_gelu_bench.txt" 2>&1
  echo "== residual GEMM, inference shapes: the model's choices and ours"
  grep -E "^(proj|fc2) infer .*(model's|cutlass)" "$logs/residual_gemm_bench.txt"
  echo "== fc1 + GELU, inference (m = 16384)"
  grep -E "^fwd +16384" "$logs/gemm_gelu_bench.txt"
  exit 0
fi
BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 560 bench/bench_pipeline "$fam" train_1gpu train_1gpu_compile \
  infer_1gpu infer_1gpu_compile infer_1gpu_m2 infer_1gpu_compile_c32 >"$logs/bench_$fam.txt" 2>&1
echo "bench_pipeline rc $?"
sed -n '/^| run/,$p' "$logs/bench_$fam.txt"
