#!/usr/bin/env bash
# One GPU: what --checkpoint_every=50 costs gpt-1.3b's step time (target <= 2%), and whether a resumed
# run's loss curve continues the original's (bf16 tolerance). On a GPU host with the bundle
# (tools/bundle; dist/ copied over), from the repository root:
#   OUT=DIR bash bench/probes/checkpoint_cost_one_gpu.sh            (about 8 minutes)
# Runs, alternating so that drift hits both alike: A (no checkpoints) and B (--checkpoint_every=50),
# 110 steps each, twice; the step time is the mean of steps 5..109 from steps.csv. Then the resume
# check: C trains 100 steps with --checkpoint_every=50 --keep_checkpoints=3; D resumes C's checkpoint
# of step 50 (the newer one removed) and runs to 100; D's steps 50..99 are compared with C's.
# Logs and run directories go to $OUT; each B run's checkpoints (16 GB a shard for gpt-1.3b) are removed
# once it is measured, so that the disk holds C's. The table is printed last.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
common=(--gpus=1 --model=gpt-1.3b --pipeline_stages=1 --micro_batches=4 --global_batch=32 --seed=1 --overwrite)
rows="$out/rows.tsv"
: >"$rows"

run() {  # run NAME FLAGS...
  local name=$1; shift
  dist/bundle/run launcher "${common[@]}" --run_dir="$out/$name" "$@" >"$out/$name.log" 2>&1 \
    || { echo "$name: FAILED (exit $?), see $out/$name.log" >&2; tail -n 5 "$out/$name.log" >&2; return 1; }
}

mean_step() {  # mean_step RUN_DIR FIRST LAST: mean seconds of steps FIRST..LAST
  python3 - "$@" <<'PY'
import csv, sys
run, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
secs = [float(r["seconds"]) for r in csv.DictReader(open(run + "/steps.csv")) if first <= int(r["step"]) <= last]
print(f"{sum(secs) / len(secs):.5f}")
PY
}

for round in 1 2; do
  run "A$round" --steps=110 && echo -e "A$round\tnone\t$(mean_step "$out/A$round" 5 109)" >>"$rows"
  run "B$round" --steps=110 --checkpoint_every=50 \
    && echo -e "B$round\tevery 50\t$(mean_step "$out/B$round" 5 109)" >>"$rows"
  if [ "$round" = 1 ]; then
    ls -la "$out"/B1/checkpoints/* >"$out/B1_checkpoints.txt" 2>&1
    grep -h "checkpoint of step" "$out"/B1/rank0.log >>"$out/B1_checkpoints.txt" 2>/dev/null
  fi
  rm -rf "$out/B$round/checkpoints"
done

# The resume check: C's checkpoint of step 50, resumed.
resume_ok=no
if run C --steps=100 --checkpoint_every=50 --keep_checkpoints=3; then
  mkdir -p "$out/C50/checkpoints" && rm -rf "$out/C50/checkpoints/"* \
    && cp -r "$out/C/checkpoints/step_00000050" "$out/C50/checkpoints/" \
    && run D --steps=100 --resume="$out/C50" && resume_ok=yes
fi

echo
echo "gpt-1.3b, 1 GPU, 1F1B 4 x 8 sequences; step time = mean of steps 5..109 ($(date -u +%F), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
python3 - "$rows" "$out" "$resume_ok" <<'PY'
import csv, sys
rows, out, resume_ok = sys.argv[1], sys.argv[2], sys.argv[3]
table = [l.rstrip("\n").split("\t") for l in open(rows) if l.strip()]
print(f"{'run':<6} {'checkpoints':<12} {'s/step':>9}")
for name, ck, s in table:
    print(f"{name:<6} {ck:<12} {float(s):>9.5f}")
a = [float(s) for n, _, s in table if n.startswith("A")]
b = [float(s) for n, _, s in table if n.startswith("B")]
if a and b:
    cost = (sum(b) / len(b)) / (sum(a) / len(a)) - 1
    print(f"checkpoint every 50 steps costs {100 * cost:+.2f}% of the step time (target <= 2%)")
if resume_ok == "yes":
    def losses(run):
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(open(f"{out}/{run}/steps.csv")) if r["loss"]}
    c, d = losses("C"), losses("D")
    common = sorted(set(c) & set(d))
    worst = max(abs(d[s] - c[s]) / abs(c[s]) for s in common)
    print(f"resume: D (from C's step 50) ran steps {min(d)}..{max(d)}; worst relative loss difference to C "
          f"over {len(common)} steps: {worst:.2e} ({'within' if worst < 2e-2 else 'OUTSIDE'} bf16 tolerance 2e-2)")
    for s in common[:3] + common[-2:]:
        print(f"  step {s}: C {c[s]:.5f}  D {d[s]:.5f}")
else:
    print("resume: not checked (a run failed; see the logs above)")
PY
