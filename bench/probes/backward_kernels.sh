#!/usr/bin/env bash
# Issue 16, session 5, backward kernels (branch s5-kern), one H200 call: (a) the CUDA tests of the GELU
# backward, column-sum and norm-backward kernels from this branch's bundle; (b, c) a gpt-1.3b training
# run (1 stage, 1F1B, 4 x 8) from main's bundle (dist/bundle) and from this branch's (dist-s5-kern/bundle,
# binaries only: it borrows main's lib/): step time = mean of steps 3..9 of steps.csv, and a Kineto trace
# of step 10 summed by kernel; (d) pipeline_gpu_check's fused_gelu, fused_bias_grad, fused_norm_backward
# and fused_residual_grad cases from this branch's bundle. One tarball; the short table last.
set -uo pipefail
out=${OUT:-/tmp/s5kern}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s5kern_logs; work=/tmp/s5kern_runs; rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
pack() { tar -C "$logs" -czf "$out/s5kern.tgz" . 2>/dev/null; }
trap 'pack; rm -rf "$logs" "$work"' EXIT
mine=dist-s5-kern/bundle
end=$((SECONDS + ${S5KERN_SECONDS:-290}))  # every part's timeout within this
within() { local t=$((end - SECONDS)); [ "$t" -gt "$1" ] && t=$1; [ "$t" -lt 5 ] && t=5; echo "$t"; }
[ -d "$mine/lib" ] || cp -r dist/bundle/lib "$mine/lib"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "== (a) CUDA tests, this branch"
timeout $(within 60) $mine/run bias_grad_test >"$logs/bias_grad_test.log" 2>&1; echo "bias_grad_test rc=$?" | tee -a "$logs/rc.txt"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ" "$logs/bias_grad_test.log" | head -20
timeout $(within 90) $mine/run gpt_stage_test --gtest_filter='FusedKernelsCuda.NormBackward*:GemmGeluCuda.*:DenseForwardGeluCuda.*:GptStageCuda.FusedLayerNorm*:DenseCuda.*' \
  >"$logs/gpt_stage_test.log" 2>&1; echo "gpt_stage_test rc=$?" | tee -a "$logs/rc.txt"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|differ|^\[       OK" "$logs/gpt_stage_test.log" | head -30
echo "== (b, c) gpt-1.3b training step, traced at step 10"
train=(--gpus=1 --model=gpt-1.3b --steps=11 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite)
for who in main mine; do
  b=dist/bundle; [ $who = mine ] && b=$mine
  STAGEHAND_KERNEL_TRACE=$logs/$who STAGEHAND_KERNEL_TRACE_STEP=10 timeout $(within 100) $b/run launcher "${train[@]}" \
    --run_dir="$work/$who" >"$logs/$who.log" 2>&1 || echo "$who FAILED: $(tail -n 3 "$logs/$who.log")"
  cp "$work/$who/steps.csv" "$logs/$who.steps.csv" 2>/dev/null
  [ -f "$logs/$who.rank0.json" ] && python3 bench/probes/trace_summary.py "$logs/$who.rank0.json" "$who" 90 >"$logs/$who.summary.md" 2>&1
done
python3 - "$logs" <<'PY' | tee "$logs/kernels.md"
import csv, re, sys
logs = sys.argv[1]
pat = re.compile(r"GeluBackwardBias|ColumnPartials|FinishSums|NormBackward|reduce_kernel")
for who in ("main", "mine"):
    print(f"-- {who}")
    try:
        for line in open(f"{logs}/{who}.summary.md"):
            if pat.search(line) or line.startswith(("span", "| gemm", "| norm", "| reduce", "| gelu", "| copy")):
                print(line.rstrip()[:200])
    except OSError as e:
        print("no summary:", e)
PY
echo "== (d) pipeline checks, this branch"
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
for who in ("main", "mine"):
    try:
        rows = list(csv.DictReader(open(f"{logs}/{who}.steps.csv")))
        secs = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) < 10]
        loss = [r["loss"] for r in rows if r["loss"]]
        print(f"| {who} | {sum(secs) / len(secs):.4f} | {len(secs)} | {loss[-1] if loss else ''} |")
    except Exception as e:
        print(f"| {who} | failed: {e} | | |")
PY
cat "$logs/rc.txt"
