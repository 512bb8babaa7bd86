#!/usr/bin/env bash
# The residual GEMM with its algorithm timed (fastest of eight): its CUDA test, gpt-1.3b rows on and off,
# and a kernel trace of an inference step with it on.
set -uo pipefail
out=${OUT:-/tmp/resid_s4b}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 120 dist/bundle/run gpt_stage_test --gtest_filter='DenseCuda.*' >"$out/gpt_stage_test.log" 2>&1; echo "DenseCuda rc $?"
off=--model_option=fused_residual_gemm=false
OUT="$out" bash bench/probes/rows.sh gpt_infer:gpt-1.3b:infer gpt_infer_off:gpt-1.3b:infer:$off \
  gpt_train:gpt-1.3b:train gpt_train_off:gpt-1.3b:train:$off gpt_infer2:gpt-1.3b:infer gpt_train2:gpt-1.3b:train
STAGEHAND_KERNEL_TRACE=/tmp/tr_infer timeout 120 dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4 --run_dir=/tmp/tr_infer_run >/dev/null 2>&1
python3 bench/probes/trace_summary.py /tmp/tr_infer.rank0.json ours_infer_resid 12
