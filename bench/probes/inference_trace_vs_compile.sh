#!/usr/bin/env bash
# Where gpt-1.3b inference's step goes, ours against torch.compile's: a kernel trace of one step of each
# (64 sequences in chunks of 16), summed by bench/trace_summary.py. From the repository root with
# dist/bundle: OUT=DIR bash bench/probes/inference_trace_vs_compile.sh.
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs="$tmp/logs"; rm -rf "$logs" "$tmp/run"; mkdir -p "$logs"
trap 'tar -C "$logs" -czf "$out/inference_trace_vs_compile.tgz" --exclude="*.json" . 2>/dev/null; rm -rf "$logs" "$tmp/run"; rm -rf "$tmp"' EXIT
STAGEHAND_KERNEL_TRACE=$logs/ours_infer timeout 150 dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=8 \
  --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4 --overwrite --run_dir="$tmp/run" \
  >"$logs/ours_infer.log" 2>&1; echo "ours rc $?"
PEER_KERNEL_TRACE=$logs/peer_infer_compile.json timeout 200 python3 tools/peer/gpt_peer.py --mode infer --infer-batch 64 \
  --infer-chunk 16 --compile --warmup 6 --steps 8 >"$logs/peer_infer_compile.log" 2>&1; echo "peer rc $?"
for t in ours_infer.rank0 peer_infer_compile; do
  [ -f "$logs/$t.json" ] && python3 bench/trace_summary.py "$logs/$t.json" "$t" 24 | tee "$logs/$t.summary.md"
done
