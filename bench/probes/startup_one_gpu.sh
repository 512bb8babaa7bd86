#!/usr/bin/env bash
# Launch to the first training step on one GPU, before and after the startup changes, in one call:
# gpt-1.3b and tinyllama-1.1b (1F1B, 4 micro-batches of 8, 3 steps), each with the old path
# (--init_on_device=false --profile_single_stage=true --profile_cache=false: parameters drawn on the
# CPU and copied, the profile measured) and the new defaults; then the profile cache (a measured run,
# then one that reads it). Prints each run's ledger and the worker's startup lines, a table last.
# Usage, from the repository root on the GPU host with dist/ (tools/bundle): bench/probes/startup_one_gpu.sh
set -uo pipefail
out=${OUT:-/tmp/startup_one_gpu}
mkdir -p "$out/logs"
export XDG_CACHE_HOME=/tmp/startup_cache
rm -rf "$XDG_CACHE_HOME"
rows=()
one() {  # NAME MODEL FLAGS...
  local name=$1 model=$2
  shift 2
  dist/bundle/run launcher --gpus=1 --model="$model" --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 \
    --global_batch=32 --overwrite --run_dir="/tmp/runs/$name" "$@" >"$out/logs/$name.log" 2>&1
  local rc=$?
  cp /tmp/runs/$name/steps.csv "$out/logs/$name.steps.csv" 2>/dev/null
  local ledger first startup
  ledger=$(grep -A2 "startup ledger" "$out/logs/$name.log" | tail -n 1)
  first=$(python3 -c "import json;print(json.load(open('/tmp/runs/$name/report.json')).get('launch_to_first_step_seconds',''))" 2>/dev/null)
  startup=$(grep -o "startup: .*\|profile: .*" "$out/logs/$name.log" | tr '\n' ' ')
  echo "== $name (rc $rc): ledger [spawned cuda_ready registered nccl_ready first_step]: $ledger"
  echo "   $startup"
  grep -h "step [0-9]/3" "$out/logs/$name.log" | head -n 3
  rows+=("| $name | $rc | $(echo $ledger | awk '{print $3" | "$4" | "$5" | "$6}') | $first |")
}
nvidia-smi -L
one gpt_old gpt-1.3b --init_on_device=false --profile_single_stage=true --profile_cache=false
one gpt_new gpt-1.3b
one llama_old tinyllama-1.1b --init_on_device=false --profile_single_stage=true --profile_cache=false
one llama_new tinyllama-1.1b
one gpt_profile_measured gpt-1.3b --profile_single_stage=true
one gpt_profile_cached gpt-1.3b --profile_single_stage=true
one gpt_new_again gpt-1.3b
ls -la "$XDG_CACHE_HOME/stagehand/profiles" 2>&1 | tail -n 3
echo
echo "| run | rc | cuda_ready s | registered s | nccl_ready s | first step s | report launch_to_first_step s |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
printf '%s\n' "${rows[@]}"
