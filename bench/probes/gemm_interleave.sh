#!/usr/bin/env bash
# Issue 16, session 7: the GEMM microbenchmarks' kernels timed in turn (interleaved rounds, the median;
# bench_timing.h's BenchInterleavedMs) so that kernels a few per cent apart are ranked: the residual
# GEMM's four shapes, then inference's fc1 + GELU. One tarball; the medians last.
set -uo pipefail
out=${OUT:-/tmp/s7il}; mkdir -p "$out"
logs=/tmp/s7il_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s7il.tgz" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
timeout 200 $run residual_gemm_bench interleave 9 >"$logs/residual_interleave.txt" 2>&1; echo "residual rc $?"
timeout 200 $run gemm_gelu_bench interleave 9 >"$logs/gelu_interleave.txt" 2>&1; echo "gelu rc $?"
cat "$logs/residual_interleave.txt" "$logs/gelu_interleave.txt"
