#!/usr/bin/env bash
# `launcher [flags] -- PROGRAM ARGS` on CPU workers with the .venv's torch (gloo), against torchrun in
# the same test: a DDP training script (tests/programs/ddp_train.py) on 2 and 4 workers ends with the
# one-process losses (1e-6 relative) as under torchrun; each rank sees torchrun's variables and runs
# in the user's directory; an exception on rank 1 ends the job with exit 1 and a root cause naming
# the exception and its file:line; --max_restarts=1 with a script that resumes from its snapshot ends
# with the uninterrupted losses; stagehand.step() gives progress lines, steps.csv and report.json, and
# a rank that stops reporting is hung (exit 3); kill -9 of a rank ends it with exit 1 and nothing left;
# kill -9 of the launcher leaves none of the ranks' own children (their guard kills the group); bad
# input (-- alone, a missing or non-executable program, --model with a program) is one line, exit 2,
# no run directory.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs torch).
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
train=$PWD/tests/programs/ddp_train.py
show=$PWD/tests/programs/show_env.py
checkout=$(dirname "$(dirname "$(readlink -f tests/program_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
[ -x "$launcher" ] && [ -f "$train" ] && [ -f "$show" ] || { echo "program_test: launcher or scripts not found in $PWD"; exit 1; }
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "program_test: $py has no torch: run tools/setup"; exit 1; }
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/program_test.XXXXXX")
cleanup() { pkill -9 -f -- "$work" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "program_test: FAIL: $*"; exit 1; }
step() { echo "program_test: $*"; }
export OMP_NUM_THREADS=1

# same A B: the two loss files have as many lines and agree within 1e-6 relative.
same() {
  [ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] && [ "$(wc -l <"$1")" -gt 0 ] || fail "$1 and $2 differ in length"
  paste -d' ' "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
    if (d > 1e-6 * a) { printf "line %d: %s against %s\n", NR, $2, $1; bad = 1 } } END { exit bad }' ||
    fail "$2 differs from $1"
}

step "one process, then 2 and 4 workers under the launcher, and 2 under torchrun"
timeout 120 "$launcher" --device=cpu --workers=1 --run_dir="$work/w1" -- "$py" "$train" --out "$work/w1.losses" \
  >"$work/w1.out" 2>&1 || fail "one worker: $(tail -n 20 "$work/w1.out")"
for n in 2 4; do
  timeout 120 "$launcher" --device=cpu --workers=$n --run_dir="$work/w$n" -- "$py" "$train" --out "$work/w$n.losses" \
    >"$work/w$n.out" 2>&1 || fail "$n workers: $(tail -n 20 "$work/w$n.out")"
  grep -q "stagehand: done: $n workers of $py $train" "$work/w$n.out" || fail "no done line: $(tail -n 3 "$work/w$n.out")"
  grep -q "^\[rank 0\] step 4 loss " "$work/w$n.out" || fail "rank 0's lines are not on the console: $(cat "$work/w$n.out")"
  grep -q "^step 4 loss " "$work/w$n/rank0.log" || fail "rank0.log lacks rank 0's lines"
  same "$work/w1.losses" "$work/w$n.losses"
done
(cd "$work" && timeout 120 "$py" -m torch.distributed.run --standalone --nproc-per-node=2 "$train" \
  --out "$work/torchrun.losses" >"$work/torchrun.out" 2>&1) || fail "torchrun: $(tail -n 20 "$work/torchrun.out")"
same "$work/w1.losses" "$work/torchrun.losses"
step "losses equal: $(tr '\n' ' ' <"$work/w2.losses")"

step "torchrun's variables and the user's directory"
mkdir -p "$work/here"
cp "$show" "$work/here/show_env.py"
(cd "$work/here" && timeout 60 "$launcher" --device=cpu --workers=2 --max_restarts=0 --run_dir="$work/env" \
  -- "$py" ./show_env.py >"$work/env.out" 2>&1) || fail "show_env: $(cat "$work/env.out")"
