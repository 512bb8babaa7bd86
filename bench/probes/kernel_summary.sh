#!/usr/bin/env bash
# Where a training step's GPU time goes, kernel by kernel: ncu (duration only, clocks left alone) over a
# short eager gpt-1.3b-shaped job (LAYERS blocks, 1F1B, 4 micro-batches of 8, 2 steps), summed by kernel
# name and divided by the steps. Usage on the GPU host: bench/probes/kernel_summary.sh [MODEL] [LAYERS]
# [FLAGS...]; writes $OUT/kernels.csv (raw) and prints the top kernels last.
set -uo pipefail
out=${OUT:-/tmp/kernel_summary}
mkdir -p "$out"
model=${1:-gpt-1.3b}
layers=${2:-2}
shift 2 2>/dev/null || true
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
"$ncu" --target-processes all --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  --log-file "$out/ncu.log" dist/bundle/run launcher --gpus=1 --model="$model" --layers="$layers" --steps=2 \
  --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --cuda_graphs=false --overwrite \
  --run_dir=/tmp/runs/kernels "$@" >"$out/launcher.log" 2>&1
echo "ncu rc $?"
python3 - "$out/ncu.log" "$model" "$layers" <<'PY'
import csv, collections, sys
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
by = collections.defaultdict(lambda: [0, 0.0])
for r in csv.DictReader(rows):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    name = r["Kernel Name"][:110]
    by[name][0] += 1
    by[name][1] += float(r["Metric Value"]) / 1e6  # ns -> ms
total = sum(v[1] for v in by.values())
print(f"{sys.argv[2]}, {sys.argv[3]} blocks, eager, 2 steps (init and profile included): {total:.1f} ms of kernels")
print("| ms (2 steps) | share | count | kernel |")
print("| --- | --- | --- | --- |")
for name, (n, ms) in sorted(by.items(), key=lambda kv: -kv[1][1])[:45]:
    print(f"| {ms:.2f} | {100 * ms / total:.1f}% | {n} | {name} |")
PY
