#!/usr/bin/env bash
# Command jobs of `launcher --serve` (`client submit [flags] -- PROGRAM ARGS`) end to end on loopback:
# the real server and client, the DDP script (tests/programs/ddp_train.py) with the .venv's torch over
# gloo on 2 CPU workers. With --allow_commands: `python3` found on the server's PATH and the script
# in the server's directory, watched to success with the ranks' [rank N] lines, its logs, report.json
# and job.textproto fetched, the command in `list` and `status`; a job with a hung rank cancelled
# with nothing left running; SIGTERM to the server stops a running command and keeps a queued one.
# Restarted without the flag: the queued command fails with one line, a new one is refused in one
# line (exit 2) and nothing is queued.
# Python: $STAGEHAND_PYTHON's directory, else the checkout's .venv/bin, first on the server's PATH.
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
here=$(pwd -P)
launcher=$here/launcher/launcher
client=$here/client/client
checkout=$(dirname "$(dirname "$(readlink -f tests/serve_program_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python3}
[ -x "$launcher" ] && [ -x "$client" ] && [ -f tests/programs/ddp_train.py ] ||
  { echo "serve_program_test: launcher, client or script not found in $here"; exit 1; }
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "serve_program_test: $py has no torch: run tools/setup"; exit 1; }
work=$(mktemp -d "${TEST_TMPDIR:-/tmp}/serve_program_test.XXXXXX")
server_pid=
cleanup() {
  [ -z "$server_pid" ] || { kill -9 "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
  pkill -9 -f -- "$work" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "serve_program_test: FAIL: $*"; [ ! -f "$work/server.log" ] || tail -n 20 "$work/server.log"; exit 1; }
step() { echo "serve_program_test: $*"; }
export OMP_NUM_THREADS=1

# start_server [FLAGS...]: a server in this directory, python3 first on its PATH; waits for its address.
start_server() {
  : >"$work/server.log"
  PATH="$(dirname "$py"):$PATH" "$launcher" --serve --listen=127.0.0.1:0 --state_dir="$work/state" \
    --max_cpu_workers=2 "$@" >"$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 300); do grep -q "serving on " "$work/server.log" && break; sleep 0.1; done
  address=$(sed -n 's/.*serving on \([^ ]*\) .*/\1/p' "$work/server.log" | tail -n 1)
  [ -n "$address" ] || fail "the server did not start"
}
stop_server() {
  kill -TERM "$server_pid"
  local rc=0
  wait "$server_pid" || rc=$?
  server_pid=
  [ "$rc" -eq 0 ] || fail "the server exited $rc after SIGTERM"
}
client() {
  STAGEHAND_SERVER=$address STAGEHAND_TOKEN_FILE=$work/state/admin.token timeout 120 "$client" "$@"
}
# wait_for SECONDS COMMAND...: until COMMAND succeeds, at most SECONDS.
wait_for() {
  local tenths=$(($1 * 10)); shift
  for _ in $(seq "$tenths"); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  "$@" >/dev/null 2>&1
}
job_state() { client status "$1" | head -n 1; }
none_left() { ! pgrep -f -- "$1" >/dev/null; }

start_server --allow_commands
grep -q "commands allowed (--allow_commands" "$work/server.log" || fail "the server does not say it runs commands"

step "a DDP script on 2 CPU workers, from the server's directory and PATH, watched to success"
client submit --device=cpu --workers=2 -- python3 tests/programs/ddp_train.py --report --out "$work/served.losses" \
  >"$work/submit.out" 2>&1 || fail "submit: $(cat "$work/submit.out")"
id=$(tail -n 1 "$work/submit.out")
client watch "$id" >"$work/watch.out" 2>&1 || fail "watch exited $?: $(tail -n 20 "$work/watch.out")"
grep -q "^\[rank 0\] step 4 loss " "$work/watch.out" || fail "no [rank 0] lines in the watch: $(cat "$work/watch.out")"
grep -q "stagehand: job .*: 2 CPU workers of $(dirname "$py")/python3 tests/programs/ddp_train.py --report" \
  "$work/watch.out" || fail "the command, resolved on the server's PATH: $(grep stagehand "$work/watch.out")"
tail -n 1 "$work/watch.out" | grep -q "^job $id: succeeded (exit code 0)" || fail "$(tail -n 1 "$work/watch.out")"
[ "$(wc -l <"$work/served.losses")" -eq 5 ] || fail "the script wrote $(wc -l <"$work/served.losses") losses, not 5"
client logs "$id" --rank=0 >"$work/rank0.log" || fail "logs --rank=0"
grep -q "^step 4 loss " "$work/rank0.log" || fail "rank0.log: $(cat "$work/rank0.log")"
client fetch "$id" report.json --output="$work/report.json" 2>/dev/null || fail "fetch report.json"
grep -qE '"steps_done": "?5"?' "$work/report.json" || fail "report.json: $(head -c 300 "$work/report.json")"
client fetch "$id" job.textproto --output=- >"$work/job.textproto" || fail "fetch job.textproto"
grep -qx "program_cwd: \"$here\"" "$work/job.textproto" || fail "not run in the server's directory: $(grep program "$work/job.textproto")"
client list >"$work/list.out" || fail "list"
grep -q "^$id .*python3 tests/programs/ddp_train.py --report" "$work/list.out" || fail "list: $(cat "$work/list.out")"
client status "$id" >"$work/status.out" || fail "status"
grep -q "^  command: $(dirname "$py")/python3 tests/programs/ddp_train.py --report --out " "$work/status.out" ||
  fail "status: $(cat "$work/status.out")"

step "a command with a hung rank, cancelled: nothing left"
client submit --device=cpu --workers=2 -- python3 tests/programs/ddp_train.py --steps 100000 --hang_rank 1 \
  --hang_step 3 --out "$work/hang.losses" >"$work/submit.out" 2>&1 || fail "submit: $(cat "$work/submit.out")"
hung=$(tail -n 1 "$work/submit.out")
wait_for 60 grep -q "^step 2 loss" "$work/state/runs/$hung/rank0.log" || fail "the job never reached step 2"
[ -n "$(pgrep -f -- "$work/hang.losses")" ] || fail "the job's ranks are not running"
client cancel "$hung" >"$work/cancel.out" 2>&1 || fail "cancel exited $?: $(cat "$work/cancel.out")"
grep -qx "cancelled" "$work/cancel.out" || fail "cancel: $(cat "$work/cancel.out")"
wait_for 5 none_left "$work/hang.losses" || fail "left running: $(pgrep -af -- "$work/hang.losses")"
job_state "$hung" | grep -q ": cancelled$" || fail "$(job_state "$hung")"

step "SIGTERM to the server: the running command stops, the queued one stays queued"
long="import time; time.sleep(600)"
client submit --device=cpu --workers=2 -- python3 -c "$long" "$work/long" >"$work/submit.out" 2>&1 ||
  fail "submit: $(cat "$work/submit.out")"
running=$(tail -n 1 "$work/submit.out")
client submit --device=cpu --workers=2 -- python3 -c "$long" "$work/queued" >"$work/submit.out" 2>&1 ||
  fail "submit: $(cat "$work/submit.out")"
queued=$(tail -n 1 "$work/submit.out")
wait_for 30 pgrep -f -- "$work/long" || fail "the long command never ran"
job_state "$queued" | grep -q ": queued$" || fail "$(job_state "$queued")"
stop_server
wait_for 5 none_left "$work/long" || fail "left running after the server stopped: $(pgrep -af -- "$work/long")"

step "restarted without --allow_commands: the queued command fails, a new one is refused"
start_server
grep -q "job $queued is a command and this server runs none" "$work/server.log" || fail "no line for the queued command"
client status "$queued" >"$work/status.out" || fail "status"
grep -q ": failed$" <(head -n 1 "$work/status.out") || fail "the queued command: $(cat "$work/status.out")"
grep -q "root cause: .*--allow_commands" "$work/status.out" || fail "its root cause: $(cat "$work/status.out")"
before=$(client list | wc -l)
set +e
out=$(client submit --device=cpu --workers=2 -- python3 tests/programs/ddp_train.py 2>&1)
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "exit $rc for a refused command: $out"
[ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "not one line: $out"
grep -q "^client: this server runs no commands (-- PROGRAM).*--allow_commands" <<<"$out" || fail "the refusal: $out"
[ "$(client list | wc -l)" -eq "$before" ] || fail "the refused command was queued: $(client list)"
client info | grep -qx "  commands: refused" || fail "info: $(client info)"
stop_server
echo "serve_program_test: PASS"
