#!/usr/bin/env bash
# One device call of the one-GPU speed issue: startup before/after, the GPU checks, and a kernel-by-kernel
# summary of an eager step. Logs tarred under $OUT (few files come back); the tables printed last.
set -uo pipefail
o=/tmp/call1
rm -rf "$o" && mkdir -p "$o"
OUT=$o/startup bash bench/probes/startup_one_gpu.sh >"$o/startup.txt" 2>&1
OUT=$o/check bash tests/gpu/pipeline_gpu_check.sh >"$o/check.txt" 2>&1
dist/bundle/run gpt_stage_test --gtest_filter='*Cuda*' >"$o/gpt_stage_test.txt" 2>&1; echo "gpt_stage_test rc $?" >>"$o/check.txt"
dist/bundle/run llama_stage_test --gtest_filter='*Cuda*' >"$o/llama_stage_test.txt" 2>&1; echo "llama_stage_test rc $?" >>"$o/check.txt"
OUT=$o/kernels timeout 240 bash bench/probes/kernel_summary.sh gpt-1.3b 2 >"$o/kernels.txt" 2>&1
tar -czf "$OUT/call1.tgz" -C /tmp call1
cat "$o/startup.txt" "$o/check.txt"
tail -n 50 "$o/kernels.txt"
