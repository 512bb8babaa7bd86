#!/usr/bin/env bash
# Where a gpt-1.3b step's GPU time goes, ours beside torch.compile, one H200 (issue 16, session 4):
# kernel traces of one training step (1F1B, 4 x 8) and one inference step (4 x 16), ours with CUDA graphs
# (and training without), and the peer's torch.compile step; summed by bench/probes/trace_summary.py.
# Usage on the GPU host, from the repository root with the bundle: bash bench/probes/profile_s4.sh
set -uo pipefail
out=${OUT:-/tmp/profile_s4}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
run=dist/bundle/run
work=/tmp/profile_s4_runs; rm -rf "$work"; mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
nvidia-smi --query-gpu=name,uuid,clocks.max.sm,power.limit --format=csv,noheader >"$out/gpu.txt" 2>&1
train=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32)
infer=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4)
STAGEHAND_KERNEL_TRACE=$out/ours_train timeout 150 $run launcher "${train[@]}" --run_dir="$work/train" >"$out/ours_train.log" 2>&1
echo "ours_train rc $?" >>"$out/rc.txt"
STAGEHAND_KERNEL_TRACE=$out/ours_infer timeout 150 $run launcher "${infer[@]}" --run_dir="$work/infer" >"$out/ours_infer.log" 2>&1
echo "ours_infer rc $?" >>"$out/rc.txt"
STAGEHAND_KERNEL_TRACE=$out/ours_train_eager timeout 150 $run launcher "${train[@]}" --cuda_graphs=false --run_dir="$work/train_eager" >"$out/ours_train_eager.log" 2>&1
echo "ours_train_eager rc $?" >>"$out/rc.txt"
for f in train infer train_eager; do cp "$work/$f/steps.csv" "$out/ours_$f.steps.csv" 2>/dev/null; done
PEER_KERNEL_TRACE=$out/peer_train_compile.json timeout 200 python3 tools/peer/gpt_peer.py --mode eager --global-batch 32 --compile --warmup 4 --steps 3 >"$out/peer_train_compile.log" 2>&1
echo "peer_train_compile rc $?" >>"$out/rc.txt"
PEER_KERNEL_TRACE=$out/peer_infer_compile.json timeout 150 python3 tools/peer/gpt_peer.py --mode infer --infer-batch 64 --infer-chunk 16 --compile --warmup 4 --steps 3 >"$out/peer_infer_compile.log" 2>&1
echo "peer_infer_compile rc $?" >>"$out/rc.txt"
{
  for t in ours_train.rank0 ours_infer.rank0 ours_train_eager.rank0 peer_train_compile peer_infer_compile; do
    [ -f "$out/$t.json" ] && python3 bench/probes/trace_summary.py "$out/$t.json" "$t" 30
  done
} >"$out/summary.md" 2>&1
tar -C "$out" -czf /tmp/profile_s4.tgz --exclude='*.tgz' . && mv /tmp/profile_s4.tgz "$out/"
for t in ours_train.rank0 ours_infer.rank0 ours_train_eager.rank0 peer_train_compile peer_infer_compile; do gzip -f "$out/$t.json" 2>/dev/null; done
cat "$out/gpu.txt" "$out/rc.txt"
grep -h "^RESULT" "$out"/peer_*.log | cut -c1-200
python3 - "$out" <<'PY'
import csv, sys
for f in ("train", "infer", "train_eager"):
    try:
        rows = list(csv.DictReader(open(f"{sys.argv[1]}/ours_{f}.steps.csv")))
        print(f, [round(float(r["seconds"]), 4) for r in rows])
    except Exception as e:
        print(f, "no steps.csv", e)
PY
grep -E "^## |^span|^\| (gemm|attention|norm|loss|optimizer|gelu/act|reduce|copy/cast|add/mul|fill|embedding|triton|other) " "$out/summary.md"
