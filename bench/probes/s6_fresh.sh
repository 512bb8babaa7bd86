#!/usr/bin/env bash
# Issue 16, session 6: why the first launch on a fresh machine (4.2-5.4 s to the first step) is slower
# than any launch on a dropped page cache (2.3-3.6 s). Hypothesis: the CUDA driver's JIT cache
# (~/.nv/ComputeCache, on disk, so drop_caches keeps it) is empty on a fresh machine, and cuDNN's
# runtime-compiled attention kernels are JIT-compiled into it in step 0. gpt-1.3b, 1F1B 4 x 8, 3 steps;
# the worker's startup line and the cache's size per run; ledgers in one tarball; the table last.
set -uo pipefail
out=${OUT:-/tmp/s6f}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s6f_logs work=/tmp/s6f_runs
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s6f.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
jit=${CUDA_CACHE_PATH:-$HOME/.nv/ComputeCache}
size() { du -sk "$jit" 2>/dev/null | cut -f1; }
echo "JIT cache $jit before anything: $(size) KiB; $(ls "$HOME/.nv" 2>&1 | head -3)"
one() {  # NAME [ENV=..] -- [FLAGS...]
  local name=$1; shift; local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  local t0=$(date +%s.%N)
  env "${envs[@]}" timeout 120 $run launcher --gpus=1 --model=gpt-1.3b --steps=3 --pipeline_stages=1 --schedule=1f1b \
    --micro_batches=4 --global_batch=32 --overwrite --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 \
    || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  local first=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('launch_to_first_step_seconds'))" "$work/$name/report.json" 2>/dev/null)
  local st=$(grep -rho "startup: .*" "$work/$name" "$logs/$name.log" 2>/dev/null | head -1 | cut -c1-230)
  printf "| %s | %s | %s | %s |\n" "$name" "$first" "$(size)" "$st" >>"$logs/table.md"
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null
  cp -r "$work/$name" "$logs/$name.run" 2>/dev/null; rm -rf "$work/$name" "$logs/$name.run"/*.pt
}
one fresh0 --
one warm1 --
one nojit1 CUDA_CACHE_DISABLE=1 --
one nojit_flash CUDA_CACHE_DISABLE=1 -- --attention=flash
one flash1 --  --attention=flash
one warm2 --
find "$jit" -type f 2>/dev/null | head -5 > "$logs/jit_files.txt"; find "$jit" -type f 2>/dev/null | wc -l >> "$logs/jit_files.txt"
echo "| run | launch to first step s | JIT cache KiB after | worker startup line |"; echo "| --- | --- | --- | --- |"; cat "$logs/table.md"
