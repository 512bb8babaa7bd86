#!/usr/bin/env bash
# Issue 16, session 7: the residual GEMM's tile rule in whole jobs: gpt-1.3b inference and training and
# tinyllama-1.1b inference with the rule (ping-pong for k <= 4096, cooperative 128x256 above) against
# ping-pong for every shape (STAGEHAND_GEMM_RESIDUAL_VARIANT=1) and cooperative for every shape (=2),
# in the order A B C A B C (the clock drifts). Mean of steps 3..11 with clock and power; table last.
# Ran at 7e931e3; 1882c64 removed the switch (the model's kernel is ping-pong for every shape since).
set -uo pipefail
strings dist/bundle/bin/worker | grep -q STAGEHAND_GEMM_RESIDUAL_VARIANT ||
  { echo "s7_ab.sh: this worker has no STAGEHAND_GEMM_RESIDUAL_VARIANT (bundle 7e931e3's to rerun it)" >&2; exit 2; }
out=${OUT:-/tmp/s7ab}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
logs=/tmp/s7ab_logs work=/tmp/s7ab_runs
rm -rf "$logs" "$work"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s7ab.tgz" . 2>/dev/null; rm -rf "$logs" "$work"' EXIT
run=dist/bundle/run
one() {  # NAME VARIANT MODEL KIND
  local name=$1 variant=$2 model=$3 kind=$4
  local args=(--gpus=1 --model="$model" --steps=12 --pipeline_stages=1 --overwrite --run_dir="$work/$name")
  if [ "$kind" = infer ]; then args+=(--inference --global_batch=64 --micro_batches=4)
  else args+=(--schedule=1f1b --micro_batches=4 --global_batch=32); fi
  STAGEHAND_GEMM_RESIDUAL_VARIANT=$variant timeout 120 $run launcher "${args[@]}" >"$logs/$name.log" 2>&1 ||
    echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  cp "$work/$name/steps.csv" "$logs/$name.steps.csv" 2>/dev/null
  python3 - "$work/$name" "$name" "$variant" >>"$logs/rows.md" <<'PY'
import csv, sys
d, name, variant = sys.argv[1:4]
try:
    rows = [r for r in csv.DictReader(open(f"{d}/steps.csv")) if 3 <= int(r["step"]) < 12]
    mean = lambda k: sum(float(r[k]) for r in rows) / len(rows)
    print(f"| {name} | {variant or 'rule'} | {mean('seconds'):.4f} | {mean('sm_mhz_mean'):.0f} | {mean('power_w_mean'):.0f} |")
except Exception as e:
    print(f"| {name} | {variant} | failed: {e} | | |")
PY
  rm -rf "${work:?}/$name"
}
for r in 1 2; do
  one gpt_infer_rule_$r "" gpt-1.3b infer; one gpt_infer_pp_$r 1 gpt-1.3b infer; one gpt_infer_coop_$r 2 gpt-1.3b infer
done
one gpt_train_rule "" gpt-1.3b train; one gpt_train_pp 1 gpt-1.3b train
one llama_infer_rule "" tinyllama-1.1b infer; one llama_infer_pp 1 tinyllama-1.1b infer
echo "| row | residual GEMM | step s | SM MHz | W |"; echo "| --- | --- | --- | --- | --- |"; cat "$logs/rows.md"
