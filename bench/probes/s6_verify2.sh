#!/usr/bin/env bash
# Issue 16, session 6, after review (9f5fcf8): the residual GEMM's CUDA tests and loss checks with the
# reworked timing (best of 3 x 3, only a timed choice shared), and three launches (gpt, tinyllama, gpt)
# for step 0 and the readahead list's line (the union, merged under an flock). The table last.
set -uo pipefail
out=${OUT:-/tmp/s6v2}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s6v2_logs work=/tmp/s6v2_runs; rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s6v2.tgz" --exclude="*.pt" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
timeout 150 $run gpt_stage_test --gtest_filter='DenseCuda.*' >"$logs/gpt_stage_test.log" 2>&1
echo "gpt_stage_test DenseCuda.* rc $? ($(grep -c '^\[       OK' "$logs/gpt_stage_test.log") ok)"
timeout 150 $run llama_stage_test --gtest_filter='*Cuda*' >"$logs/llama_stage_test.log" 2>&1
echo "llama_stage_test *Cuda* rc $? ($(grep -c '^\[       OK' "$logs/llama_stage_test.log") ok)"
grep -hE "^\[  FAILED|Failure" "$logs"/*_test.log | head -8
PIPELINE_CHECK_ONLY='^(fused_residual_gemm_1gpu|llama_fused_residual_gemm_1gpu) ' OUT="$logs/check" timeout 150 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1
grep -E "^(PASS|FAIL)" "$logs/check.log"
for spec in gpt1:gpt-1.3b llama1:tinyllama-1.1b gpt2:gpt-1.3b; do
  IFS=: read -r name model <<<"$spec"
  timeout 120 $run launcher --gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 \
    --global_batch=32 --overwrite --run_dir="$work/$name" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  first=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('launch_to_first_step_seconds'))" "$work/$name/report.json" 2>/dev/null)
  printf "| %s | %s | %s | %s |\n" "$name" "$first" "$(grep -ho 'step 0 [0-9.]* s' "$logs/$name.log" | head -1)" \
    "$(grep -ho 'library readahead list: .*' "$logs/$name.log" | sed 's/, written in.*//' | head -1)" >>"$logs/table.md"
done
ls -a "${XDG_CACHE_HOME:-$HOME/.cache}/stagehand/readahead/" | head
echo "| run | launch to first step s | worker step 0 | list |"; echo "| --- | --- | --- | --- |"; cat "$logs/table.md"
