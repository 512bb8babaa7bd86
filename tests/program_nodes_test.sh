#!/usr/bin/env bash
# `launcher --nodes=2 ... -- PROGRAM ARGS` as torchrun's multi-node: two launchers on loopback (node 0
# and an agent, one job token file), each running its own command line's program. A DDP script
# (tests/programs/ddp_train.py, the .venv's torch, gloo) on 1 and on 2 CPU workers per node ends with
# the one-process losses (1e-6 relative); each rank sees torchrun's multi-node variables (global RANK,
# LOCAL_RANK, GROUP_RANK = its node, one MASTER_ADDR/MASTER_PORT: node 0's store); node 0's progress
# lines, steps.csv and report.json hold every node's ranks' stagehand.step() reports (node 1's come
# with its agent's heartbeats); an exception on node 1's rank ends both launchers with exit 1 and node
# 0's root cause names the rank, its node, host and pid and the exception; --max_restarts=1 with node
# 1's rank failing once restarts every rank on both nodes (TORCHELASTIC_RESTART_COUNT=1, a new store),
# both say why, and the run resumes from rank 0's snapshot to the uninterrupted losses; a failure every
# attempt exhausts the restarts (exit 1 on both); a rank on node 1 that stops reporting steps is hung
# (node 0: exit 3, naming it); another program on node 1 (other arguments, none, or a program against
# a job of ours) is refused in one line, exit 2, on both nodes.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs torch).
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
train=$PWD/tests/programs/ddp_train.py
show=$PWD/tests/programs/show_env.py
checkout=$(dirname "$(dirname "$(readlink -f tests/program_nodes_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
[ -x "$launcher" ] && [ -f "$train" ] && [ -f "$show" ] || { echo "program_nodes_test: launcher or scripts not found in $PWD"; exit 1; }
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "program_nodes_test: $py has no torch: run tools/setup"; exit 1; }
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/program_nodes_test.XXXXXX")
cleanup() { pkill -9 -f -- "$work" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "program_nodes_test: FAIL: $*"; exit 1; }
step() { echo "program_nodes_test: $*"; }
export OMP_NUM_THREADS=1
token=$work/token
openssl rand -hex 32 >"$token" 2>/dev/null || "$py" -c 'import secrets; print(secrets.token_hex(32))' >"$token"
chmod 600 "$token"

# same A B: the two loss files have as many lines and agree within 1e-6 relative.
same() {
  [ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] && [ "$(wc -l <"$1")" -gt 0 ] || fail "$1 and $2 differ in length"
  paste -d' ' "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
    if (d > 1e-6 * a) { printf "line %d: %s against %s\n", NR, $2, $1; bad = 1 } } END { exit bad }' ||
    fail "$2 differs from $1"
}

# two NAME NODE0_ARGS :: NODE1_ARGS: node 0 in the background and node 1 (an agent), each with its
# own flags (a program among them), on a fresh loopback port; their exit codes in $rc0 and $rc1, their
# output in $work/NAME.0.out and $work/NAME.1.out, their run directories $work/NAME.0 and $work/NAME.1.
two() {
  local name=$1; shift
  local a=() b=()
  while [ "$1" != "::" ]; do a+=("$1"); shift; done
  shift
  b=("$@")
  local port
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  local common=(--nodes=2 --coordinator_address="127.0.0.1:$port" --job_token_file="$token")
  set +e
  timeout 120 "$launcher" "${common[@]}" --node_rank=0 --run_dir="$work/$name.0" "${a[@]}" >"$work/$name.0.out" 2>&1 &
  local pid0=$!
  timeout 120 "$launcher" "${common[@]}" --node_rank=1 --run_dir="$work/$name.1" "${b[@]}" >"$work/$name.1.out" 2>&1
  rc1=$?
  wait "$pid0"
  rc0=$?
  set -e
}
outputs() { echo "--- node 0:"; tail -n 15 "$work/$1.0.out"; echo "--- node 1:"; tail -n 15 "$work/$1.1.out"; }

