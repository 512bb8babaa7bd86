#!/usr/bin/env bash
# A GPU smoke test on one GPU, through the bundle (carry dist/): the models'
# CUDA tests; the README's first command (gpt-1.3b, 30 steps: startup and step time); tinyllama-1.1b;
# zb-v on one rank (two chunks: I and W actions, deferred weight gradients on and off, the losses must
# agree); a small GPT trained with --export_dir, then --inference --init_from of the export (loss and
# perplexity on the GPU path); the pipeline checks of tests/gpu. From the repository root:
# OUT=DIR bash bench/probes/gpu_smoke_one_gpu.sh. Logs under $OUT; a short table last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run=dist/bundle/run
work="$tmp/runs"; rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work"; rm -rf "$tmp"' EXIT
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$out/gpu.txt" 2>&1
gpt_t=0
for t in gpt_stage_test dense_test fused_kernels_test stage_test; do
  timeout 90 $run "$t" --gtest_filter='*Cuda*:FusedLoss.*:LowersDenseWeights.*' || gpt_t=$?
done >"$out/gpt_stage_test.log" 2>&1
timeout 60 $run llama_stage_test --gtest_filter='*Cuda*' >"$out/llama_stage_test.log" 2>&1; llama_t=$?
timeout 150 $run launcher --run_dir="$work/bare" >"$out/bare.log" 2>&1; bare_rc=$?
cp "$work/bare/report.json" "$out/bare_report.json" 2>/dev/null
timeout 90 $run launcher --model=tinyllama-1.1b --steps=10 --run_dir="$work/llama" >"$out/llama.log" 2>&1; llama_rc=$?
small=(--model=gpt-1.3b --layers=4 --steps=8 --schedule=zb-v)
for d in true false; do
  timeout 90 $run launcher "${small[@]}" --model_option=deferred_wgrad=$d --run_dir="$work/zbv.$d" >"$out/zbv.$d.log" 2>&1
  echo $? >"$out/zbv.$d.rc"
done
zbv=$(python3 - "$work/zbv.true/steps.csv" "$work/zbv.false/steps.csv" <<'PY' 2>&1
import csv, sys
def losses(p): return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(p)) if r["loss"]}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a and a.keys() == b.keys()
print(f"{max(abs(a[k] - b[k]) / abs(b[k]) for k in a):.2e}")
PY
)
gpt_small=(--model=gpt-1.3b --hidden=1024 --heads=16 --layers=4)
timeout 120 $run launcher "${gpt_small[@]}" --steps=20 --export_dir="$work/export" --run_dir="$work/train" >"$out/export_train.log" 2>&1; exp_rc=$?
ls -la "$work/export" >"$out/export_ls.txt" 2>&1
timeout 90 $run launcher "${gpt_small[@]}" --inference --steps=6 --init_from="$work/export" --run_dir="$work/infer" >"$out/export_infer.log" 2>&1; inf_rc=$?
timeout 90 $run launcher "${gpt_small[@]}" --inference --steps=6 --cuda_graphs=false --init_from="$work/export" --run_dir="$work/infer_eager" >"$out/export_infer_eager.log" 2>&1; inf2_rc=$?
OUT="$out/pipeline_check" timeout 240 bash tests/gpu/pipeline_gpu_check.sh >"$out/pipeline_check.log" 2>&1; pc_rc=$?
tar -C "$out" -czf "$tmp/gpu_smoke_logs.tgz" . 2>/dev/null && mv "$tmp/gpu_smoke_logs.tgz" "$out/"
echo "=== $(cat "$out/gpu.txt")"
echo "gpt_stage_test, dense_test, fused_kernels_test and stage_test rc $gpt_t, llama_stage_test rc $llama_t"
echo "=== bare gpt-1.3b (exit $bare_rc)"; grep -E "s/step|first step|done:|GPU:" "$out/bare.log" | tail -6
echo "=== tinyllama (exit $llama_rc)"; grep -E "s/step|first step|done:" "$out/llama.log" | tail -3
echo "=== zb-v one rank: exit $(cat "$out/zbv.true.rc")/$(cat "$out/zbv.false.rc"), deferred vs not worst rel loss diff $zbv"
grep -E "s/step" "$out/zbv.true.log" "$out/zbv.false.log" | tail -2
echo "=== export: train exit $exp_rc, inference exit $inf_rc (graphs) / $inf2_rc (eager)"
grep -hE "exported|perplexity" "$out/export_train.log" "$out/export_infer.log" "$out/export_infer_eager.log" | tail -5
echo "=== pipeline_gpu_check (exit $pc_rc)"; grep -E "^(PASS|FAIL)" "$out/pipeline_check.log"
