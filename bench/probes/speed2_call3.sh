#!/usr/bin/env bash
# Issue 16, second round, call 3: tinyllama-1.1b inference, ours beside torch.compile (call 2's
# torch.compile inference row ran out of its time slot). Logs under $OUT; the table last.
set -uo pipefail
here=dist-s3-speed
[ -d $here/bundle ] || tar -xzf $here/bundle.tgz -C $here || exit 1
rm -rf dist && mkdir -p dist && ln -s "$PWD/$here/bundle" dist/bundle
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
o=/tmp/speed2c; rm -rf $o; mkdir -p $o
nvidia-smi --query-gpu=name,uuid --format=csv >$o/gpu.txt 2>&1
OUT=$o/bench timeout 200 bash $here/bench_one_gpu llama infer_ours infer_compile >$o/bench-llama.txt 2>&1
tar -czf "$OUT/speed2_call3.tgz" -C /tmp speed2c 2>/dev/null
cat $o/gpu.txt $o/bench-llama.txt
