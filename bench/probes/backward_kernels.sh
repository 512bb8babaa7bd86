#!/usr/bin/env bash
# The memory-bound backward kernels (GELU backward, column sums, norm backward), two bundles on one
# GPU in one run: (a) the CUDA tests of those kernels from AFTER; (b, c) a gpt-1.3b training run (1
# stage, 1F1B, 4 x 8) from BEFORE and from AFTER (AFTER may hold binaries only: it borrows BEFORE's
# lib/): step time = mean of steps 3..9 of steps.csv, and a Kineto trace of step 10 summed by kernel
# (bench/trace_summary.py); (d) pipeline_gpu_check's fused_gelu, fused_bias_grad, fused_norm_backward and
# fused_residual_grad cases from AFTER. From the repository root with both bundles carried:
#   OUT=DIR bash bench/probes/backward_kernels.sh BEFORE_BUNDLE AFTER_BUNDLE
# One tarball under $OUT; the short table last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs="$tmp/logs"; work="$tmp/runs"; rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
pack() { tar -C "$logs" -czf "$out/backward_kernels.tgz" . 2>/dev/null; }
trap 'pack; rm -rf "$logs" "$work"; rm -rf "$tmp"' EXIT
before=${1:?usage: backward_kernels.sh BEFORE_BUNDLE AFTER_BUNDLE} mine=${2:?usage: backward_kernels.sh BEFORE_BUNDLE AFTER_BUNDLE}
end=$((SECONDS + ${PROBE_SECONDS:-290}))  # every part's timeout within this
within() { local t=$((end - SECONDS)); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 5 ] && t=5; echo "$t"; }
[ -d "$mine/lib" ] || cp -r "$before/lib" "$mine/lib"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "== (a) CUDA tests, AFTER"
timeout $(within 60) $mine/run bias_grad_test >"$logs/bias_grad_test.log" 2>&1; echo "bias_grad_test rc=$?" | tee -a "$logs/rc.txt"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$logs/bias_grad_test.log" | head -20
for t in "fused_kernels_test FusedKernelsCuda.NormBackward*:GemmGeluCuda.*" "dense_test DenseForwardGeluCuda.*:DenseCuda.*" \
         "gpt_stage_test GptStageCuda.FusedLayerNorm*"; do
  set -- $t
  timeout $(within 90) $mine/run "$1" --gtest_filter="$2" >"$logs/$1.log" 2>&1; echo "$1 rc=$?" | tee -a "$logs/rc.txt"
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ|^\[       OK" "$logs/$1.log" | head -30
done
echo "== (b, c) gpt-1.3b training step, traced at step 10"
train=(--gpus=1 --model=gpt-1.3b --steps=11 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite)
for who in main mine; do
  b=$before; [ $who = mine ] && b=$mine
  STAGEHAND_KERNEL_TRACE=$logs/$who STAGEHAND_KERNEL_TRACE_STEP=10 timeout $(within 100) $b/run launcher "${train[@]}" \
    --run_dir="$work/$who" >"$logs/$who.log" 2>&1 || echo "$who FAILED: $(tail -n 3 "$logs/$who.log")"
  cp "$work/$who/steps.csv" "$logs/$who.steps.csv" 2>/dev/null
  [ -f "$logs/$who.rank0.json" ] && python3 bench/trace_summary.py "$logs/$who.rank0.json" "$who" 90 >"$logs/$who.summary.md" 2>&1
done
python3 - "$logs" <<'PY' | tee "$logs/kernels.md"
import csv, re, sys
logs = sys.argv[1]
pat = re.compile(r"GeluBackwardBias|ColumnPartials|FinishSums|NormBackward|reduce_kernel")
for who in ("main", "mine"):  # main: BEFORE, mine: AFTER
    print(f"-- {who}")
    try:
        for line in open(f"{logs}/{who}.summary.md"):
            if pat.search(line) or line.startswith(("span", "| gemm", "| norm", "| reduce", "| gelu", "| copy")):
                print(line.rstrip()[:200])
    except OSError as e:
        print("no summary:", e)
PY
echo "== (d) pipeline checks, AFTER"
sed "s#^run=dist/bundle/run#run=$mine/run#" tests/gpu/pipeline_gpu_check.sh >"$work/check.sh"
PIPELINE_CHECK_ONLY='^(fused_gelu_1gpu|fused_bias_grad_1gpu|fused_norm_backward_1gpu|fused_residual_grad_1gpu) ' \
  OUT="$work/check" timeout $(within 130) bash "$work/check.sh" 2>&1 | tee "$logs/pipeline_check.txt" | grep -E "PASS|FAIL"
gzip "$logs"/*.json 2>/dev/null
echo "== table"
python3 - "$logs" <<'PY'
import csv, sys
logs = sys.argv[1]
print("| bundle | step s (mean of steps 3..9) | steps | last loss |")
print("| --- | --- | --- | --- |")
for who in ("main", "mine"):  # main: BEFORE, mine: AFTER
    try:
        rows = list(csv.DictReader(open(f"{logs}/{who}.steps.csv")))
        secs = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) < 10]
        loss = [r["loss"] for r in rows if r["loss"]]
        print(f"| {who} | {sum(secs) / len(secs):.4f} | {len(secs)} | {loss[-1] if loss else ''} |")
    except Exception as e:
        print(f"| {who} | failed: {e} | | |")
PY
cat "$logs/rc.txt"
