#!/usr/bin/env bash
# fused_bias_grad on one GPU (BUNDLE, default dist/bundle): the CUDA tests of the bias-gradient kernels,
# gpt-1.3b training with --model_option=fused_bias_grad=true and =false (mean of steps 3..10), a kernel
# trace of each (step 5), and pipeline_gpu_check's fused_bias_grad case; ROUNDS (default 2) alternating
# rounds. From the repository root: OUT=DIR ROUNDS=3 bash bench/probes/fused_bias_grad.sh. Files under $OUT.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out/t"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
b=${BUNDLE:-dist/bundle}
run=$b/run
work="$tmp/fbg_runs"; rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work"; rm -rf "$tmp"' EXIT
timeout 60 $run bias_grad_test >"$out/t/bias_grad_test.log" 2>&1; echo "bias_grad_test rc=$?"
grep -E "^\[  (FAILED|PASSED|SKIPPED) |OK \]|strides" "$out/t/bias_grad_test.log" | head -20
train=(--gpus=1 --model=gpt-1.3b --steps=11 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32)
# Rounds in alternating order (on, off, off, on, ...), so that a drift of the GPU's clocks over the call
# does not favour one side.
for round in $(seq 1 "${ROUNDS:-2}"); do
  order="true false"; [ $((round % 2)) -eq 0 ] && order="false true"
  for g in $order; do
    timeout 60 $run launcher "${train[@]}" --model_option=fused_bias_grad=$g --run_dir="$work/time_${g}_$round" \
      >"$out/t/time_${g}_$round.log" 2>&1
    echo "time_${g}_$round rc=$?"; cp "$work/time_${g}_$round/steps.csv" "$out/t/steps_${g}_$round.csv" 2>/dev/null
  done
done
for g in true false; do
  STAGEHAND_KERNEL_TRACE=$out/t/trace_$g timeout 60 $run launcher "${train[@]}" --steps=6 --model_option=fused_bias_grad=$g \
    --run_dir="$work/trace_$g" >"$out/t/trace_$g.log" 2>&1; echo "trace_$g rc=$?"
done
for g in true false; do
  [ -f "$out/t/trace_$g.rank0.json" ] && python3 bench/trace_summary.py "$out/t/trace_$g.rank0.json" "fused_bias_grad=$g" 30
done > "$out/t/summary.md" 2>&1
# tests/gpu/pipeline_gpu_check.sh, pointed at this bundle.
sed "s#^run=dist/bundle/run#run=$b/run#" tests/gpu/pipeline_gpu_check.sh >"$work/check.sh"
OUT=$work/check PIPELINE_CHECK_ONLY=fused_bias_grad timeout 60 bash "$work/check.sh" 2>&1 | tail -4
cat "$out/t/summary.md" | grep -E "^#|busy|copy|reduce|Column|Heads|Partials|Finish|direct_copy|sum_functor|bfloat16" | head -60
python3 - "$out/t" <<'PY'
import csv, glob, os, sys, statistics
d = sys.argv[1]
print("| fused_bias_grad | mean step s (steps 3..10), each run | mean of runs | loss at step 10 |")
print("|---|---|---|---|")
means = {}
for g in ("true", "false"):
    ms, losses = [], []
    for p in sorted(glob.glob(os.path.join(d, f"steps_{g}_*.csv"))):
        rows = list(csv.DictReader(open(p)))
        ts = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) <= 10]
        ms.append(sum(ts) / len(ts))
        losses.append([r["loss"] for r in rows if r["loss"]][-1])
    means[g] = statistics.mean(ms) if ms else float("nan")
    print(f"| {g} | {' '.join(f'{m:.4f}' for m in ms)} | {means[g]:.4f} | {' '.join(losses)} |")
print(f"on / off: {means['true'] / means['false']:.4f}")
PY
gzip "$out"/t/*.json 2>/dev/null
tar -C "$out" -czf "$out/fused_bias_grad.tgz" t && rm -rf "$out/t"
