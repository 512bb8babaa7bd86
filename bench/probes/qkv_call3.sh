#!/usr/bin/env bash
# fused_qkv_grad on and off, interleaved twice, gpt-1.3b training on one GPU (the bench's ours row:
# 11 steps, mean of steps 3..10); its loss check; the GPT's CUDA tests. Logs tarred under $OUT.
set -uo pipefail
o=/tmp/call3; rm -rf $o; mkdir -p $o/runs
rows=()
for round in 1 2; do
  for fused in true false; do
    name=q_${fused}_$round
    dist/bundle/run launcher --gpus=1 --model=gpt-1.3b --steps=11 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 \
      --global_batch=32 --model_option=fused_qkv_grad=$fused --overwrite --run_dir=$o/runs/$name >$o/$name.log 2>&1
    t=$(python3 -c "import csv;r=[float(x['seconds']) for x in csv.DictReader(open('$o/runs/$name/steps.csv')) if 3<=int(x['step'])<11];print(f'{sum(r)/len(r):.4f}')")
    p=$(python3 -c "import csv;print(max(int(x['peak_memory_bytes']) for x in csv.DictReader(open('$o/runs/$name/steps.csv')))/2**30)")
    rows+=("| $name | $t | $p |")
  done
done
OUT=$o/check bash tests/gpu/pipeline_gpu_check.sh >$o/check.txt 2>&1
dist/bundle/run gpt_stage_test --gtest_filter='*Cuda*' >$o/gpt_stage_test.txt 2>&1; echo "gpt_stage_test rc $?" >>$o/check.txt
tar -czf "$OUT/call3.tgz" -C /tmp call3
cat $o/check.txt; grep -E "OK|FAILED" $o/gpt_stage_test.txt | tail -12
echo "| run | step s (mean of steps 3..10) | peak GiB |"; echo "| --- | --- | --- |"; printf '%s\n' "${rows[@]}"
