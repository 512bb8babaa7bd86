#!/usr/bin/env bash
# Issue 16, session 4's last GPU call on one H200 (the merged code): the first launcher process on the
# fresh machine (launch to first step, cold), then ours beside torch.compile in the same call
# (bench/bench_pipeline, 1-GPU rows, gpt-1.3b and tinyllama-1.1b), the CUDA tests and loss checks of the
# fused GELU, and gpt-1.3b with this round's mechanisms off. Each part prints as it ends; one tarball.
set -uo pipefail
out=${OUT:-/tmp/final_s4}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/final_s4_logs; rm -rf "$logs"; mkdir -p "$logs"
pack() { tar -C "$logs" -czf "$out/final_s4.tgz" --exclude='*.pt' --exclude='trace*.json' . 2>/dev/null; }
trap 'pack; rm -rf "$logs"' EXIT
nvidia-smi --query-gpu=name,uuid,clocks.max.sm,power.limit --format=csv,noheader | tee "$logs/gpu.txt"
echo "== cold: the first launcher processes on this machine"
OUT="$logs/cold" bash bench/probes/rows.sh gpt_train_cold:gpt-1.3b:train llama_train_cold:tinyllama-1.1b:train
echo "== gpt-1.3b beside torch.compile"
BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 240 bench/bench_pipeline gpt train_1gpu train_1gpu_compile infer_1gpu infer_1gpu_compile >"$logs/bench_gpt.txt" 2>&1
sed -n '/^| run/,$p' "$logs/bench_gpt.txt"
echo "== tinyllama-1.1b beside HF + torch.compile"
BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 240 bench/bench_pipeline llama train_1gpu train_1gpu_compile infer_1gpu infer_1gpu_compile >"$logs/bench_llama.txt" 2>&1
sed -n '/^| run/,$p' "$logs/bench_llama.txt"
echo "== tests and checks (fused GELU, merged)"
timeout 90 dist/bundle/run gpt_stage_test --gtest_filter='*Gelu*:DenseCuda.*:FusedKernelsCuda.*' >"$logs/gpt_stage_test.log" 2>&1; echo "gpt_stage_test rc $?"
grep -hE "^\[  FAILED|Failure" "$logs/gpt_stage_test.log" | head -5
PIPELINE_CHECK_ONLY='fused_gelu' OUT="$logs/check" timeout 100 bash tests/gpu/pipeline_gpu_check.sh >"$logs/check.log" 2>&1; echo "pipeline_gpu_check rc $?"
grep -E "^(PASS|FAIL)" "$logs/check.log"
echo "== gpt-1.3b with this round's mechanisms off"
off=--model_option=fused_residual_gemm=false,fused_bias_grad=false,fused_gelu=false
OUT="$logs/off" bash bench/probes/rows.sh gpt_train_off:gpt-1.3b:train:$off gpt_infer_off:gpt-1.3b:infer:$off
