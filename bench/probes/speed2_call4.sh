#!/usr/bin/env bash
# Issue 16, second round, call 4: the final commit (norm backward compiled for nine row lengths) on the
# GPU: both families' CUDA tests and one training row of ours per model (no peers). Table last.
set -uo pipefail
here=dist-s3-speed
rm -rf dist && mkdir -p dist && ln -s "$PWD/$here/bundle" dist/bundle
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
o=/tmp/speed2d; rm -rf $o; mkdir -p $o
nvidia-smi --query-gpu=name,uuid --format=csv >$o/gpu.txt 2>&1
timeout 80 dist/bundle/run gpt_stage_test --gtest_filter='*Cuda*:FusedLoss.*:GptConfig.*:LowersDenseWeights.*' >$o/gpt_stage_test.txt 2>&1
echo "gpt_stage_test rc $?" >$o/summary.txt
timeout 60 dist/bundle/run llama_stage_test --gtest_filter='*Cuda*:LlamaConfig.*' >$o/llama_stage_test.txt 2>&1
echo "llama_stage_test rc $?" >>$o/summary.txt
for fam in gpt llama; do
  OUT=$o/bench timeout 60 bash $here/bench_one_gpu $fam train_ours >$o/bench-$fam.txt 2>&1
done
tar -czf "$OUT/speed2_call4.tgz" -C /tmp speed2d --exclude='*.pt' 2>/dev/null
cat $o/gpu.txt $o/summary.txt; grep -hE "^\[  (PASSED|FAILED)|FAILED  \]" $o/gpt_stage_test.txt $o/llama_stage_test.txt | head -12
grep -h "train_ours" $o/bench-gpt.txt $o/bench-llama.txt
