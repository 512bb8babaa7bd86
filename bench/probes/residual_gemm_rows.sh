#!/usr/bin/env bash
# Our CUTLASS residual GEMM (gemm_residual.h) in the models, on one GPU:
# its CUDA tests, the loss checks with it on and off, the GEMM microbenchmarks under the power limit
# (the residual GEMM's kernels and fc1 + GELU's tile variants), and A/B rows of ours (mean of steps
# 3..11 with clock and power), cuBLASLt's as `_lt` (--model_option=cutlass_residual_gemm=false). From the
# repository root with dist/bundle: OUT=DIR bash bench/probes/residual_gemm_rows.sh. Logs in one
# tarball; tables last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs="$tmp/logs" work="$tmp/runs"
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/residual_gemm_rows.tgz" . 2>/dev/null; rm -rf "$logs" "$work"; rm -rf "$tmp"' EXIT
run=dist/bundle/run
timeout 200 $run dense_test --gtest_filter='DenseCuda.*' >"$logs/dense_test.log" 2>&1
echo "dense_test DenseCuda.* rc $? ($(grep -c '^\[       OK' "$logs/dense_test.log") ok)" >>"$logs/tests.txt"
timeout 200 $run bias_grad_test >"$logs/bias_grad_test.log" 2>&1
echo "bias_grad_test rc $? ($(grep -c '^\[       OK' "$logs/bias_grad_test.log") ok)" >>"$logs/tests.txt"
grep -hE "^\[  FAILED|Failure|Expected|Which is" "$logs"/*_test.log | head -12 >>"$logs/tests.txt"
PIPELINE_CHECK_ONLY='cutlass_residual_gemm' OUT="$logs/check" timeout 200 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1
grep -E "^(PASS|FAIL)" "$logs/check.log" >>"$logs/tests.txt"
timeout 200 $run residual_gemm_bench 20 150 >"$logs/residual_gemm_bench.txt" 2>&1
timeout 200 $run gemm_gelu_bench 20 150 >"$logs/gemm_gelu_bench.txt" 2>&1

one() {  # NAME MODEL KIND FLAGS...: 12 steps
  local name=$1 model=$2 kind=$3; shift 3
  local args=(--gpus=1 --model="$model" --steps=12 --pipeline_stages=1 --overwrite --run_dir="$work/$name")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  timeout 120 $run launcher "${args[@]}" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  cp "$work/$name/steps.csv" "$logs/$name.steps.csv" 2>/dev/null
  python3 - "$work/$name" "$name" "$*" >>"$logs/rows.md" <<'PY'
import csv, sys
d, name, flags = sys.argv[1:4]
try:
    rows = [r for r in csv.DictReader(open(f"{d}/steps.csv")) if 3 <= int(r["step"]) < 12]
    mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)
    peak = max(int(r["peak_memory_bytes"]) for r in rows) / 2**30
    print(f"| {name} | {flags} | {mean('seconds'):.4f} | {peak:.1f} | {mean('sm_mhz_mean'):.0f} | {mean('power_w_mean'):.0f} |")
except Exception as e:
    print(f"| {name} | {flags} | failed: {e} | | | |")
PY
  rm -rf "${work:?}/$name"
}
off=--model_option=cutlass_residual_gemm=false
one gpt_infer gpt-1.3b infer --micro_batches=4
one gpt_infer_lt gpt-1.3b infer --micro_batches=4 $off
one gpt_infer_m2 gpt-1.3b infer --micro_batches=2
one gpt_infer_m2_lt gpt-1.3b infer --micro_batches=2 $off
one gpt_train gpt-1.3b train
one gpt_train_lt gpt-1.3b train $off
one llama_infer tinyllama-1.1b infer --micro_batches=4
one llama_infer_lt tinyllama-1.1b infer --micro_batches=4 $off
one llama_train tinyllama-1.1b train
one llama_train_lt tinyllama-1.1b train $off
one gpt_infer_again gpt-1.3b infer --micro_batches=4

echo "== tests"; cat "$logs/tests.txt"
echo "== residual GEMM (ms under the power limit)"; cat "$logs/residual_gemm_bench.txt"
echo "== fc1 + GELU"; cat "$logs/gemm_gelu_bench.txt"
echo "== ours (lt = --model_option=cutlass_residual_gemm=false)"
echo "| row | flags | step s | peak GiB | SM MHz | W |"; echo "| --- | --- | --- | --- | --- | --- |"; cat "$logs/rows.md"
