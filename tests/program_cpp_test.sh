#!/usr/bin/env bash
# A C++ program under `launcher [flags] -- PROGRAM`: tests/programs/cpp_steps.cc reports its steps
# through include/stagehand/step.h as a Python script does through the `stagehand` module. On 2 CPU
# workers: exit 0, each rank's output, the progress lines, steps.csv's rows (both ranks' steps, the
# losses as the program computed them), report.json's steps, tokens/s and TFLOP/s; a rank that stops
# reporting is hung (exit 3, the line naming it); outside the launcher the program runs and reports
# nothing.
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
prog=$PWD/tests/cpp_steps
[ -x "$launcher" ] && [ -x "$prog" ] || { echo "program_cpp_test: launcher or cpp_steps not found in $PWD"; exit 1; }
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/program_cpp_test.XXXXXX")
cleanup() { pkill -9 -f -- "$work" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "program_cpp_test: FAIL: $*"; exit 1; }
step() { echo "program_cpp_test: $*"; }

step "2 workers, 10 steps each"
timeout 60 "$launcher" --device=cpu --workers=2 --run_dir="$work/run" -- "$prog" --steps 10 >"$work/run.out" 2>&1 ||
  fail "the run failed: $(tail -n 10 "$work/run.out")"
for r in 0 1; do grep -q "^\[rank $r\] rank $r of 2: 10 steps$" "$work/run.out" || fail "no output of rank $r"; done
grep -qE '^stagehand: step 10  loss 0\.4000  ' "$work/run.out" || fail "no progress line: $(grep stagehand "$work/run.out")"
csv=$work/run/steps.csv
header=$(head -n 1 "$csv")
col() { awk -F, -v n="$1" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == n) c = i; print c; exit }' "$csv"; }
step_c=$(col step) rank_c=$(col rank) loss_c=$(col loss)
[ -n "$step_c" ] && [ -n "$rank_c" ] && [ -n "$loss_c" ] || fail "steps.csv's header lacks step, rank or loss: $header"
[ "$(awk -F, 'NR > 1' "$csv" | wc -l)" -eq 20 ] || fail "steps.csv has not 20 rows: $(cat "$csv")"
# Every (rank, step) once, with the loss the program computed: 4 / (step + 1) (steps.csv keeps 9 digits).
awk -F, -v s="$step_c" -v r="$rank_c" -v l="$loss_c" 'NR > 1 {
    seen[$r "," $s]++; want = 4 / ($s + 1); d = $l - want; if (d < 0) d = -d
    if (d > 1e-8 * want) { print "loss " $l " at step " $s " of rank " $r; bad = 1 } }
  END { for (k = 0; k < 2; k++) for (i = 0; i < 10; i++) if (seen[k "," i] != 1) { print "rank " k " step " i; bad = 1 }
        exit bad }' "$csv" || fail "steps.csv's rows: $(cat "$csv")"
report=$work/run/report.json
grep -qE '"steps_done": "?10"?' "$report" || fail "report.json's steps: $(head -c 400 "$report")"
for key in tokens_per_second samples_per_second tflops; do
  grep -qE "\"$key\": [0-9]" "$report" || fail "report.json has no $key: $(cat "$report")"
done

step "rank 1 stops reporting at step 3: hung, exit 3"
set +e
timeout 60 "$launcher" --device=cpu --workers=2 --progress_timeout_ms=2000 --run_dir="$work/hang" -- "$prog" \
  --steps 1000 --hang_step 3 >"$work/hang.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "exit $rc for a hung rank, not 3: $(tail -n 3 "$work/hang.out")"
tail -n 1 "$work/hang.out" | grep -qE 'rank 1 \(pid [0-9]+\) after 3 steps' || fail "the hang's line: $(tail -n 1 "$work/hang.out")"

step "outside the launcher: runs, reports nothing"
(cd "$work" && RANK=0 WORLD_SIZE=1 "$prog" --steps 3 >"$work/alone.out") || fail "alone: $(cat "$work/alone.out")"
grep -qx "rank 0 of 1: 3 steps" "$work/alone.out" || fail "alone: $(cat "$work/alone.out")"
step "PASS"
