#!/usr/bin/env bash
# Issue 16, session 5, call 3 on one H200: the merged training changes (batched casts, in-place embedding
# gradient, s5-kern's backward kernels): CUDA tests, loss checks, and training beside torch.compile for
# gpt-1.3b and tinyllama-1.1b (bench/bench_pipeline, same call). One tarball; tables last.
set -uo pipefail
out=${OUT:-/tmp/s5c3}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s5c3_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s5c3.tgz" --exclude="*.pt" --exclude="trace.json" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
timeout 60 $run bias_grad_test >"$logs/bias_grad_test.log" 2>&1; echo "bias_grad_test rc $?"
timeout 60 $run embedding_grad_test >"$logs/embedding_grad_test.log" 2>&1; echo "embedding_grad_test rc $?"
timeout 120 $run gpt_stage_test --gtest_filter='*Cuda*' >"$logs/gpt_stage_test.log" 2>&1; echo "gpt_stage_test *Cuda* rc $?"
timeout 120 $run llama_stage_test --gtest_filter='*Cuda*' >"$logs/llama_stage_test.log" 2>&1; echo "llama_stage_test *Cuda* rc $?"
grep -hE "^\[  FAILED|Failure" "$logs"/*_test.log | head -8
PIPELINE_CHECK_ONLY='^(train_1gpu|llama_train_1gpu|fused_norm_backward_1gpu|llama_fused_norm_backward_1gpu|llama_fused_embedding_grad_1gpu|fused_gelu_1gpu|fused_bias_grad_1gpu) ' \
  OUT="$logs/check" timeout 200 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$logs/check.log"
for fam in gpt llama; do
  BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 260 bench/bench_pipeline $fam train_1gpu train_1gpu_compile >"$logs/bench_$fam.txt" 2>&1
done
for fam in gpt llama; do echo "== $fam"; sed -n '/^| run/,$p' "$logs/bench_$fam.txt"; done
