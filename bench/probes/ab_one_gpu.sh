#!/usr/bin/env bash
# A/B of two bundles on one GPU, in one call: the same gpt-1.3b training and inference runs, old and
# new interleaved (old new old new), each the mean of steps 3..10. For "no slower than before" claims.
# Usage: bench/probes/ab_one_gpu.sh OLD_BUNDLE_DIR NEW_BUNDLE_DIR; logs under $OUT.
set -uo pipefail
old=$1 new=$2
out=${OUT:-/tmp/ab}
mkdir -p "$out"
train=(--model=gpt-1.3b --gpus=1 --pipeline_stages=1 --steps=11 --schedule=1f1b --micro_batches=4 --global_batch=32)
infer=(--model=gpt-1.3b --gpus=1 --pipeline_stages=1 --steps=11 --inference --global_batch=64 --micro_batches=4)
for round in 1 2; do
  for side in old new; do
    b=$old; [ $side = new ] && b=$new
    for kind in train infer; do
      args=("${train[@]}"); [ $kind = infer ] && args=("${infer[@]}")
      "$b/run" launcher "${args[@]}" --run_dir="$out/$kind.$side.$round" >"$out/$kind.$side.$round.log" 2>&1 || echo "$kind.$side.$round FAILED"
    done
  done
done
python3 - "$out" <<'PY'
import csv, glob, os, sys, statistics
out = sys.argv[1]
res = {}
for d in sorted(glob.glob(out + "/*.*.*/steps.csv")):
    kind, side, rnd = os.path.basename(os.path.dirname(d)).split(".")
    secs = [float(r["seconds"]) for r in csv.DictReader(open(d)) if 3 <= int(r["step"]) < 11]
    res.setdefault((kind, side), []).append(sum(secs) / len(secs))
print("| run | old (e3f7a4f) s | new s | new / old |")
print("| --- | --- | --- | --- |")
for kind in ("train", "infer"):
    o, n = res.get((kind, "old"), []), res.get((kind, "new"), [])
    if o and n:
        print(f"| {kind} | {' '.join(f'{x:.4f}' for x in o)} | {' '.join(f'{x:.4f}' for x in n)} | {statistics.mean(n) / statistics.mean(o):.4f} |")
PY
