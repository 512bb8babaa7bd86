#!/usr/bin/env bash
# Our one-GPU rows, side by side in one call: each argument is NAME:MODEL:KIND[:FLAGS], KIND train (1F1B,
# 4 x 8) or infer (4 x 16), FLAGS comma-free launcher flags joined by '+' (e.g.
# gpt_off:gpt-1.3b:train:--model_option=fused_residual_gemm=false). Each row: mean of steps 3..10,
# peak memory, last loss, launch to first step. Logs and steps.csv in $OUT/rows.tgz; the table last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}
work="$tmp/rows_runs"; rm -rf "$work"; mkdir -p "$out" "$work"
trap 'rm -rf "$work"; rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for spec in "$@"; do
  IFS=: read -r name model kind flags <<<"$spec"
  args=(--gpus=1 --model="$model" --steps=11 --pipeline_stages=1 --overwrite --run_dir="$work/$name")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64 --micro_batches=4)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  [ -n "$flags" ] && IFS=+ read -ra extra <<<"$flags" && args+=("${extra[@]}")
  timeout 150 dist/bundle/run launcher "${args[@]}" >"$work/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 3 "$work/$name.log")"
done
python3 - "$work" "$@" <<'PY' | tee "$work/table.md"
import csv, json, os, sys
work = sys.argv[1]
print("| row | step s | peak GiB | last loss | launch to first step s |")
print("| --- | --- | --- | --- | --- |")
for spec in sys.argv[2:]:
    name = spec.split(":")[0]
    try:
        rows = list(csv.DictReader(open(f"{work}/{name}/steps.csv")))
        secs = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) < 11]
        peak = max(int(r["peak_memory_bytes"]) for r in rows) / 2**30
        losses = [r["loss"] for r in rows if r["loss"]]
        first = json.load(open(f"{work}/{name}/report.json")).get("launch_to_first_step_seconds", "")
        print(f"| {name} | {sum(secs) / len(secs):.4f} | {peak:.1f} | {losses[-1] if losses else ''} | {first} |")
    except Exception as e:
        print(f"| {name} | failed: {e} | | | |")
PY
tar -C "$work" -czf "$out/rows.tgz" --exclude='*.pt' --exclude='checkpoints' . 2>/dev/null
