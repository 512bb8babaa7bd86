#!/usr/bin/env bash
# Issue 16, second round, call 2 (run from the repository root with dist-s3-speed/ carried): the CUDA
# tests of both families, the losses with each new mechanism on and off, then both models: ours (this
# round's defaults, and with this round's mechanisms off) beside torch.compile, training and inference,
# in one call. Logs under $OUT; a short table last.
set -uo pipefail
here=dist-s3-speed
# The bundle travels as a tarball (71 MB unpacked: over the 64 MiB a call carries).
[ -d $here/bundle ] || tar -xzf $here/bundle.tgz -C $here || exit 1
rm -rf dist && mkdir -p dist && ln -s "$PWD/$here/bundle" dist/bundle
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
o=/tmp/speed2b; rm -rf $o; mkdir -p $o
nvidia-smi --query-gpu=name,uuid,clocks.sm,power.draw,temperature.gpu --format=csv >$o/gpu.txt 2>&1
timeout 80 dist/bundle/run gpt_stage_test --gtest_filter='*Cuda*:FusedLoss.*:GptConfig.*:LowersDenseWeights.*' >$o/gpt_stage_test.txt 2>&1
echo "gpt_stage_test rc $?" >$o/summary.txt
timeout 60 dist/bundle/run llama_stage_test --gtest_filter='*Cuda*:LlamaConfig.*' >$o/llama_stage_test.txt 2>&1
echo "llama_stage_test rc $?" >>$o/summary.txt
OUT=$o/check PIPELINE_CHECK_ONLY='fused_residual|fused_rotary|fused_swiglu|inference_bf16' timeout 150 bash $here/pipeline_gpu_check.sh >$o/check.txt 2>&1
for fam in gpt llama; do
  OUT=$o/bench timeout 170 bash $here/bench_one_gpu $fam train_ours train_ours_off train_compile infer_ours infer_ours_off infer_compile >$o/bench-$fam.txt 2>&1
done
tar -czf "$OUT/speed2_call2.tgz" -C /tmp speed2b --exclude='*.pt' 2>/dev/null
cat $o/gpu.txt $o/summary.txt; grep -hE "^\[  (PASSED|FAILED)|FAILED  \]" $o/gpt_stage_test.txt $o/llama_stage_test.txt | head -12
grep -v "^$" $o/check.txt; cat $o/bench-gpt.txt $o/bench-llama.txt
