#!/usr/bin/env bash
# Issue 16, session 6: what the driver JIT-compiles when cuDNN's attention is not used (--attention=flash),
# into an empty JIT cache of its own; then the same with the default attention into another. Prints each
# cache entry's size and its longest identifiers.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for att in flash cudnn; do
  c=/tmp/jit_$att; rm -rf "$c" /tmp/jr_$att
  CUDA_CACHE_PATH=$c timeout 120 dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=2 --pipeline_stages=1 \
    --schedule=1f1b --micro_batches=4 --global_batch=32 --attention=$att --overwrite --run_dir=/tmp/jr_$att >/tmp/jr_$att.log 2>&1
  echo "== $att: rc $? $(grep -ho 'step 0 [0-9.]* s' /tmp/jr_$att.log | head -1)"
  for f in $(find "$c" -type f ! -name index); do
    echo "-- $(stat -c %s "$f") bytes: $(strings -n 12 "$f" | grep -E '^[A-Za-z_][A-Za-z0-9_]{11,}$' | awk '{print length, $0}' | sort -rn | head -2 | cut -d' ' -f2 | cut -c1-160 | tr '\n' ' ')"
  done
done
