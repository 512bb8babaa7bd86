#!/usr/bin/env bash
# Issue 16, session 7, call 1 (one H200): (a) which attention kernels --attention=flash runs now (the fix
# 481b0fa; s6_flashcheck.sh); (b) the residual GEMM's candidates under the power limit
# (worker:residual_gemm_bench: the model's cuBLASLt choice, all of cuBLASLt's, the CUTLASS kernels);
# (c) gpt-1.3b inference variants of ours (micro-batches, attention, the residual GEMM off), each
# the mean of steps 3..11 with the clock and power of steps.csv. Logs in one tarball; tables last.
set -uo pipefail
out=${OUT:-/tmp/s7c1}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s7c1_logs work=/tmp/s7c1_runs
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s7c1.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader | tee "$logs/gpu.txt"

timeout 200 bash bench/probes/s6_flashcheck.sh >"$logs/flashcheck.txt" 2>&1
timeout 300 $run residual_gemm_bench 20 150 >"$logs/residual_gemm_bench.txt" 2>"$logs/residual_gemm_bench.err"
echo "residual_gemm_bench rc $?" >>"$logs/residual_gemm_bench.err"

one() {  # NAME FLAGS...: gpt-1.3b inference, 64 sequences, 12 steps
  local name=$1; shift
  timeout 120 $run launcher --gpus=1 --model=gpt-1.3b --steps=12 --pipeline_stages=1 --inference --global_batch=64 \
    --overwrite --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  cp "$work/$name/steps.csv" "$logs/$name.steps.csv" 2>/dev/null
  python3 - "$work/$name" "$name" "$*" >>"$logs/infer.md" <<'PY'
import csv, sys
d, name, flags = sys.argv[1:4]
try:
    rows = [r for r in csv.DictReader(open(f"{d}/steps.csv")) if 3 <= int(r["step"]) < 12]
    mean = lambda k: sum(float(r[k]) for r in rows if r.get(k)) / max(1, sum(1 for r in rows if r.get(k)))
    extra = " | ".join(f"{k} {mean(k):.0f}" for k in rows[0] if any(w in k for w in ("mhz", "clock", "power")))
    peak = max(int(r["peak_memory_bytes"]) for r in rows) / 2**30
    print(f"| {name} | {flags} | {mean('seconds'):.4f} | {peak:.1f} | {extra} |")
except Exception as e:
    print(f"| {name} | {flags} | failed: {e} | | |")
PY
  rm -rf "${work:?}/$name"
}
one base --micro_batches=4
one m2 --micro_batches=2
one flash --micro_batches=4 --attention=flash
one noresid --micro_batches=4 --model_option=fused_residual_gemm=false
one m8 --micro_batches=8
one base2 --micro_batches=4

echo "== flash check"; cat "$logs/flashcheck.txt"
echo "== residual GEMM (ms under the power limit; vs model = the model's time / this one's)"
cat "$logs/residual_gemm_bench.txt"; tail -n 3 "$logs/residual_gemm_bench.err"
echo "== gpt-1.3b inference, ours"
echo "| row | flags | step s | peak GiB | telemetry |"; echo "| --- | --- | --- | --- | --- |"; cat "$logs/infer.md"
