set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf /tmp/jr; timeout 120 dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=2 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite --run_dir=/tmp/jr > /tmp/jr.log 2>&1; echo rc $?
c=$HOME/.nv/ComputeCache; ls -la $c/*/* | head
for f in $(find $c -type f ! -name index); do echo "== $f $(stat -c %s $f)"; strings -n 8 $f | grep -E "^(\.text\.|_Z|\.nv\.info\.)" | sed 's/^\.[a-z.]*\.//' | sort -u | head -6 | cut -c1-200; done
ls /usr/local/cuda/bin/cuobjdump 2>&1
