#!/usr/bin/env bash
# Issue 16, session 5: launch to first training step on a dropped page cache for tinyllama-1.1b (and
# gpt-1.3b once more), with and without the library readahead. warm0 is the machine's first launch
# (it writes the list). One H200; ledgers in one tarball; the table last.
set -uo pipefail
out=${OUT:-/tmp/s5cl}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s5cl_logs work=/tmp/s5cl_runs
export XDG_CACHE_HOME=/tmp/s5cl_cache
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s5cl.tgz" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"' EXIT
run=dist/bundle/run
cold() {  # NAME MODEL [FLAGS...]
  local name=$1 model=$2; shift 2
  timeout 120 $run launcher --gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 \
    --global_batch=32 --overwrite --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  printf "| %s | %s |\n" "$name" "$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('launch_to_first_step_seconds'))" "$work/$name/report.json" 2>/dev/null)" >>"$logs/cold.md"
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null; rm -rf "$work/$name"
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
cold llama_warm0 tinyllama-1.1b
cold gpt_warm0 gpt-1.3b
for i in 1 2; do
  drop; cold llama_cold_on$i tinyllama-1.1b
  drop; cold llama_cold_off$i tinyllama-1.1b --prefetch_libraries=false
done
drop; cold gpt_cold_on1 gpt-1.3b
echo "| run | launch to first step s |"; echo "| --- | --- |"; cat "$logs/cold.md"
