#!/usr/bin/env bash
# Issue 16, session 5, call 1 on one H200: what a cold launch reads (page-cache residency of the
# libraries before and after the first launcher process, fincore), whether caches can be dropped here
# and the disk's read rate, then current main beside torch.compile (gpt-1.3b) and kernel traces of our
# training and inference steps. One tarball; each part prints as it ends.
set -uo pipefail
out=${OUT:-/tmp/s5c1}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
logs=/tmp/s5c1_logs; rm -rf "$logs"; mkdir -p "$logs"
pack() { tar -C "$logs" -czf "$out/s5c1.tgz" --exclude='*.pt' . 2>/dev/null; }
trap 'pack; rm -rf "$logs"' EXIT
sp=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
resident() {  # MiB resident of every library under torch/lib and nvidia/, and the total
  find "$sp/torch/lib" "$sp/nvidia" -name '*.so*' -type f -print0 | xargs -0 fincore --bytes --noheadings -o RES,SIZE,FILE 2>/dev/null \
    | sort -n -r >"$logs/resident-$1.txt"
  awk -v t="$1" '{r+=$1; s+=$2} END {printf "%s: resident %.0f MiB of %.0f MiB of libraries\n", t, r/2^20, s/2^20}' "$logs/resident-$1.txt"
}
echo "== facts"
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
echo "uid $(id -u), $(nproc) cores"; df -h / /tmp "$sp" | cat; lsblk -d -o NAME,ROTA,SIZE,MODEL 2>/dev/null | head
mount | grep -E " / | $sp" | head -3
resident fresh
echo "== the first launcher process (cold)"
OUT="$logs/cold1" bash bench/probes/rows.sh gpt_cold1:gpt-1.3b:train
resident after-cold1
head -25 "$logs/resident-after-cold1.txt" | awk '{printf "%8.1f MiB of %8.1f  %s\n", $1/2^20, $2/2^20, $3}'
echo "== dropping caches"
sync
if echo 3 >/proc/sys/vm/drop_caches 2>"$logs/drop.err"; then
  echo "dropped"; resident dropped
  f=$(find "$sp" -name 'libtorch_cuda.so' | head -1)
  /usr/bin/time -f "cat libtorch_cuda.so: %e s" cat "$f" >/dev/null
  ls -l "$f" | awk '{printf "%.0f MiB\n", $5/2^20}'
  sync; echo 3 >/proc/sys/vm/drop_caches
  OUT="$logs/cold2" bash bench/probes/rows.sh gpt_cold2:gpt-1.3b:train
else
  echo "cannot drop caches: $(cat "$logs/drop.err")"
fi
echo "== gpt-1.3b beside torch.compile (current main)"
BENCH_ROW_TIMEOUT=200 OUT="$logs/bench" timeout -k 10 300 bench/bench_pipeline gpt train_1gpu train_1gpu_compile infer_1gpu infer_1gpu_compile >"$logs/bench_gpt.txt" 2>&1
sed -n '/^| run/,$p' "$logs/bench_gpt.txt"
echo "== traces of our steps"
run=dist/bundle/run; work=/tmp/s5c1_runs; rm -rf "$work"; mkdir -p "$work" "$logs/t"
train=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32)
infer=(--gpus=1 --model=gpt-1.3b --steps=7 --pipeline_stages=1 --inference --global_batch=64 --micro_batches=4)
STAGEHAND_KERNEL_TRACE=$logs/t/ours_train timeout 120 $run launcher "${train[@]}" --run_dir="$work/train" >"$logs/t/ours_train.log" 2>&1
STAGEHAND_KERNEL_TRACE=$logs/t/ours_infer timeout 120 $run launcher "${infer[@]}" --run_dir="$work/infer" >"$logs/t/ours_infer.log" 2>&1
for t in ours_train.rank0 ours_infer.rank0; do
  [ -f "$logs/t/$t.json" ] && python3 bench/probes/trace_summary.py "$logs/t/$t.json" "$t" 30
done | tee "$logs/t/summary.md" | head -120
gzip "$logs"/t/*.json
rm -rf "$work"
