#!/usr/bin/env bash
# Issue 16, session 9: does the driver JIT cuDNN's attention kernels on two threads at once, and do
# kernels warmed on synthetic tensors serve the model's pass? bench/probes/s9_jit.py, one process per
# case, each on an empty JIT cache of its own (a fresh machine's). Table last.
set -uo pipefail
out=${OUT:-/tmp/s9j}; mkdir -p "$out"
logs=/tmp/s9j_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s9j.tgz" . 2>/dev/null; rm -rf "$logs" /tmp/s9j_cache_*' EXIT
py=${PYTHON:-python3}
for fam in gpt llama; do
  for c in ${S9_CASES:-serial threads b1 infer serial}; do
    d=/tmp/s9j_cache_${fam}_${c}_$RANDOM; rm -rf "$d"; mkdir -p "$d"
    CUDA_CACHE_PATH=$d timeout 120 $py bench/probes/s9_jit.py "$c" "$fam" >>"$logs/table.md" 2>>"$logs/$fam.$c.err" \
      || echo "| $fam | $c | failed: $(tail -n 3 "$logs/$fam.$c.err" | tr '\n' ' ' | cut -c1-300) |" >>"$logs/table.md"
    rm -rf "$d"
  done
done
cat "$logs"/*.err | grep -v Warning | head -40
echo "| family | case | warm-up wall ms | fwd ms | bwd ms | model pass 1 fwd/bwd ms | pass 2 | JIT files before / after warm-up / after passes |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
cat "$logs/table.md"
