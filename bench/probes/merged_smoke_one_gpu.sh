#!/usr/bin/env bash
# One GPU, the merged code of 2026-12-01's second session through the bundle: the README's first
# command (`run launcher`, no flags: gpt-1.3b, 30 steps) for the startup ledger and the step time,
# then tinyllama-1.1b's launch to first step, then the telemetry probe (bench/probes/telemetry_one_gpu.sh).
# Logs under $OUT; a short table last.
set -uo pipefail
out=${OUT:-/tmp/merged_smoke}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
dist/bundle/run launcher --run_dir="$out/bare" >"$out/bare.log" 2>&1; bare_rc=$?
dist/bundle/run launcher --model=tinyllama-1.1b --steps=10 --run_dir="$out/llama" >"$out/llama.log" 2>&1; llama_rc=$?
OUT="$out/telemetry" bash bench/probes/telemetry_one_gpu.sh >"$out/telemetry.log" 2>&1; tel_rc=$?
first() { awk '/first_step/{getline; print $NF}' "$1"; }
echo "=== bare (exit $bare_rc)"; grep -E "s/step|first_step|done|FAILED" -A1 "$out/bare.log" | tail -6
echo "=== tinyllama (exit $llama_rc)"; grep -E "s/step|first_step|done|FAILED" -A1 "$out/llama.log" | tail -6
echo "=== telemetry (exit $tel_rc)"; tail -n 25 "$out/telemetry.log"
tar -C "$out" -czf "$out/../merged_smoke_logs.tgz" . 2>/dev/null; mv "$out/../merged_smoke_logs.tgz" "$out/" 2>/dev/null
