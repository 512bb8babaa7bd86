#!/usr/bin/env bash
# Our c10d store (launcher/store) against torch's own TCPStore client from the checkout's venv: every
# store operation, the client's wait and get timeouts, a wait ended by another client's later set, bad
# clients and a value over the limit closed alone, two stores at once on their own picked ports, and
# two processes of init_process_group("gloo", init_method="env://") with
# TORCHELASTIC_USE_AGENT_STORE=True (torch then connects as a client only) and an all_reduce.
# Python: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python.
set -euo pipefail
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
server=$PWD/launcher/store/store_server_for_test
client=$PWD/tests/c10d_store_client.py
checkout=$(dirname "$(dirname "$(readlink -f tests/c10d_store_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
[ -x "$server" ] && [ -f "$client" ] || { echo "c10d_store_test: the server or the client not found in $PWD"; exit 1; }
"$py" -c "import torch.distributed" 2>/dev/null \
  || { echo "c10d_store_test: $py has no torch: run tools/setup (or set STAGEHAND_PYTHON)"; exit 1; }

t=$(mktemp -d "${TEST_TMPDIR:-/tmp}/c10d_store_test.XXXXXX")
cleanup() {  # whatever this shell started and is still running (a failed check's servers)
  local p
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$t"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo XDG_CACHE_HOME=$t/cache
fail() { echo "c10d_store_test: FAILED: $*"; exit 1; }

# start NAME [ARGS...]: a server whose stdin is the fifo $t/NAME.in, held open here (read-write, so
# that opening it never blocks) and closed in every later server; sets port_NAME, pid_NAME and fd_NAME
# once it printed its port (bounded: 10 s).
fifo_fds=()
start() {
  local name=$1; shift
  mkfifo "$t/$name.in"
  local fd
  exec {fd}<>"$t/$name.in"
  (
    for f in "${fifo_fds[@]}"; do eval "exec $f>&-"; done
    eval "exec $fd>&-"
    exec "$server" "$@"
  ) <"$t/$name.in" >"$t/$name.port" 2>"$t/$name.log" &
  local pid=$!
  fifo_fds+=("$fd")
  local i
  for i in $(seq 100); do
    [ -s "$t/$name.port" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$t/$name.log"; fail "server $name exited before printing its port"; }
    sleep 0.1
  done
  local port
  port=$(head -n1 "$t/$name.port")
  [[ "$port" =~ ^[0-9]+$ ]] || fail "server $name printed no port in 10 s"
  printf -v "port_$name" '%s' "$port"
  printf -v "pid_$name" '%s' "$pid"
  printf -v "fd_$name" '%s' "$fd"
}
# stopped NAME HOW: after HOW (stdin: its fifo closed; term: SIGTERM), the server exits 0 within 10 s.
stopped() {
  local name=$1 how=$2 pid_var=pid_$1 fd_var=fd_$1 i rc=0
  local pid=${!pid_var}
  if [ "$how" = stdin ]; then eval "exec ${!fd_var}>&-"; else kill -TERM "$pid"; fi
  for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && fail "server $name still running 10 s after its $how closed"
  wait "$pid" || rc=$?
  [ "$rc" = 0 ] || { cat "$t/$name.log"; fail "server $name exited $rc after its $how"; }
  echo "c10d_store_test: ok: server $name stopped by its $how"
}
run() {  # run NAME ARGS...: the client, bounded; its output shown
  local name=$1 rc=0; shift
  timeout -k 5 180 "$py" "$client" "$@" >"$t/$name.out" 2>&1 || rc=$?
  sed "s/^/  $name: /" "$t/$name.out"
  [ "$rc" = 0 ] || fail "client $name exited $rc"
}

start a
start b --max_value_bytes=1048576
[ "$port_a" != "$port_b" ] || fail "two servers on one port $port_a"
echo "c10d_store_test: ok: two servers, ports $port_a and $port_b"
run ops ops "$port_a"
run apart apart "$port_a" "$port_b"
run over_limit over_limit "$port_b" 1048576
grep -q "a value of 1048577 bytes; the store takes at most 1048576" "$t/b.log" \
  || { cat "$t/b.log"; fail "server b did not log why it closed the client over the limit"; }
if grep -q 'yyyyyyyy' "$t/a.log" "$t/b.log"; then fail "a value appears in a server's log"; fi

# A process group over a fresh store: torch's env:// rendezvous connects to it as a client only.
start pg
rc0=0 rc1=0
for rank in 0 1; do
  MASTER_ADDR=127.0.0.1 MASTER_PORT=$port_pg WORLD_SIZE=2 RANK=$rank LOCAL_RANK=$rank \
    TORCHELASTIC_USE_AGENT_STORE=True timeout -k 5 180 "$py" "$client" pg >"$t/pg$rank.out" 2>&1 &
  eval "pg_pid$rank=$!"
done
wait "$pg_pid0" || rc0=$?
wait "$pg_pid1" || rc1=$?
sed 's/^/  pg rank 0: /' "$t/pg0.out"
sed 's/^/  pg rank 1: /' "$t/pg1.out"
[ "$rc0" = 0 ] && [ "$rc1" = 0 ] || fail "init_process_group ranks exited $rc0 and $rc1"
run count count "$port_pg" 2

stopped b term
stopped pg stdin
stopped a stdin
echo "c10d_store_test: PASSED"
