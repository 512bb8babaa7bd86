#!/usr/bin/env bash
# The residual GEMM (fused_residual_gemm) on one H200: its CUDA tests, the models' CUDA tests, the loss
# checks on and off, and gpt-1.3b / tinyllama-1.1b rows with it on and off.
set -uo pipefail
out=${OUT:-/tmp/resid_s4}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
timeout 120 dist/bundle/run gpt_stage_test --gtest_filter='DenseCuda.*:GptStageCuda.*:FusedKernelsCuda.*' >"$out/gpt_stage_test.log" 2>&1; echo "gpt_stage_test rc $?"
timeout 90 dist/bundle/run llama_stage_test --gtest_filter='*Cuda*' >"$out/llama_stage_test.log" 2>&1; echo "llama_stage_test rc $?"
grep -E "FAILED|Failure|rel\(|Expected|Which is" "$out/gpt_stage_test.log" | head -20
PIPELINE_CHECK_ONLY=fused_residual_gemm OUT="$out/check" timeout 200 bash tests/gpu/pipeline_gpu_check.sh >"$out/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$out/check.log"
off=--model_option=fused_residual_gemm=false
OUT="$out" bash bench/probes/rows.sh gpt_train:gpt-1.3b:train gpt_train_off:gpt-1.3b:train:$off \
  gpt_infer:gpt-1.3b:infer gpt_infer_off:gpt-1.3b:infer:$off gpt_train2:gpt-1.3b:train gpt_infer2:gpt-1.3b:infer \
  llama_train:tinyllama-1.1b:train llama_train_off:tinyllama-1.1b:train:$off llama_infer:tinyllama-1.1b:infer
tar -C "$out" -czf "$out/logs.tgz" gpt_stage_test.log llama_stage_test.log check.log check 2>/dev/null
rm -rf "$out/check" "$out"/*.log
