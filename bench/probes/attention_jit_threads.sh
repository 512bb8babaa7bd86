#!/usr/bin/env bash
# Does the driver JIT cuDNN's attention kernels on two threads at once, and do kernels warmed on
# synthetic tensors serve the model's pass? bench/probes/attention_jit_threads.py, one process per
# case, each on an empty JIT cache of its own (a fresh machine's). From the repository root on a GPU
# host: OUT=DIR bash bench/probes/attention_jit_threads.sh (CASES to pick cases). Table last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
logs="$tmp/logs"; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/attention_jit_threads.tgz" . 2>/dev/null; rm -rf "$logs" "$tmp/cache_"*; rm -rf "$tmp"' EXIT
py=${PYTHON:-python3}
for fam in gpt llama; do
  for c in ${CASES:-serial threads b1 infer serial}; do
    d="$tmp/cache_${fam}_${c}_$RANDOM"; rm -rf "$d"; mkdir -p "$d"
    CUDA_CACHE_PATH=$d timeout 120 $py bench/probes/attention_jit_threads.py "$c" "$fam" >>"$logs/table.md" 2>>"$logs/$fam.$c.err" \
      || echo "| $fam | $c | failed: $(tail -n 3 "$logs/$fam.$c.err" | tr '\n' ' ' | cut -c1-300) |" >>"$logs/table.md"
    rm -rf "$d"
  done
done
cat "$logs"/*.err | grep -v Warning | head -40
echo "| family | case | warm-up wall ms | fwd ms | bwd ms | model pass 1 fwd/bwd ms | pass 2 | JIT files before / after warm-up / after passes |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
cat "$logs/table.md"
