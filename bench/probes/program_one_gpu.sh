#!/usr/bin/env bash
# `launcher -- PROGRAM` on one GPU, through the bundle (carry dist/): what a program's ranks get on a
# GPU host that CPU tests cannot show. From the repository root: OUT=DIR bash bench/probes/program_one_gpu.sh
#   env:   tests/programs/show_env.py under --gpus=1 (CUDA_VISIBLE_DEVICES, LOCAL_RANK);
#   train: bench/probes/program_gpu_train.py (DDP over NCCL, stagehand.step with FLOPs) with
#          --health=strict: exit 0, report.json's tflops/mfu and the GPU's telemetry, steps.csv's columns;
#   fail:  the same script raising at step 10: exit 1, the root-cause line, seconds from the raise to exit;
#   hang:  the same script sleeping at step 10 with --progress_timeout_ms=5000: exit 3 and its line.
# Logs and run directories' reports under $OUT; a short table last.
set -uo pipefail
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out" && out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run=dist/bundle/run
py=$(command -v python3)
script=bench/probes/program_gpu_train.py
now() { date +%s.%N; }
keep() {  # NAME: the run directory's small files into $out/NAME/
  mkdir -p "$out/$1" && cp "$out/runs/$1"/{report.json,steps.csv,launcher.log} "$out/$1/" 2>/dev/null
  ls -la "$out/runs/$1" >"$out/$1/ls.txt" 2>&1
}

timeout 60 $run launcher --gpus=1 --run_dir="$out/runs/env" --overwrite -- "$py" tests/programs/show_env.py \
  >"$out/env.log" 2>&1; env_rc=$?

t0=$(now)
timeout 240 $run launcher --gpus=1 --health=strict --run_dir="$out/runs/train" --overwrite -- "$py" "$script" \
  --steps 200 >"$out/train.log" 2>&1; train_rc=$?
train_s=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
keep train

timeout 120 $run launcher --gpus=1 --run_dir="$out/runs/fail" --overwrite -- "$py" "$script" --fail_step 10 \
  >"$out/fail.log" 2>&1; fail_rc=$?
fail_end=$(now)
raised=$(grep -o "raising at [0-9.]*" "$out/fail.log" | awk '{print $3}')
fail_s=$(awk -v a="${raised:-0}" -v b="$fail_end" 'BEGIN { printf "%.2f", b - a }')
keep fail

timeout 120 $run launcher --gpus=1 --progress_timeout_ms=5000 --run_dir="$out/runs/hang" --overwrite -- "$py" \
  "$script" --hang_step 10 >"$out/hang.log" 2>&1; hang_rc=$?
keep hang
rm -rf "$out/runs"

python3 - "$out/train/report.json" >"$out/train_report_summary.txt" 2>&1 <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def find(o, path=""):
    if isinstance(o, dict):
        for k, v in o.items():
            yield from find(v, f"{path}.{k}" if path else k)
    elif isinstance(o, list):
        for i, v in enumerate(o[:2]):
            yield from find(v, f"{path}[{i}]")
    else:
        yield path, o
for k, v in find(r):
    if any(w in k for w in ("step", "tflops", "mfu", "tokens", "samples", "clock", "power", "temp", "throttl", "gpu", "reported")):
        print(f"{k} = {v}")
PY

echo "=== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n 1)"
echo "--- env (exit $env_rc)"; grep -E "CUDA_VISIBLE_DEVICES|LOCAL_RANK=|WORLD_SIZE=|MASTER_PORT|OMP" "$out/env.log" | head -8
echo "--- train (exit $train_rc, ${train_s} s)"; grep -E "rank 0 of|health|stagehand: (step 199|done|FAILED)" "$out/train.log" | tail -5
grep -E "tflops|mfu|samples_per|tokens_per|clock|power|throttl" "$out/train_report_summary.txt" | head -16
echo "steps.csv header: $(head -n 1 "$out/train/steps.csv" 2>/dev/null)"
echo "--- fail (exit $fail_rc, ${fail_s} s from the raise to the launcher's exit)"; tail -n 1 "$out/fail.log"
echo "--- hang (exit $hang_rc)"; tail -n 1 "$out/hang.log"
