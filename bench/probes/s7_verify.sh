#!/usr/bin/env bash
# Issue 16, session 7, after review: the residual GEMM's one kernel (ping-pong for every shape) and the
# CUTLASS launch shared with fc1 + GELU (cutlass_launch.cuh): every CUDA test of gpt_stage_test and
# llama_stage_test, bias_grad_test, the loss checks with the CUTLASS residual GEMM on and off, and a
# gpt-1.3b inference row and training row with it on and off. Logs in one tarball; results last.
set -uo pipefail
out=${OUT:-/tmp/s7v}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s7v_logs work=/tmp/s7v_runs
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s7v.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
for t in gpt_stage_test llama_stage_test; do
  timeout 300 $run $t --gtest_filter='*Cuda*:LowersDenseWeights*' >"$logs/$t.log" 2>&1
  echo "$t *Cuda* rc $? ($(grep -c '^\[       OK' "$logs/$t.log") ok, $(grep -c '^\[  SKIPPED' "$logs/$t.log") skipped)" >>"$logs/tests.txt"
done
timeout 200 $run bias_grad_test >"$logs/bias_grad_test.log" 2>&1
echo "bias_grad_test rc $? ($(grep -c '^\[       OK' "$logs/bias_grad_test.log") ok)" >>"$logs/tests.txt"
grep -hE "^\[  FAILED|Failure|Expected|Which is" "$logs"/*_test.log | head -12 >>"$logs/tests.txt"
PIPELINE_CHECK_ONLY='cutlass_residual_gemm' OUT="$logs/check" timeout 200 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1
grep -E "^(PASS|FAIL)" "$logs/check.log" >>"$logs/tests.txt"
one() {  # NAME KIND FLAGS...
  local name=$1 kind=$2; shift 2
  local args=(--gpus=1 --model=gpt-1.3b --steps=12 --pipeline_stages=1 --overwrite --run_dir="$work/$name")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64 --micro_batches=4)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  timeout 120 $run launcher "${args[@]}" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  python3 - "$work/$name" "$name" "$*" >>"$logs/rows.md" <<'PY'
import csv, sys
d, name, flags = sys.argv[1:4]
try:
    rows = [r for r in csv.DictReader(open(f"{d}/steps.csv")) if 3 <= int(r["step"]) < 12]
    mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)
    print(f"| {name} | {flags} | {mean('seconds'):.4f} | {mean('sm_mhz_mean'):.0f} | {mean('power_w_mean'):.0f} |")
except Exception as e:
    print(f"| {name} | {flags} | failed: {e} | | |")
PY
  rm -rf "${work:?}/$name"
}
off=--model_option=cutlass_residual_gemm=false
one infer infer; one infer_lt infer $off; one infer2 infer; one infer_lt2 infer $off
one train train; one train_lt train $off
echo "== tests"; cat "$logs/tests.txt"
echo "| row | flags | step s | SM MHz | W |"; echo "| --- | --- | --- | --- | --- |"; cat "$logs/rows.md"
