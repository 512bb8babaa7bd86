#!/usr/bin/env bash
# Launcher checks on a GPU host, through the bundle (tools/bundle; carry dist/): a clean 2-GPU run with
# a checked NCCL all-reduce every step, asking for more GPUs than visible, and kill -9 of one worker in
# the middle of NCCL traffic (the launcher must exit non-zero naming the rank, nothing may remain).
# Usage, from the repository root: tests/gpu/launcher_gpu_check.sh [GPUS=2]; logs go to $OUT.
set -uo pipefail
gpus=${1:-2}
out=${OUT:-/tmp/launcher_gpu_check}
mkdir -p "$out"
run=dist/bundle/run
fail=0
check() { if eval "$2"; then echo "PASS  $1"; else echo "FAIL  $1"; fail=1; fi; }

$run launcher --gpus="$gpus" --model=allreduce --steps=50 --tensor_elements=67108864 --overwrite --run_dir="$out/clean" >"$out/clean.log" 2>&1
rc=$?
check "clean run on $gpus GPUs exits 0 (all-reduce of 256 MiB checked on every step)" "[ $rc -eq 0 ]"
grep -E "startup ledger" -A $((gpus + 1)) "$out/clean.log"

$run launcher --gpus=$((gpus + 1)) >"$out/too_many.log" 2>&1
rc=$?
check "--gpus=$((gpus + 1)) exits 2: $(head -n 1 "$out/too_many.log")" "[ $rc -eq 2 ]"

$run launcher --gpus="$gpus" --model=allreduce --steps=100000000 --tensor_elements=16777216 --overwrite --run_dir="$out/kill" >"$out/kill.log" 2>&1 &
launcher=$!
for _ in $(seq 1 200); do grep -q "first_step\|\[rank $((gpus - 1))\]" "$out/kill.log" && break; sleep 0.05; done
sleep 2
job=$(grep -o "job [0-9a-f]*" "$out/kill.log" | head -n 1 | cut -d' ' -f2)
victim=$(pgrep -f -- "--job_id=$job --worker_index=$((gpus - 1)) ")
t0=$(date +%s.%N)
kill -9 "$victim"
wait "$launcher"
rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.3f", b - a}')
check "kill -9 of rank $((gpus - 1)) mid-run: launcher exit $rc (want 1) after ${secs}s (want < 2)" "[ $rc -eq 1 ] && awk -v s=$secs 'BEGIN {exit !(s < 2)}'"
grep "FAILED" "$out/kill.log"
sleep 0.2
check "no process of job $job remains" "! pgrep -f -- '--job_id=$job' >/dev/null"
exit $fail
