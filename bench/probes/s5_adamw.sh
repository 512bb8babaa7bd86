#!/usr/bin/env bash
# Issue 16, session 5: adamw_test on one H200, and a kernel trace of a gpt-1.3b training step (the
# optimizer's launches, and that the cast refresh finds the copies current).
set -uo pipefail
out=${OUT:-/tmp/s5a}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s5a_logs work=/tmp/s5a_runs; rm -rf "$logs" "$work"; mkdir -p "$logs/t" "$work"
trap 'gzip "$logs"/t/*.json 2>/dev/null; tar -C "$logs" -czf "$out/s5a.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
timeout 90 $run adamw_test >"$logs/adamw_test.log" 2>&1; echo "adamw_test rc $?"
grep -hE "Failure|worst difference|OK \]|FAILED" "$logs/adamw_test.log" | head -14
STAGEHAND_KERNEL_TRACE=$logs/t/ours_train timeout 120 $run launcher --gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 \
  --schedule=1f1b --micro_batches=4 --global_batch=32 --run_dir="$work/train" >"$logs/t/ours_train.log" 2>&1; echo "launcher rc $?"
python3 bench/probes/trace_summary.py "$logs/t/ours_train.rank0.json" ours_train 40 | tee "$logs/t/summary.md" | grep -E "span|optimizer|multi_tensor|AdamW|copy|gemm \||norm \||other \||reduce \||add/mul"
