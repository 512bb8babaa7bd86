#!/usr/bin/env bash
# The GEMM microbenchmarks' kernels timed in turn (interleaved rounds, the median;
# bench_timing.h's BenchInterleavedMs) so that kernels a few per cent apart are ranked: the residual
# GEMM's four shapes, then inference's fc1 + GELU. From the repository root with dist/bundle:
# OUT=DIR bash bench/probes/gemm_interleave.sh. One tarball; the medians last.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
logs="$tmp/logs"; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/gemm_interleave.tgz" . 2>/dev/null; rm -rf "$logs"; rm -rf "$tmp"' EXIT
run=dist/bundle/run
timeout 200 $run residual_gemm_bench interleave 9 >"$logs/residual_interleave.txt" 2>&1; echo "residual rc $?"
timeout 200 $run gemm_gelu_bench interleave 9 >"$logs/gelu_interleave.txt" 2>&1; echo "gelu rc $?"
cat "$logs/residual_interleave.txt" "$logs/gelu_interleave.txt"