step "one process, then 1 and 2 CPU workers on each of two nodes"
timeout 120 "$launcher" --device=cpu --workers=1 --run_dir="$work/w1" -- "$py" "$train" --out "$work/w1.losses" \
  >"$work/w1.out" 2>&1 || fail "one worker: $(tail -n 20 "$work/w1.out")"
for n in 1 2; do
  prog=(-- "$py" "$train" --out "$work/n$n.losses" --report)
  two "n$n" --device=cpu --workers=$n "${prog[@]}" :: --device=cpu --workers=$n "${prog[@]}"
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "$n per node: exit $rc0 and $rc1: $(outputs "n$n")"
  world=$((2 * n))
  grep -q "stagehand: all 2 nodes joined: $world workers of $py $train .*; c10d store 127.0.0.1:[0-9]* (MASTER_ADDR, MASTER_PORT)" \
    "$work/n$n.0.out" || fail "no start line: $(outputs "n$n")"
  grep -q "stagehand: done: $world workers of $py $train" "$work/n$n.0.out" || fail "no done line: $(outputs "n$n")"
  grep -q "stagehand: node 1 at 127.0.0.1: done" "$work/n$n.1.out" || fail "node 1's verdict: $(outputs "n$n")"
  [ -e "$work/n$n.1/rank$n.log" ] || fail "node 1 does not run rank $n: $(outputs "n$n")"
  same "$work/w1.losses" "$work/n$n.losses"
  # Every rank's steps, node 1's from its steps files on its host through its agent: 5 steps each.
  [ "$(grep -c '^[0-9]*,[0-9]*,0\.' "$work/n$n.0/steps.csv")" -eq $((5 * world)) ] || fail "steps.csv: $(cat "$work/n$n.0/steps.csv")"
  [ "$(grep -c "^[0-9]*,$((world - 1)),0\." "$work/n$n.0/steps.csv")" -eq 5 ] || fail "no steps of rank $((world - 1)): $(cat "$work/n$n.0/steps.csv")"
  grep -qE '^stagehand: step 5  loss 0\.3753' "$work/n$n.0.out" || fail "no progress line: $(grep stagehand "$work/n$n.0.out")"
  grep -qE '"steps_done": "?5"?' "$work/n$n.0/report.json" || fail "report.json: $(head -c 300 "$work/n$n.0/report.json")"
  [ -s "$work/n$n.1/rank$((world - 1)).steps" ] || fail "node 1's last rank wrote no steps file"
done
step "losses equal: $(tr '\n' ' ' <"$work/n2.losses")"

step "torchrun's multi-node variables, 2 workers on each node"
two env --device=cpu --workers=2 -- "$py" "$show" :: --device=cpu --workers=2 -- "$py" "$show"
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "show_env: exit $rc0 and $rc1: $(outputs env)"
port=$(grep -h '^MASTER_PORT=' "$work/env.0/rank0.log")
run_id=$(grep -h '^TORCHELASTIC_RUN_ID=' "$work/env.0/rank0.log")
[[ "$port" =~ ^MASTER_PORT=[0-9]+$ ]] || fail "rank 0 has no MASTER_PORT: $(cat "$work/env.0/rank0.log")"
[[ "$run_id" =~ ^TORCHELASTIC_RUN_ID=[0-9a-f]{8}$ ]] || fail "rank 0 has no run id"
for r in 0 1 2 3; do
  node=$((r / 2))
  log=$work/env.$node/rank$r.log
  for want in "RANK=$r" "LOCAL_RANK=$((r % 2))" "WORLD_SIZE=4" "LOCAL_WORLD_SIZE=2" "GROUP_RANK=$node" \
    "GROUP_WORLD_SIZE=2" "ROLE_RANK=$r" "ROLE_WORLD_SIZE=4" "ROLE_NAME=default" "MASTER_ADDR=127.0.0.1" "$port" \
    "$run_id" "TORCHELASTIC_RESTART_COUNT=0" "TORCHELASTIC_MAX_RESTARTS=0" "TORCHELASTIC_USE_AGENT_STORE=True" \
    "TORCHELASTIC_ERROR_FILE=$work/env.$node/rank$r.error.json" "OMP_NUM_THREADS=1" "CUDA_VISIBLE_DEVICES=" \
    "GLOO_SOCKET_IFNAME=<unset>"; do
    grep -qx -- "$want" "$log" || fail "rank $r lacks $want: $(cat "$log")"
  done
