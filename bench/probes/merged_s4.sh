#!/usr/bin/env bash
# Session 4's merged one-GPU speed work on one H200: the CUDA tests, the loss checks of this round's
# options, our rows (everything on; this round's options off), and a kernel trace of a training step.
set -uo pipefail
out=${OUT:-/tmp/merged_s4}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/merged_s4_logs; rm -rf "$logs"; mkdir -p "$logs"
timeout 150 dist/bundle/run gpt_stage_test --gtest_filter='*Cuda*:FusedLoss.*:LowersDenseWeights.*' >"$logs/gpt_stage_test.log" 2>&1; echo "gpt_stage_test rc $?"
timeout 90 dist/bundle/run llama_stage_test --gtest_filter='*Cuda*' >"$logs/llama_stage_test.log" 2>&1; echo "llama_stage_test rc $?"
[ -x dist/bundle/bin/bias_grad_test ] && { timeout 60 dist/bundle/run bias_grad_test >"$logs/bias_grad_test.log" 2>&1; echo "bias_grad_test rc $?"; }
grep -hE "^\[  FAILED|Failure" "$logs"/*_test.log | head -10
PIPELINE_CHECK_ONLY='fused_bias_grad|fused_residual_gemm|fused_norm_backward' OUT="$logs/check" timeout 300 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$logs/check.log"
off=--model_option=fused_residual_gemm=false,fused_bias_grad=false
OUT="$out" bash bench/probes/rows.sh gpt_train:gpt-1.3b:train gpt_train_off:gpt-1.3b:train:$off \
  gpt_infer:gpt-1.3b:infer gpt_infer_off:gpt-1.3b:infer:$off gpt_train2:gpt-1.3b:train gpt_infer2:gpt-1.3b:infer \
  llama_train:tinyllama-1.1b:train llama_infer:tinyllama-1.1b:infer
STAGEHAND_KERNEL_TRACE=/tmp/tr_train timeout 120 dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --run_dir=/tmp/tr_train_run >/dev/null 2>&1
python3 bench/probes/trace_summary.py /tmp/tr_train.rank0.json ours_train_merged 16 | tee "$logs/trace_train.md"
tar -C "$logs" -czf "$out/logs.tgz" . 2>/dev/null; rm -rf "$logs" /tmp/tr_train* 
