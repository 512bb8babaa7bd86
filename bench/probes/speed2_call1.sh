#!/usr/bin/env bash
# Issue 16, second round, call 1 (run from the repository root with dist-s3-speed/ carried): the new
# kernels' CUDA tests, the losses with each new mechanism on and off (pipeline_gpu_check.sh's new
# cases), then gpt-1.3b ours (new defaults, and with both new mechanisms off) beside torch.compile,
# training and inference, in one call. Logs under $OUT; a short table last.
set -uo pipefail
here=dist-s3-speed
rm -rf dist && mkdir -p dist && ln -s "$PWD/$here/bundle" dist/bundle
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
o=/tmp/speed2; rm -rf $o; mkdir -p $o
nvidia-smi --query-gpu=name,uuid,clocks.sm,power.draw,temperature.gpu --format=csv >$o/gpu.txt 2>&1
timeout 90 dist/bundle/run gpt_stage_test --gtest_filter='FusedKernelsCuda.*:FusedLoss.*:GptConfig.*' >$o/gpt_stage_test.txt 2>&1
echo "gpt_stage_test rc $?" >$o/summary.txt
OUT=$o/check PIPELINE_CHECK_ONLY='fused_' timeout 170 bash $here/pipeline_gpu_check.sh >$o/check.txt 2>&1
OUT=$o/bench timeout 320 bash $here/bench_one_gpu ${FAMILY:-gpt} train_ours train_ours_off train_compile infer_ours infer_compile >$o/bench.txt 2>&1
tar -czf "$OUT/speed2_call1.tgz" -C /tmp speed2 --exclude='*.pt' 2>/dev/null
cat $o/gpu.txt; cat $o/summary.txt; grep -E "^\[  (PASSED|FAILED)|FAILED  \]|OK \]" $o/gpt_stage_test.txt | tail -12
cat $o/check.txt; cat $o/bench.txt
