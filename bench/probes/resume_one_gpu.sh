#!/usr/bin/env bash
# One GPU: a run stopped by SIGTERM writes a checkpoint (exit 75), a second run --resume's from it,
# and the two together continue the uninterrupted run's loss curve (and validation loss) within bf16
# tolerance, step by step. Model: GPT at --hidden=1024 --heads=16 --layers=8 (gpt-1.3b's vocabulary
# and sequence, 168M parameters: a 2 GB checkpoint; gpt-1.3b's is 16 GB, about 70 s to write, more
# device time than this check had). bf16 autocast as always.
# Usage, from the repository root: OUT=DIR bash bench/probes/resume_one_gpu.sh (BUNDLE, default
# dist/bundle). Logs under $OUT; the run directories (and the checkpoint) in a temporary directory,
# removed when the script exits, however it exits.
set -uo pipefail
tmp=$(mktemp -d)
bundle=${BUNDLE:-dist/bundle}
out=${OUT:?set OUT to the directory for the results}
work="$tmp/resume_one_gpu"
mkdir -p "$out"
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"; df -h $tmp | tail -1 >"$out/df_after.txt"; rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# A token file (Python's generator, seed 0): 2M tokens below 32768, 4 MB; the last 5% held out.
python3 -c "
import array, random
r = random.Random(0)
array.array('H', (r.randrange(32768) for _ in range(2 * 1024 * 1024))).tofile(open('$work/tokens.bin', 'wb'))"
steps=16
common=(--gpus=1 --model=gpt-1.3b --hidden=1024 --heads=16 --layers=8 --pipeline_stages=1 --micro_batches=4
        --global_batch=32 --seed=1 --steps=$steps --lr=3e-4 --warmup_steps=4 --min_lr=3e-5 --weight_decay=0.1
        --grad_clip=1.0 --data=$work/tokens.bin --val_fraction=0.05 --eval_every=4 --eval_batches=2)
t() { date +%s.%N; }

# U: uninterrupted.
t0=$(t)
"$bundle/run" launcher "${common[@]}" --run_dir="$work/U" >"$out/U.log" 2>&1
u_code=$?
t1=$(t)
# A: checkpoints on (none due before the end), SIGTERM once step 8 is printed.
"$bundle/run" launcher "${common[@]}" --checkpoint_every=1000 --run_dir="$work/A" >"$out/A.log" 2>&1 &
a_pid=$!
for _ in $(seq 1200); do grep -q "step 8/$steps" "$out/A.log" && break; sleep 0.05; done
ts=$(t)
kill -TERM "$a_pid"
wait "$a_pid"
a_code=$?
t2=$(t)
ls -la "$work"/A/checkpoints/* >"$out/A_checkpoint.txt" 2>&1
# B: resumes A.
"$bundle/run" launcher "${common[@]}" --resume="$work/A" --run_dir="$work/B" >"$out/B.log" 2>&1
b_code=$?
t3=$(t)
for r in U A B; do cp "$work/$r/steps.csv" "$out/$r.steps.csv" 2>/dev/null; cp "$work/$r/report.json" "$out/$r.report.json" 2>/dev/null; done

echo
echo "resume check, one GPU ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $(date -u +%F))"
echo "U exit $u_code ($(python3 -c "print(f'{$t1-$t0:.1f}')") s); A exit $a_code, SIGTERM to exit $(python3 -c "print(f'{$t2-$ts:.1f}')") s; B exit $b_code ($(python3 -c "print(f'{$t3-$t2:.1f}')") s)"
grep -h "SIGTERM\|stopped (exit\|resuming from\|parameters:" "$out/A.log" "$out/B.log" | grep -v "^\[rank" | head -6
python3 - "$out" <<'PY'
import csv, sys
out = sys.argv[1]
def rows(run):
    try:
        return list(csv.DictReader(open(f"{out}/{run}.steps.csv")))
    except OSError:
        return []
def col(run, name):
    return {int(r["step"]): float(r[name]) for r in rows(run) if r.get(name)}
u, a, b = col("U", "loss"), col("A", "loss"), col("B", "loss")
uv, av, bv = col("U", "val_loss"), col("A", "val_loss"), col("B", "val_loss")
ab, abv = {**a, **b}, {**av, **bv}
print(f"A ran steps {min(a) if a else '-'}..{max(a) if a else '-'}, B {min(b) if b else '-'}..{max(b) if b else '-'}")
print(f"{'step':>4} {'U loss':>9} {'A/B loss':>9} {'rel diff':>9}  {'U val':>8} {'A/B val':>8}")
worst = 0.0
for s in sorted(u):
    x = ab.get(s)
    d = abs(x - u[s]) / abs(u[s]) if x is not None else float("nan")
    if x is not None: worst = max(worst, d)
    who = "B" if s in b else "A"
    print(f"{s:>4} {u[s]:>9.5f} {x if x is not None else float('nan'):>9.5f} {d:>9.2e}  "
          f"{uv.get(s, float('nan')):>8.4f} {abv.get(s, float('nan')):>8.4f}  {who}")
vworst = max((abs(abv[s] - uv[s]) / uv[s] for s in uv if s in abv), default=float("nan"))
ok = bool(u) and len(ab) == len(u) == max(u) + 1 and worst < 2e-2
print(f"worst relative loss difference over {len(u)} steps: {worst:.2e}; validation: {vworst:.2e} "
      f"({'within' if ok else 'NOT within'} bf16 tolerance 2e-2)")
PY
