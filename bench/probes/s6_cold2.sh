#!/usr/bin/env bash
# Issue 16, session 6: (1) the readahead list's union: gpt-1.3b, then tinyllama-1.1b, each 3 steps (the
# worker log's list line says what came from earlier jobs); (2) launch to first step on a dropped page
# cache with this round's code (the merged list; and without it); (3) a Kineto trace of gpt-1.3b's step 0:
# the CPU side's largest items. One tarball; the tables last.
set -uo pipefail
out=${OUT:-/tmp/s6c}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s6c_logs work=/tmp/s6c_runs
export XDG_CACHE_HOME=/tmp/s6c_cache
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s6c.tgz" --exclude="*.pt" --exclude="trace.json" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"' EXIT
run=dist/bundle/run
one() {  # NAME MODEL [ENV=..] -- [FLAGS...]
  local name=$1 model=$2; shift 2; local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  env "${envs[@]}" timeout 120 $run launcher --gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --schedule=1f1b \
    --micro_batches=4 --global_batch=32 --overwrite --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 \
    || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  local first=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('launch_to_first_step_seconds'))" "$work/$name/report.json" 2>/dev/null)
  local st=$(grep -ho "step 0 [0-9.]* s" "$logs/$name.log" | head -1)
  local ra=$(grep -ho "library readahead list: .*" "$logs/$name.log" | sed 's/ written in.*//' | head -1)
  local rb=$(grep -ho "stagehand: library readahead: .*" "$logs/$name.log" | head -1)
  printf "| %s | %s | %s | %s | %s |\n" "$name" "$first" "$st" "$ra" "$rb" >>"$logs/table.md"
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null; rm -rf "$work/$name"
}
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
one gpt_first gpt-1.3b --
one llama_first tinyllama-1.1b --
one gpt_again gpt-1.3b --
drop; one gpt_cold_on1 gpt-1.3b --
drop; one llama_cold_on1 tinyllama-1.1b --
drop; one gpt_cold_off1 gpt-1.3b -- --prefetch_libraries=false
drop; one gpt_cold_on2 gpt-1.3b --
drop; one llama_cold_off1 tinyllama-1.1b -- --prefetch_libraries=false
one gpt_trace0 gpt-1.3b STAGEHAND_KERNEL_TRACE="$logs/step0" STAGEHAND_KERNEL_TRACE_STEP=0 --
python3 - "$logs/step0.rank0.json" >"$logs/step0_cpu.md" <<'PY'
import collections, json, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
xs = [e for e in ev if e.get("ph") == "X" and "dur" in e]
by = collections.defaultdict(lambda: [0.0, 0])
for e in xs:
    k = (e.get("cat", ""), e.get("name", "")[:90]); by[k][0] += e["dur"]; by[k][1] += 1
print("| category | name | total ms | count |"); print("| --- | --- | --- | --- |")
for (c, n), (d, k) in sorted(by.items(), key=lambda kv: -kv[1][0])[:30]:
    if c in ("kernel", "gpu_memcpy", "gpu_memset"): continue
    print(f"| {c} | {n} | {d / 1e3:.1f} | {k} |")
PY
echo "| run | launch to first step s | worker step 0 | list written | read ahead |"; echo "| --- | --- | --- | --- | --- |"; cat "$logs/table.md"
echo; head -32 "$logs/step0_cpu.md"
