#!/usr/bin/env bash
# Issue 16, session 5: the review fixes on one H200: the CUDA tests, the fused_optimizer loss check, and
# gpt-1.3b without CUDA graphs (gradients set to None each step: the optimizer's table is rebuilt every
# step, through pinned memory) with fused_optimizer on and off. One tarball; the table last.
set -uo pipefail
out=${OUT:-/tmp/s5r}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s5r_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s5r.tgz" --exclude="*.pt" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
for t in adamw_test nn_clip_test embedding_grad_test bias_grad_test; do
  timeout 90 $run $t >"$logs/$t.log" 2>&1; echo "$t rc $? ($(grep -c '^\[       OK' "$logs/$t.log") ok)"
done
grep -hE "^\[  FAILED|Failure" "$logs"/*_test.log | head -8
PIPELINE_CHECK_ONLY='^(fused_optimizer_1gpu|fused_embedding_grad_1gpu) ' OUT="$logs/check" timeout 100 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1
grep -E "^(PASS|FAIL)" "$logs/check.log"
OUT="$logs/rows" bash bench/probes/rows.sh gpt_graphs:gpt-1.3b:train gpt_nographs:gpt-1.3b:train:--cuda_graphs=false \
  gpt_nographs_optoff:gpt-1.3b:train:--cuda_graphs=false+--model_option=fused_optimizer=false
