#!/usr/bin/env bash
# `launcher --sweep=1,2,4 --device=cpu -- PROGRAM ARGS`: the DDP script of tests/programs/ddp_train.py
# (the .venv's torch, gloo) at 1, 2 and 4 CPU workers, reporting its steps through stagehand.step();
# sweep.csv has a row per count with positive tokens/s and samples/s and a speedup of 1 at one
# worker, sweep.md and sweep.svg are written, each run's report.json has samples/s and TFLOP/s from
# the script's FLOPs (no MFU on CPU), and nothing is left running; a count the machine cannot hold is
# one line, exit 2, nothing started.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs torch).
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
train=$PWD/tests/programs/ddp_train.py
checkout=$(dirname "$(dirname "$(readlink -f tests/program_sweep_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
[ -x "$launcher" ] && [ -f "$train" ] || { echo "program_sweep_test: launcher or script not found in $PWD"; exit 1; }
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "program_sweep_test: $py has no torch: run tools/setup"; exit 1; }
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/program_sweep_test.XXXXXX")
cleanup() { pkill -9 -f -- "$work" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "program_sweep_test: FAIL: $*"; exit 1; }
step() { echo "program_sweep_test: $*"; }
export OMP_NUM_THREADS=1

step "a sweep of 1, 2 and 4 CPU workers of the DDP script"
timeout 300 "$launcher" --sweep=1,2,4 --device=cpu --run_dir="$work/sweep" -- "$py" "$train" --report --steps 8 \
  --out "$work/sweep.losses" >"$work/sweep.out" 2>&1 || fail "the sweep failed: $(tail -n 20 "$work/sweep.out")"
for n in 1 2 4; do
  grep -q "^stagehand: sweep: $n worker" "$work/sweep.out" || fail "no run of $n: $(grep stagehand "$work/sweep.out")"
  grep -q "stagehand: done: $n workers\? of $py $train" "$work/sweep.out" || fail "the run of $n did not end done"
done
grep -q "stagehand: sweep written to $work/sweep (sweep.csv, sweep.md, sweep.svg)" "$work/sweep.out" ||
  fail "no closing line: $(tail -n 3 "$work/sweep.out")"
csv=$work/sweep/sweep.csv
head -n 1 "$csv" | grep -qx 'workers,stages,status,step_seconds,tokens_per_second,samples_per_second,speedup,efficiency,bubble_bound,peak_memory_gib_max,run_dir' ||
  fail "sweep.csv's header: $(head -n 1 "$csv")"
[ "$(tail -n +2 "$csv" | wc -l)" -eq 3 ] || fail "sweep.csv has not 3 rows: $(cat "$csv")"
# workers, status ok, positive step time, tokens/s and samples/s (16 samples of 8 tokens a step: the
# ratio is exact up to the printed digit), and its own run directory.
tail -n +2 "$csv" | awk -F, -v dir="$work/sweep" '
  { want = NR == 1 ? 1 : NR == 2 ? 2 : 4
    if ($1 != want || $3 != "ok" || !($4 > 0) || !($5 > 0) || !($6 > 0) || !($7 > 0) || !($8 > 0)) bad = 1
    d = $5 - 8 * $6; if (d < 0) d = -d; if (d > 0.5) bad = 1
    if ($11 != dir "/workers_" want) bad = 1 }
  END { exit bad }' || fail "sweep.csv: $(cat "$csv")"
sed -n 2p "$csv" | awk -F, '{ exit !($7 == "1.0000" && $8 == "1.0000") }' || fail "speedup at 1 worker: $(sed -n 2p "$csv")"
for f in sweep.md sweep.svg; do [ -s "$work/sweep/$f" ] || fail "$f is missing or empty"; done
grep -q "^## stagehand sweep: $py $train --report --steps 8 --out $work/sweep.losses on CPU workers$" "$work/sweep/sweep.md" ||
  fail "sweep.md's title: $(head -n 1 "$work/sweep/sweep.md")"
grep -qF '| workers | stages | step time (s) | tokens/s | speedup |' "$work/sweep/sweep.md" || fail "sweep.md: $(cat "$work/sweep/sweep.md")"
head -c 4 "$work/sweep/sweep.svg" | grep -q '<svg' && tail -n 1 "$work/sweep/sweep.svg" | grep -qx '</svg>' ||
  fail "sweep.svg is no SVG"
step "$(tail -n 3 "$work/sweep/sweep.md" | tr '\n' ' ')"

step "each run's report.json: samples/s, and TFLOP/s from the script's FLOPs without an MFU"
for n in 1 2 4; do
  "$py" - "$work/sweep/workers_$n/report.json" <<'EOF' || fail "workers_$n/report.json"
import json, sys
r = json.load(open(sys.argv[1]))
# 16 samples of 8 tokens and 6 x 321 parameters' FLOPs each, per step.
assert r["samples_per_second"] > 0 and abs(r["tokens_per_second"] - 8 * r["samples_per_second"]) < 1e-6 * r["tokens_per_second"], r
assert r["flops_per_step"] == 6 * 321 * 16, r["flops_per_step"]
assert abs(r["tflops"] - r["flops_per_step"] / r["step_seconds"] / 1e12) < 1e-9 * r["tflops"], r
assert r["mfu"] == 0, r["mfu"]
EOF
done
left=$(pgrep -f -- "$work/sweep.losses" || true)
[ -z "$left" ] || fail "processes left after the sweep: $(ps -o pid,args -p "$left")"

step "a count the machine cannot hold: one line, exit 2, nothing started"
too_many=$(( $(getconf _NPROCESSORS_CONF) * 8 + 1 ))  # nproc would heed OMP_NUM_THREADS
set +e
out=$("$launcher" --sweep=1,$too_many --device=cpu --run_dir="$work/refused" -- "$py" "$train" 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "exit $rc for --sweep=1,$too_many: $out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "not one line: $out"
grep -q "^stagehand: sweep: $too_many workers: " <<<"$out" || fail "the refusal: $out"
[ ! -e "$work/refused" ] || fail "a run directory was created"
echo "program_sweep_test: PASS"
