#!/usr/bin/env bash
# fc1 + GELU fused (DenseImpl::ForwardGelu): in one run on a GPU host the CUDA tests, the GEMM
# microbenchmark (//bench:gemm_gelu_bench), gpt-1.3b training and inference rows with fused_gelu on and off
# (mean of steps 3..10, bench/bench_one_gpu's rows), the pipeline_gpu_check cases, and kernel traces of
# fused training and inference. From the repository root: OUT=DIR bash bench/probes/fused_gelu.sh
# (BUNDLE, default dist/bundle); LEAN=1 skips the fused_gelu_gemm=false row and the pipeline check.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out/t"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
run=${BUNDLE:-dist/bundle}/run
work="$tmp/fused_gelu_runs"
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"; rm -rf "$tmp"' EXIT
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start )) s] $*"; }

stamp tests
rc=0
for t in gpt_stage_test dense_test fused_kernels_test; do
  timeout 150 "$run" "$t" --gtest_filter='*Gelu*' || rc=$?
done >"$out/t/tests.log" 2>&1
echo "tests rc=$rc"
grep -E "^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|Expected|Which is|rel|ATen" "$out/t/tests.log" | head -40

stamp bench
timeout 120 "$run" gemm_gelu_bench 20 2>&1 | tee "$out/t/bench.txt"

rows="$out/t/rows.tsv"
: >"$rows"
ours() {
  local name=$1; shift
  stamp "$name"
  timeout 150 "$run" launcher --gpus=1 --model=gpt-1.3b --steps=11 --pipeline_stages=1 --overwrite \
    --run_dir="$work/$name" "$@" >"$out/t/$name.log" 2>&1 || { echo "$name: FAILED"; tail -n 5 "$out/t/$name.log"; return 0; }
  python3 - "$name" "$work/$name" >>"$rows" <<'PY'
import csv, sys
name, run = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(run + "/steps.csv")))
secs = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) < 11]
mean = sum(secs) / len(secs)
peak = max(int(r["peak_memory_bytes"]) for r in rows) / 2**30
losses = [r["loss"] for r in rows if r["loss"]]
print(f"{name}\t{mean:.4f}\t{int(rows[0]['tokens']) / mean:.0f}\t{peak:.1f}\t{losses[-1] if losses else ''}")
PY
}
train=(--schedule=1f1b --micro_batches=4 --global_batch=32)
infer=(--inference --global_batch=64 --micro_batches=4)
ours train_fused "${train[@]}"
ours train_off "${train[@]}" --model_option=fused_gelu=false
[ -n "${LEAN:-}" ] || ours train_fused_no_gemm "${train[@]}" --model_option=fused_gelu_gemm=false
ours infer_fused "${infer[@]}"
ours infer_off "${infer[@]}" --model_option=fused_gelu=false

if [ -z "${LEAN:-}" ]; then
stamp pipeline_gpu_check
# tests/gpu/pipeline_gpu_check.sh, run through this bundle.
sed "s#^run=dist/bundle/run#run=$run#" tests/gpu/pipeline_gpu_check.sh >"$work/check.sh"
OUT=$work/check PIPELINE_CHECK_ONLY=fused_gelu timeout 150 bash "$work/check.sh" 2>&1 | tee "$out/t/check.txt"
fi

stamp traces
STAGEHAND_KERNEL_TRACE=$work/tr_train timeout 90 "$run" launcher --gpus=1 --model=gpt-1.3b --steps=6 --pipeline_stages=1 \
  --overwrite --run_dir="$work/trace_train" "${train[@]}" >"$out/t/trace_train.log" 2>&1
STAGEHAND_KERNEL_TRACE=$work/tr_infer timeout 90 "$run" launcher --gpus=1 --model=gpt-1.3b --steps=6 --pipeline_stages=1 \
  --overwrite --run_dir="$work/trace_infer" "${infer[@]}" >"$out/t/trace_infer.log" 2>&1
for t in train infer; do
  f=$work/tr_$t.rank0.json
  [ -f "$f" ] && python3 bench/trace_summary.py "$f" "fused_$t" 25
done >"$out/t/traces.md" 2>&1
cat "$out/t/traces.md"
stamp done
tar -C "$out" -czf "$out/fused_gelu.tgz" t && rm -rf "$out/t"
echo
echo "| row | step s | tokens/s | peak GiB | last loss |"
echo "| --- | --- | --- | --- | --- |"
tar -xzOf "$out/fused_gelu.tgz" t/rows.tsv | awk -F'\t' '{printf "| %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5}'
