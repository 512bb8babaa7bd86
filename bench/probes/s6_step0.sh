#!/usr/bin/env bash
# Issue 16, session 6: where step 0's extra second goes (warm host: page cache and JIT cache filled by a
# first launch). Each row: launch to first step, step 0, and the first micro-batch's forward and
# backward and the first optimizer step from trace.json, against the same of step 1. gpt-1.3b 1F1B 4 x 8
# unless the row says; logs in one tarball; the table last.
set -uo pipefail
out=${OUT:-/tmp/s6s}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s6s_logs work=/tmp/s6s_runs
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s6s.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
one() {  # NAME MODEL KIND [ENV=..] -- [FLAGS...]
  local name=$1 model=$2 kind=$3; shift 3; local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local args=(--gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --overwrite --run_dir="$work/$name")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64 --micro_batches=4)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  env "${envs[@]}" timeout 120 $run launcher "${args[@]}" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  python3 - "$work/$name" "$name" >>"$logs/table.md" <<'PY'
import csv, json, sys
d, name = sys.argv[1], sys.argv[2]
try:
    first = json.load(open(f"{d}/report.json")).get("launch_to_first_step_seconds")
    steps = list(csv.DictReader(open(f"{d}/steps.csv")))
    t = json.load(open(f"{d}/trace.json")); ev = t["traceEvents"] if isinstance(t, dict) else t
    xs = sorted((e for e in ev if e.get("ph") == "X" and e.get("name") != "idle"), key=lambda e: e["ts"])
    def nth(label, i):
        hits = [e for e in xs if e.get("name") == label]
        return f"{hits[i]['dur'] / 1e3:.0f}" if len(hits) > i else ""
    f0 = next((e["name"] for e in xs if e["name"].endswith("F0")), "0F0")
    b0 = f0[:-2] + "B0"
    print(f"| {name} | {float(first):.3f} | {float(steps[0]['seconds']):.3f} | {float(steps[1]['seconds']):.3f} | "
          f"{nth(f0, 0)} / {nth(f0, 1)} | {nth(b0, 0)} / {nth(b0, 1)} | {nth('OPT', 0)} / {nth('OPT', 1)} |")
except Exception as e:
    print(f"| {name} | failed: {e} | | | | | |")
PY
  rm -rf "$work/$name"
}
rows=${S6_STEP0_ROWS:-full}
if [ "$rows" = full ]; then
  one fill gpt-1.3b train --
  one base gpt-1.3b train --
  one noresid gpt-1.3b train -- --model_option=fused_residual_gemm=false
  one flash gpt-1.3b train -- --attention=flash
  one eager gpt-1.3b train CUDA_MODULE_LOADING=EAGER --
  one nographs gpt-1.3b train -- --cuda_graphs=false
  one base2 gpt-1.3b train --
  one infer gpt-1.3b infer --
  one llama_fill tinyllama-1.1b train --
  one llama tinyllama-1.1b train --
else  # short: the second launch of each is the warm figure
  one fill gpt-1.3b train --
  one base gpt-1.3b train --
  one infer_fill gpt-1.3b infer --
  one infer gpt-1.3b infer --
  one llama_fill tinyllama-1.1b train --
  one llama tinyllama-1.1b train --
  one llama_infer_fill tinyllama-1.1b infer --
  one llama_infer tinyllama-1.1b infer --
fi
echo "| row | launch to first step s | step 0 s | step 1 s | F0 ms (step 0 / 1) | B0 ms | OPT ms |"
echo "| --- | --- | --- | --- | --- | --- | --- |"; cat "$logs/table.md"
