#!/usr/bin/env bash
# Issue 16, session 5, call 2 on one H200: the batched bf16 casts and the in-place embedding gradient.
# CUDA tests, losses with fused_embedding_grad on and off (gpt, llama), a traced gpt-1.3b training step,
# and our training row. One tarball.
set -uo pipefail
out=${OUT:-/tmp/s5c2}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s5c2_logs; rm -rf "$logs"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/s5c2.tgz" --exclude="*.pt" . 2>/dev/null; rm -rf "$logs"' EXIT
run=dist/bundle/run
for t in embedding_grad_test nn_clip_test; do
  timeout 60 $run $t >"$logs/$t.log" 2>&1; echo "$t rc $?"; grep -hE "^\[  FAILED|Failure|SKIPPED" "$logs/$t.log" | head -5
done
PIPELINE_CHECK_ONLY='fused_embedding_grad' OUT="$logs/check" timeout 150 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$logs/check.log"
OUT="$logs/rows" bash bench/probes/rows.sh gpt_train:gpt-1.3b:train gpt_train_emb_off:gpt-1.3b:train:--model_option=fused_embedding_grad=false
work=/tmp/s5c2_runs; rm -rf "$work"; mkdir -p "$work" "$logs/t"
STAGEHAND_KERNEL_TRACE=$logs/t/ours_train timeout 120 $run launcher --gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 \
  --schedule=1f1b --micro_batches=4 --global_batch=32 --run_dir="$work/train" >"$logs/t/ours_train.log" 2>&1
[ -f "$logs/t/ours_train.rank0.json" ] && python3 bench/probes/trace_summary.py "$logs/t/ours_train.rank0.json" ours_train 30 | tee "$logs/t/summary.md" | head -60
gzip "$logs"/t/*.json; rm -rf "$work"