done

step "an exception on node 1's rank"
prog=(-- "$py" "$train" --steps 1000 --fail_rank 1 --fail_step 2)
two exc --device=cpu --workers=1 "${prog[@]}" :: --device=cpu --workers=1 "${prog[@]}"
[ "$rc0" -eq 1 ] && [ "$rc1" -eq 1 ] || fail "exit $rc0 and $rc1, not 1 and 1: $(outputs exc)"
last=$(tail -n 1 "$work/exc.0.out")
grep -qE '^stagehand: FAILED \(exit 1\): rank 1 \(node 1 at 127\.0\.0\.1, host [^,]+, pid [0-9]+\) (exited with code 1|was killed by signal 6 \(Aborted\)): ValueError: bad batch at step 2 on rank 1 \(ddp_train.py:[0-9]+\); run directory ' \
  <<<"$last" || fail "the root cause: $(outputs exc)"
step "$last"
# A raise can also end in Gloo's abort at interpreter exit (docs/programs.md, "Known issue").
tail -n 1 "$work/exc.1.out" | grep -qE "stagehand: node 1 at 127\.0\.0\.1: rank 1 \(pid [0-9]+\) (exited with code 1|was killed by signal 6);" ||
  fail "node 1's verdict: $(outputs exc)"

step "another program on node 1: one line, exit 2 on both nodes"
refused() {  # NAME WANT: node 1's refusal is one line with WANT, and node 0 ends with it too
  [ "$rc0" -eq 2 ] && [ "$rc1" -eq 2 ] || fail "$1: exit $rc0 and $rc1, not 2 and 2: $(outputs "$1")"
  [ "$(grep -c "stagehand: node 1: could not join: " "$work/$1.1.out")" -eq 1 ] || fail "$1: $(outputs "$1")"
  grep -qF -- "$2" "$work/$1.1.out" || fail "$1: node 1 does not say $2: $(outputs "$1")"
  tail -n 1 "$work/$1.0.out" | grep -qF -- "$2" || fail "$1: node 0 does not end with $2: $(outputs "$1")"
  [ ! -e "$work/$1.1" ] || fail "$1: node 1 made a run directory"
}
two args --device=cpu --workers=1 -- "$py" "$show" :: --device=cpu --workers=1 -- "$py" "$show" --other
refused args "node 1 runs -- $py $show --other but node 0 runs -- $py $show: give every node the same -- PROGRAM ARGS"
two none --device=cpu --workers=1 -- "$py" "$show" :: --device=cpu --workers=1
refused none "node 1 runs no program (a job of ours) but node 0 runs -- $py $show"
two model --device=cpu --workers=1 --model=tiny --steps=1 :: --device=cpu --workers=1 -- "$py" "$show"
refused model "node 1 runs -- $py $show but node 0 runs no program (a job of ours)"
left=$(pgrep -f -- "$work" || true)
[ -z "$left" ] || fail "processes left after the runs: $(ps -o pid,args -p "$left")"

