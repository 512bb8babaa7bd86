#!/usr/bin/env bash
# Launch to first step with cuDNN's attention kernels built ahead of step 0
# (--prebuild_attention, worker/attention_prebuild.h) against without, on an empty JIT cache of its own
# per job (CUDA_CACHE_PATH: the driver's cache as a fresh machine has it) and on a filled one.
# gpt-1.3b and tinyllama-1.1b, 1 GPU, training (1F1B 4 x 8) and inference; 3 steps each; rows
# interleaved on/off. Then the prebuild's tests (TESTS=0 skips them). From the repository root with
# dist/bundle: OUT=DIR bash bench/probes/attention_prebuild.sh. Logs in one tarball; the table last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs="$tmp/logs" work="$tmp/runs"
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/attention_prebuild.tgz" . 2>/dev/null; rm -rf "$logs" "$work" "$tmp/cache_"*; rm -rf "$tmp"' EXIT
run=dist/bundle/run
one() {  # NAME MODEL KIND CACHE(empty|DIR) ON(true|false)
  local name=$1 model=$2 kind=$3 cache=$4 on=$5
  local args=(--gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --overwrite --run_dir="$work/$name" --prebuild_attention="$on")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64 --micro_batches=4)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  if [ "$cache" = empty ]; then cache="$tmp/cache_$name"; rm -rf "$cache"; mkdir -p "$cache"; fi
  CUDA_CACHE_PATH=$cache timeout 180 $run launcher "${args[@]}" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  local files=$(find "$cache" -type f | wc -l)
  python3 - "$work/$name" "$name" "$files" >>"$logs/table.md" <<'PY'
import csv, json, sys
d, name, files = sys.argv[1:4]
try:
    first = json.load(open(f"{d}/report.json")).get("launch_to_first_step_seconds")
    steps = [float(r["seconds"]) for r in csv.DictReader(open(f"{d}/steps.csv"))]
    peak = max(float(r.get("peak_memory_bytes") or 0) for r in csv.DictReader(open(f"{d}/steps.csv"))) / 2**30
    print(f"| {name} | {float(first):.2f} | {steps[0]:.2f} | {steps[-1]:.4f} | {peak:.2f} | {files} |")
except Exception as e:
    print(f"| {name} | failed: {e} | | | | {files} |")
PY
  grep -h "attention kernels built" "$work/$name"/*.log "$logs/$name.log" 2>/dev/null | head -1 | cut -c1-400 >>"$logs/prebuild_lines.txt"
  cp -r "$work/$name" "$logs/$name.run" 2>/dev/null; rm -rf "$logs/$name.run"/*.pt "$work/$name"
}
mkdir -p "$tmp/cache_shared"
one warmup_fill gpt-1.3b train "$tmp/cache_shared" true   # page cache and readahead list, JIT cache shared below
for r in 1 2; do
  one gpt_train_cold_on$r gpt-1.3b train empty true
  one gpt_train_cold_off$r gpt-1.3b train empty false
done
one gpt_train_warm_on gpt-1.3b train "$tmp/cache_shared" true
one gpt_train_warm_off gpt-1.3b train "$tmp/cache_shared" false
one llama_train_cold_on tinyllama-1.1b train empty true
one llama_train_cold_off tinyllama-1.1b train empty false
one gpt_infer_cold_on gpt-1.3b infer empty true
one gpt_infer_cold_off gpt-1.3b infer empty false
one llama_infer_cold_on tinyllama-1.1b infer empty true
one llama_infer_cold_off tinyllama-1.1b infer empty false
if [ "${TESTS:-1}" = 1 ]; then
  dist/bundle/run attention_prebuild_test >"$logs/attention_prebuild_test.log" 2>&1; echo "attention_prebuild_test rc $?: $(grep -E '^\[  (PASSED|FAILED|  SKIPPED)' "$logs/attention_prebuild_test.log" | tr '\n' ' ')"
fi
echo; cat "$logs/prebuild_lines.txt"; echo
echo "| run | launch to first step s | step 0 s | step 2 s | peak GiB | JIT cache files |"; echo "| --- | --- | --- | --- | --- | --- |"
cat "$logs/table.md"
