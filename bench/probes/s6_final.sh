#!/usr/bin/env bash
# Issue 16, session 6: one family on one H200, side by side in one call: ours and torch.compile, training
# and inference (bench/bench_pipeline FAMILY train_1gpu train_1gpu_compile infer_1gpu infer_1gpu_compile),
# after the residual GEMM's CUDA tests (gpt). Usage: s6_final.sh gpt|llama. One tarball; the table last.
set -uo pipefail
fam=${1:?usage: s6_final.sh gpt|llama}
out=${OUT:-/tmp/s6final}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s6final_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s6final_$fam.tgz" --exclude="*.pt" --exclude="trace.json" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
if [ "$fam" = gpt ]; then
  timeout 150 $run gpt_stage_test --gtest_filter='DenseCuda.*' >"$logs/gpt_stage_test.log" 2>&1
  echo "gpt_stage_test DenseCuda.* rc $? ($(grep -c '^\[       OK' "$logs/gpt_stage_test.log") ok)"
  grep -hE "^\[  FAILED|Failure" "$logs/gpt_stage_test.log" | head -6
fi
BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 520 bench/bench_pipeline "$fam" train_1gpu train_1gpu_compile \
  infer_1gpu infer_1gpu_compile >"$logs/bench_$fam.txt" 2>&1
echo "bench_pipeline rc $?"
sed -n '/^| run/,$p' "$logs/bench_$fam.txt"