for r in 0 1; do
  log=$work/env/rank$r.log
  for want in "cwd=$work/here" "RANK=$r" "LOCAL_RANK=$r" "WORLD_SIZE=2" "LOCAL_WORLD_SIZE=2" "GROUP_RANK=0" \
    "GROUP_WORLD_SIZE=1" "ROLE_RANK=$r" "ROLE_WORLD_SIZE=2" "ROLE_NAME=default" "MASTER_ADDR=127.0.0.1" \
    "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=0" "TORCHELASTIC_USE_AGENT_STORE=True" \
    "TORCHELASTIC_ERROR_FILE=$work/env/rank$r.error.json" "OMP_NUM_THREADS=1" "CUDA_VISIBLE_DEVICES="; do
    grep -qx -- "$want" "$log" || fail "rank $r lacks $want: $(cat "$log")"
  done
  grep -qE '^MASTER_PORT=[0-9]+$' "$log" || fail "rank $r has no MASTER_PORT"
  grep -qE '^TORCHELASTIC_RUN_ID=[0-9a-f]{8}$' "$log" || fail "rank $r has no run id"
done

step "an exception on rank 1"
set +e
timeout 120 "$launcher" --device=cpu --workers=2 --run_dir="$work/exc" -- "$py" "$train" --steps 1000 \
  --fail_rank 1 --fail_step 2 >"$work/exc.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "exit $rc, not 1: $(tail -n 5 "$work/exc.out")"
last=$(tail -n 1 "$work/exc.out")
grep -qE '^stagehand: FAILED \(exit 1\): rank 1 \(pid [0-9]+\) (exited with code 1|was killed by signal 6 \(Aborted\)): ValueError: bad batch at step 2 on rank 1 \(ddp_train.py:[0-9]+\); run directory ' \
  <<<"$last" || fail "the root cause: $last"
step "$last"

step "--max_restarts=1: rank 1 fails once, every rank starts again and resumes from the script's snapshot"
timeout 120 "$launcher" --device=cpu --workers=2 --max_restarts=1 --run_dir="$work/restart" -- "$py" "$train" \
  --snapshot "$work/restart.snap" --fail_rank 1 --fail_step 3 --fail_once --out "$work/restart.losses" \
  >"$work/restart.out" 2>&1 || fail "the restarted run failed: $(tail -n 5 "$work/restart.out")"
grep -q "stagehand: restart 1 of 1: rank 1 (pid [0-9]*) exited with code 1: ValueError: bad batch at step 3 on rank 1 (ddp_train.py:[0-9]*); restarting every worker again (TORCHELASTIC_RESTART_COUNT=1)" \
  "$work/restart.out" || fail "no restart line: $(grep stagehand "$work/restart.out")"
grep -q "attempt 1: resuming at step 3" "$work/restart.out" || fail "the second attempt did not resume at step 3"
same "$work/w1.losses" "$work/restart.losses"

step "stagehand.step(): progress lines, steps.csv, report.json"
timeout 120 "$launcher" --device=cpu --workers=2 --run_dir="$work/report" -- "$py" "$train" --report \
  >"$work/report.out" 2>&1 || fail "the reporting run failed: $(tail -n 5 "$work/report.out")"
grep -qE '^stagehand: step 5  loss 0\.3753  [0-9.]+ s' "$work/report.out" || fail "no progress line: $(grep stagehand "$work/report.out")"
[ "$(grep -c '^[0-9]*,[01],0\.' "$work/report/steps.csv")" -eq 10 ] || fail "steps.csv: $(cat "$work/report/steps.csv")"
grep -qE '"steps_done": "?5"?' "$work/report/report.json" || fail "report.json: $(head -c 300 "$work/report/report.json")"
grep -A 3 "startup ledger" "$work/report.out" | grep -qE '^ +1 +[0-9]+\.[0-9]{3} +[0-9]+\.[0-9]{3}$' ||
  fail "the ledger has no first step of rank 1: $(grep -A 3 "startup ledger" "$work/report.out")"

