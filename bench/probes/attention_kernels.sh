#!/usr/bin/env bash
# Which attention kernels a gpt-1.3b job with --attention=flash runs (a kernel trace of step 1; and of
# the default, cuDNN, for comparison), its step 0, and the JIT cache entries each leaves (each job has an
# empty CUDA_CACHE_PATH of its own). From the repository root with dist/bundle:
#   bash bench/probes/attention_kernels.sh
set -uo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
for att in flash cudnn; do
  c="$tmp/jit_$att"; rm -rf "$c" "$tmp/fr_$att" "$tmp/kt_$att"*
  CUDA_CACHE_PATH=$c STAGEHAND_KERNEL_TRACE="$tmp/kt_$att" STAGEHAND_KERNEL_TRACE_STEP=1 timeout 120 dist/bundle/run launcher \
    --gpus=1 --model=gpt-1.3b --steps=2 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 \
    --attention=$att --overwrite --run_dir="$tmp/fr_$att" >"$tmp/fr_$att.log" 2>&1
  echo "== $att: rc $? $(grep -ho 'step 0 [0-9.]* s' "$tmp/fr_$att.log" | head -1); JIT entries: $(find $c -type f ! -name index | wc -l)"
  grep -o 'attention[^,]*' "$tmp/fr_$att"/job.textproto | head -2
  python3 - "$tmp/kt_$att.rank0.json" <<'PY'
import collections, json, sys
t = json.load(open(sys.argv[1])); ev = t["traceEvents"] if isinstance(t, dict) else t
k = collections.Counter(e["name"][:110] for e in ev if e.get("cat") == "kernel" and any(w in e["name"].lower() for w in ("flash", "sdpa", "fmha", "attention", "cudnn")))
for n, c in k.most_common(6): print(f"  {c:4d} {n}")
PY
done
