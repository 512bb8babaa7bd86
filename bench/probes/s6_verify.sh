#!/usr/bin/env bash
# Issue 16, session 6: the shared cuBLASLt algorithm choice (lt_gemm.cc: one timing per shape, not per
# layer) on one H200: the residual GEMM's CUDA tests, the residual-GEMM loss checks, and step 0 of a
# second inference launch (is the first inference's slow first chunk a one-time JIT?). The table last.
set -uo pipefail
out=${OUT:-/tmp/s6v}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s6v_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s6v.tgz" --exclude="*.pt" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
timeout 150 $run gpt_stage_test --gtest_filter='DenseCuda.*' >"$logs/gpt_stage_test.log" 2>&1
echo "gpt_stage_test DenseCuda.* rc $? ($(grep -c '^\[       OK' "$logs/gpt_stage_test.log") ok)"
grep -hE "^\[  FAILED|Failure" "$logs"/*_test.log | head -8
PIPELINE_CHECK_ONLY='^(fused_residual_gemm_1gpu|llama_fused_residual_gemm_1gpu) ' OUT="$logs/check" timeout 150 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1
grep -E "^(PASS|FAIL)" "$logs/check.log"
S6_STEP0_ROWS=short OUT="$logs/s0" bash bench/probes/s6_step0.sh 2>&1 | tail -n 14
