#!/usr/bin/env bash
# Where a Python rank's launch-to-first-all-reduce goes on one GPU, under `launcher -- PROGRAM` (health
# gate on, the default, and off) and under torchrun --standalone, alternating: seconds from just before
# the command to the interpreter's first line, `import torch` done, the CUDA context, NCCL's
# init_process_group and the first all-reduce (bench/probes/first_allreduce_phases.py). Then a raise
# at step 10 (bench/probes/program_gpu_train.py) split into the rank's own exit after the raise and the
# launcher's exit after the rank's. Through the bundle (carry dist/), from the repository root:
#   OUT=DIR bash bench/probes/program_startup_phases.sh [REPEATS=3]
# Logs in $OUT/logs.tgz; the table last.
set -uo pipefail
repeats=${1:-3}
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out/logs" && out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run=dist/bundle/run
py=$(command -v python3)
now() { date +%s.%N; }
phases() {  # WHO I
  local log="$out/logs/$1_$2.log"
  case $1 in
    ours) BENCH_T0=$(now) $run launcher --gpus=1 --overwrite --run_dir="$out/runs/$1_$2" -- "$py" \
            bench/probes/first_allreduce_phases.py >"$log" 2>&1 ;;
    ours_nohealth) BENCH_T0=$(now) $run launcher --gpus=1 --health=off --overwrite --run_dir="$out/runs/$1_$2" \
            -- "$py" bench/probes/first_allreduce_phases.py >"$log" 2>&1 ;;
    torchrun) BENCH_T0=$(now) "$py" -m torch.distributed.run --standalone --nproc-per-node=1 \
            bench/probes/first_allreduce_phases.py >"$log" 2>&1 ;;
  esac
  printf "%-14s %2s %s\n" "$1" "$2" "$(grep -o 'phases rank 0 .*' "$log" | head -n 1)"
}
{
  echo "=== $(nvidia-smi --query-gpu=name,driver_version,persistence_mode --format=csv,noheader | head -n 1)"
  echo "who           run  (seconds since the command)"
  phases ours 0 >/dev/null  # warm the page cache for both
  for i in $(seq 1 "$repeats"); do
    phases ours "$i"; phases torchrun "$i"; phases ours_nohealth "$i"
  done
  for i in 1 2; do
    $run launcher --gpus=1 --overwrite --run_dir="$out/runs/fail_$i" -- bash -c \
      "$py bench/probes/program_gpu_train.py --fail_step 10; rc=\$?; echo \"rank exited at \$(date +%s.%N)\"; exit \$rc" \
      >"$out/logs/fail_$i.log" 2>&1
    end=$(now)
    raised=$(grep -o "raising at [0-9.]*" "$out/logs/fail_$i.log" | awk '{print $3}')
    exited=$(grep -o "rank exited at [0-9.]*" "$out/logs/fail_$i.log" | awk '{print $4}')
    awk -v r="${raised:-0}" -v x="${exited:-0}" -v e="$end" \
      'BEGIN { printf "fail %d: raise -> rank exit %.3f s, rank exit -> launcher exit %.3f s, total %.3f s\n", '"$i"', x - r, e - x, e - r }'
  done
} | tee "$out/table.txt"
tail -n 2 "$out/logs/fail_1.log" >>"$out/table.txt"
rm -rf "$out/runs"
tar -C "$out" -czf "$out/logs.tgz" logs && rm -rf "$out/logs"