step "--max_restarts=1: node 1's rank fails once, every node starts its ranks again, resuming from the snapshot"
prog=(-- "$py" "$train" --snapshot "$work/restart.snap" --fail_rank 1 --fail_step 3 --fail_once --out "$work/restart.losses")
two restart --device=cpu --workers=1 --max_restarts=1 "${prog[@]}" :: --device=cpu --workers=1 "${prog[@]}"
[ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] || fail "exit $rc0 and $rc1, not 0 and 0: $(outputs restart)"
cause='rank 1 \(node 1 at 127\.0\.0\.1, host [^,]+, pid [0-9]+\) (exited with code 1|was killed by signal 6 \(Aborted\)): ValueError: bad batch at step 3 on rank 1 \(ddp_train.py:[0-9]+\)'
grep -qE "^stagehand: restart 1 of 1: $cause; restarting every worker on every node again \(TORCHELASTIC_RESTART_COUNT=1\)" \
  "$work/restart.0.out" || fail "node 0's restart line: $(outputs restart)"
grep -qE "^stagehand: node 1 at 127\.0\.0\.1: restart 1 of 1: $cause; starting this node's rank 1 again \(TORCHELASTIC_RESTART_COUNT=1; c10d store 127\.0\.0\.1:[0-9]+\)" \
  "$work/restart.1.out" || fail "node 1's restart line: $(outputs restart)"
grep -q "attempt 1: resuming at step 3" "$work/restart.0.out" || fail "the second attempt did not resume at step 3: $(outputs restart)"
tail -n 1 "$work/restart.1.out" | grep -q "stagehand: node 1 at 127.0.0.1: done" || fail "node 1's verdict: $(outputs restart)"
same "$work/w1.losses" "$work/restart.losses"

step "--max_restarts=1 and a failure on every attempt: exit 1 on both nodes"
prog=(-- "$py" "$train" --steps 1000 --fail_rank 1 --fail_step 2)
two exhausted --device=cpu --workers=1 --max_restarts=1 "${prog[@]}" :: --device=cpu --workers=1 "${prog[@]}"
[ "$rc0" -eq 1 ] && [ "$rc1" -eq 1 ] || fail "exit $rc0 and $rc1, not 1 and 1: $(outputs exhausted)"
[ "$(grep -c '^stagehand: restart 1 of 1: ' "$work/exhausted.0.out")" -eq 1 ] || fail "not one restart: $(outputs exhausted)"
tail -n 1 "$work/exhausted.0.out" | grep -qE "^stagehand: FAILED \(exit 1\): rank 1 \(node 1 at .*ValueError: bad batch at step 2 on rank 1 .*\(after 1 restart, --max_restarts=1\)" ||
  fail "the root cause: $(outputs exhausted)"
tail -n 1 "$work/exhausted.1.out" | grep -qE "stagehand: node 1 at 127\.0\.0\.1: rank 1 \(pid [0-9]+\) (exited with code 1|was killed by signal 6);" ||
  fail "node 1's verdict: $(outputs exhausted)"

step "a rank on node 1 that stops reporting steps: hung, exit 3 on node 0, naming it"
prog=(-- "$py" "$train" --report --steps 100 --hang_rank 1 --hang_step 3)
two hang --device=cpu --workers=1 --progress_timeout_ms=3000 "${prog[@]}" :: --device=cpu --workers=1 "${prog[@]}"
[ "$rc0" -eq 3 ] && [ "$rc1" -eq 1 ] || fail "exit $rc0 and $rc1, not 3 and 1: $(outputs hang)"
tail -n 1 "$work/hang.0.out" | grep -qE 'no step reported for 3s by .*rank 1 \(node 1 at 127\.0\.0\.1, host [^)]+\) after 3 steps' ||
  fail "the hang's root cause: $(outputs hang)"
step "$(tail -n 1 "$work/hang.0.out")"
[ "$(grep -c '^[0-9]*,1,0\.' "$work/hang.0/steps.csv")" -eq 3 ] || fail "steps.csv lacks rank 1's 3 steps: $(cat "$work/hang.0/steps.csv")"
left=$(pgrep -f -- "$work" || true)
[ -z "$left" ] || fail "processes left after the runs: $(ps -o pid,args -p "$left")"
echo "program_nodes_test: PASS"
