#!/usr/bin/env bash
# bench/probes/profile_s4.sh again, ours (training, inference) and the peer's torch.compile training only,
# each trace's summary printed (the device tool returns few files: one tarball).
set -uo pipefail
out=${OUT:-/tmp/profile_s4b}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
run=dist/bundle/run
work=/tmp/profile_s4_runs; rm -rf "$work"; mkdir -p "$work" "$out/t"
trap 'rm -rf "$work"' EXIT
train=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32)
infer=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4)
STAGEHAND_KERNEL_TRACE=$out/t/ours_train timeout 150 $run launcher "${train[@]}" --run_dir="$work/train" >"$out/t/ours_train.log" 2>&1
STAGEHAND_KERNEL_TRACE=$out/t/ours_infer timeout 150 $run launcher "${infer[@]}" --run_dir="$work/infer" >"$out/t/ours_infer.log" 2>&1
cp "$work"/train/rank0.log "$out/t/ours_train.rank0.log" 2>/dev/null
PEER_KERNEL_TRACE=$out/t/peer_train_compile.json timeout 200 python3 tools/peer/gpt_peer.py --mode eager --global-batch 32 --compile --warmup 4 --steps 3 >"$out/t/peer_train_compile.log" 2>&1
ls "$out/t"
for t in ours_train.rank0 ours_infer.rank0 peer_train_compile; do
  [ -f "$out/t/$t.json" ] && python3 bench/probes/trace_summary.py "$out/t/$t.json" "$t" 22
done | tee "$out/t/summary.md"
gzip "$out"/t/*.json
tar -C "$out" -czf "$out/profile_s4b.tgz" t && rm -rf "$out/t"