step "a rank that stops reporting steps: hung, exit 3"
set +e
timeout 120 "$launcher" --device=cpu --workers=2 --progress_timeout_ms=3000 --run_dir="$work/hang" -- "$py" "$train" \
  --report --steps 100 --hang_rank 1 --hang_step 3 >"$work/hang.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 3 ] || fail "exit $rc for a hung rank, not 3: $(tail -n 3 "$work/hang.out")"
tail -n 1 "$work/hang.out" | grep -qE 'no step reported for 3s by rank 0 \(pid [0-9]+\) after 3 steps, rank 1 \(pid [0-9]+\) after 3 steps;' ||
  fail "the hang's root cause: $(tail -n 1 "$work/hang.out")"

step "kill -9 of rank 1"
timeout 120 "$launcher" --device=cpu --workers=2 --run_dir="$work/kill" -- "$py" "$train" --steps 100000000 \
  >"$work/kill.out" 2>&1 &
pid=$!
for _ in $(seq 600); do grep -q "step 3 loss" "$work/kill.out" 2>/dev/null && break; sleep 0.1; done
grep -q "step 3 loss" "$work/kill.out" || fail "the run to kill never reached step 3: $(tail -n 5 "$work/kill.out")"
victim=$(pgrep -f -- "$train --steps 100000000" | while read -r p; do
  grep -qz '^RANK=1$' "/proc/$p/environ" 2>/dev/null && echo "$p"; done | head -n 1)
[ -n "$victim" ] || fail "rank 1's process not found"
guard=$(ps -o ppid= -p "$victim" | tr -d ' ')  # the rank's guard (the launcher's child): the pid it names
kill -9 "$victim"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "exit $rc after kill -9, not 1: $(tail -n 5 "$work/kill.out")"
tail -n 1 "$work/kill.out" | grep -q "rank 1 (pid $guard) was killed by signal 9" || fail "$(tail -n 1 "$work/kill.out")"
sleep 0.5
left=$(pgrep -f -- "$train --steps 100000000" || true)
[ -z "$left" ] || fail "processes left after the run: $(ps -o pid,args -p "$left")"

step "kill -9 of the launcher: the ranks and their own children end with it"
spawner='import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", sys.argv[1]])
print("child started", flush=True)
time.sleep(300)'
"$launcher" --device=cpu --workers=2 --run_dir="$work/orphans" -- "$py" -c "$spawner" "$work/grandchild" \
  >"$work/orphans.out" 2>&1 &
pid=$!
for _ in $(seq 300); do [ "$(grep -c "child started" "$work/orphans.out" 2>/dev/null)" -ge 2 ] && break; sleep 0.1; done
[ "$(pgrep -fc -- "$work/grandchild")" -ge 4 ] || fail "the ranks' children did not start: $(cat "$work/orphans.out")"
kill -9 "$pid"
wait "$pid" 2>/dev/null || true
for _ in $(seq 50); do [ -z "$(pgrep -f -- "$work/grandchild")" ] && break; sleep 0.1; done
left=$(pgrep -f -- "$work/grandchild" || true)
[ -z "$left" ] || fail "left after kill -9 of the launcher: $(ps -o pid,args -p "$(echo $left | tr ' ' ,)")"

step "bad input: one line, exit 2, nothing created"
check_refused() {  # WANT ARGS...
  local want=$1; shift
  set +e
  out=$("$launcher" --device=cpu --workers=2 --run_dir="$work/refused" "$@" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "exit $rc for $*: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "not one line for $*: $out"
  grep -qF -- "$want" <<<"$out" || fail "for $*: $out"
  [ ! -e "$work/refused" ] || fail "a run directory was created for $*"
}
check_refused "-- with no program after it" --
check_refused "no such program on PATH" -- no-such-program-here
touch "$work/plain.py"
check_refused "is not executable" -- "$work/plain.py"
check_refused "--model=tiny with a program" --model=tiny -- "$py" "$train"
echo "program_test: PASS"
