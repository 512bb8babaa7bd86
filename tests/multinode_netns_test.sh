#!/usr/bin/env bash
# One job across three hosts: three network namespaces (198.18.0.11, .12, .13) joined through a
# bridge in a fourth ("the switch"), one launcher in each (node 0 coordinates with 2 CPU workers,
# nodes 1 and 2 are agents with 1 each), mutual TLS with certificates made here. A 4-stage pipeline
# of tiny and of llama-tiny matches a single process (losses within 1e-5 relative, fp32). Then the
# failures, each a fresh job: kill -9 of an agent, kill -9 of a worker on another host, a worker on
# another host stopped (SIGSTOP: it hangs), one host's link set down mid-run: each ends the job on
# every host within 5 s, node 0's root cause names the node, its address and (for a worker) the
# rank, and nothing is left in any namespace. And kill -9 of node 0's launcher: both agents lose the
# coordinator and stop their workers within 5 s.
#
# Runs under `unshare --mount` with a private /etc/hosts, nsswitch.conf and resolv.conf (a DNS lookup
# inside a namespace would hang); the namespaces, and everything in them, are removed on any exit.
# Traffic goes only to 198.18.0.0/24 and loopback.
set -euo pipefail
if [ -z "${STAGEHAND_NETNS_TEST_INNER:-}" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "multinode_netns_test: needs root (network namespaces)"; exit 1; }
  exec env STAGEHAND_NETNS_TEST_INNER=1 unshare --mount bash "$0" "$@"
fi
mount --make-rprivate /
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
[ -x "$launcher" ] || { echo "multinode_netns_test: launcher not found in $PWD"; exit 1; }
export OMP_NUM_THREADS=1  # the same reduction order in every process (tests/pipeline_test.cc)

tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/multinode_netns.XXXXXX")
ns_sw=sh-sw-$$
ns=(sh-n0-$$ sh-n1-$$ sh-n2-$$)
addr=(198.18.0.11 198.18.0.12 198.18.0.13)
coordinator=${addr[0]}:29500
pids=()
cleanup() {
  local rc=$?
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for n in "${ns[@]}" "$ns_sw"; do
    if [ -e "/run/netns/$n" ]; then
      for p in $(ip netns pids "$n" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
      ip netns del "$n" 2>/dev/null || true
    fi
  done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
fail() {
  echo "multinode_netns_test: FAIL: $*"
  for f in "$tmp"/*.out; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done
  exit 1
}

printf '127.0.0.1 localhost\n198.18.0.11 node0\n198.18.0.12 node1\n198.18.0.13 node2\n' >"$tmp/hosts"
echo 'hosts: files' >"$tmp/nsswitch.conf"
: >"$tmp/resolv.conf"
mount --bind "$tmp/hosts" /etc/hosts
mount --bind "$tmp/nsswitch.conf" /etc/nsswitch.conf
mount --bind "$tmp/resolv.conf" /etc/resolv.conf

# The switch: a bridge inside its own namespace; each host's veth pair is made directly inside the
# namespaces, so that nothing is ever created in the root namespace.
ip netns add "$ns_sw"
ip -n "$ns_sw" link add br0 type bridge
ip -n "$ns_sw" link set br0 up
for i in 0 1 2; do
  ip netns add "${ns[$i]}"
  ip link add "e$i" netns "${ns[$i]}" type veth peer name "p$i" netns "$ns_sw"
  ip -n "$ns_sw" link set "p$i" master br0 up
  ip -n "${ns[$i]}" addr add "${addr[$i]}/24" dev "e$i"
  ip -n "${ns[$i]}" link set lo up
  ip -n "${ns[$i]}" link set "e$i" up
done
in_node() { local i=$1; shift; nsenter --net="/run/netns/${ns[$i]}" "$@"; }

cd "$tmp"
openssl_quiet() { openssl "$@" >/dev/null 2>&1 || fail "openssl $*"; }
openssl_quiet req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -subj /CN=job-ca -days 2
for i in 0 1 2; do
  printf 'subjectAltName=IP:%s,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' "${addr[$i]}" >"node$i.ext"
  openssl_quiet req -newkey rsa:2048 -nodes -keyout "node$i.key" -out "node$i.csr" -subj "/CN=node$i"
  openssl_quiet x509 -req -in "node$i.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -out "node$i.pem" -days 2 \
    -extfile "node$i.ext"
done
tls() { echo "--tls_cert=$tmp/node$1.pem --tls_key=$tmp/node$1.key --tls_ca=$tmp/ca.pem"; }

# start_job NAME MODEL STEPS: node 0 and the two agents in the background, each in its namespace
# (env and nsenter exec the launcher, so $! is the launcher's pid), each with NCCL's settings of its
# own host (NCCL_SOCKET_IFNAME=e<node>), which its workers must get.
start_job() {
  local name=$1 model=$2 steps=$3
  # shellcheck disable=SC2046
  env NCCL_SOCKET_IFNAME=e0 nsenter --net="/run/netns/${ns[0]}" "$launcher" --nodes=3 --node_rank=0 --coordinator_address="$coordinator" $(tls 0) \
    --device=cpu --workers=2 --pipeline_stages=4 --model="$model" --fp32 --schedule=1f1b --micro_batches=4 \
    --global_batch=16 --steps="$steps" --lr=0.003 --partition=uniform --seed=7 --run_dir="$tmp/$name-0" \
    >"$tmp/$name-0.out" 2>&1 &
  pid0=$!
  for i in 1 2; do
    # shellcheck disable=SC2046
    env NCCL_SOCKET_IFNAME="e$i" NCCL_IB_DISABLE=1 nsenter --net="/run/netns/${ns[$i]}" "$launcher" --nodes=3 --node_rank="$i" --coordinator_address="$coordinator" $(tls "$i") \
      --device=cpu --workers=1 --run_dir="$tmp/$name-$i" >"$tmp/$name-$i.out" 2>&1 &
    eval "pid$i=\$!"
  done
  pids=("$pid0" "$pid1" "$pid2")
}

# wait_all SECONDS: every launcher of the job has exited within SECONDS (rc0 etc. set), else fail.
wait_all() {
  local limit=$1 start=$SECONDS
  for i in 0 1 2; do
    local p
    eval "p=\$pid$i"
    while kill -0 "$p" 2>/dev/null; do
      [ $((SECONDS - start)) -le "$limit" ] || fail "node $i's launcher still runs after ${limit} s"
      sleep 0.05
    done
    set +e
    wait "$p"
    eval "rc$i=\$?"
    set -e
  done
}

# nothing_left: no process in any host's namespace.
nothing_left() {
  for i in 0 1 2; do
    local left
    left=$(ip netns pids "${ns[$i]}" | tr '\n' ' ')
    [ -z "$left" ] || fail "$1: processes left in node $i's namespace: $left"
  done
}

# losses FILE: "step loss" per step, from steps.csv (the loss is on the rank with the head).
losses() { awk -F, 'NR > 1 && $3 != "" { print $1, $3 }' "$1" | sort -n; }

for model in tiny llama-tiny; do
  "$launcher" --device=cpu --workers=1 --model="$model" --fp32 --schedule=1f1b --micro_batches=4 --global_batch=16 \
    --steps=3 --lr=0.003 --partition=uniform --seed=7 --run_dir="$tmp/ref-$model" >"$tmp/ref-$model.out" 2>&1 ||
    fail "the single-process $model run failed"
  start_job "$model" "$model" 3
  wait_all 120
  [ "$rc0" -eq 0 ] && [ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] || fail "$model: exit codes $rc0 $rc1 $rc2, not 0 0 0"
  grep -q "ranks 0-1 on node 0 (198.18.0.11), rank 2 on node 1 (198.18.0.12), rank 3 on node 2 (198.18.0.13)" \
    "$tmp/$model-0.out" || fail "$model: node 0 did not print the ranks of each node"
  grep -q "links across hosts: stage 1 -> 2 (node 0 -> 1), stage 2 -> 3 (node 1 -> 2)" "$tmp/$model-0.out" ||
    fail "$model: the plan does not report the links across hosts"
  losses "$tmp/ref-$model/steps.csv" >"$tmp/want"
  losses "$tmp/$model-0/steps.csv" >"$tmp/got"
  [ "$(wc -l <"$tmp/want")" -eq 3 ] || fail "$model: the reference has not 3 losses"
  paste -d' ' "$tmp/want" "$tmp/got" | awk -v m="$model" '
    { d = $2 - $4; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
      if ($1 != $3 || d > 1e-5 * a) { printf "%s step %s: loss %s, single process %s\n", m, $1, $4, $2; bad = 1 } }
    END { exit bad }' || fail "$model: losses differ from a single process"
  [ "$(wc -l <"$tmp/got")" -eq 3 ] || fail "$model: the 3-host run has not 3 losses"
  nothing_left "$model"
  echo "multinode_netns_test: $model on 3 hosts matches a single process"
done

# fail_case NAME ACTION EXPECTED...: a long job; once node 0 has printed step 3, ACTION; then every
# launcher must end within 5 s, node 0 non-zero with each EXPECTED text in its root cause.
fail_case() {
  local name=$1 action=$2
  shift 2
  start_job "$name" tiny 100000
  for _ in $(seq 600); do
    grep -qs "step 3/" "$tmp/$name-0.out" && break
    kill -0 "$pid0" 2>/dev/null || fail "$name: node 0 ended before step 3"
    sleep 0.1
  done
  grep -q "step 3/" "$tmp/$name-0.out" || fail "$name: no step 3 within 60 s"
  local ms0
  ms0=$(date +%s%3N)
  $action
  wait_all 5
  nothing_left "$name"
  [ "$rc0" -ne 0 ] || fail "$name: node 0 exited 0"
  local cause
  cause=$(grep "stagehand: FAILED" "$tmp/$name-0.out" || true)
  [ -n "$cause" ] || fail "$name: node 0 printed no root cause"
  for want in "$@"; do
    grep -qF -- "$want" <<<"$cause" || fail "$name: the root cause does not name '$want': $cause"
  done
  echo "multinode_netns_test: $name ended everywhere within $(($(date +%s%3N) - ms0)) ms: $cause"
}

kill_agent() { kill -9 "$pid1"; }
kill_remote_worker() {
  local w
  w=$(ip netns pids "${ns[2]}" | grep -vx "$pid2" | head -n 1)
  [ -n "$w" ] || fail "no worker found in node 2's namespace"
  # The worker runs with its own host's NCCL settings (its agent's environment), not node 0's.
  # Read whole first: `tr | grep -q` fails under pipefail when grep's early exit kills tr (SIGPIPE).
  env_of_w=$(tr '\0' '\n' <"/proc/$w/environ")
  grep -qx NCCL_SOCKET_IFNAME=e2 <<<"$env_of_w" ||
    fail "node 2's worker lacks its host's NCCL_SOCKET_IFNAME=e2: $(tr '\0' ' ' <"/proc/$w/environ" | grep -o 'NCCL_[A-Z_]*=[^ ]*')"
  grep -qx NCCL_IB_DISABLE=1 <<<"$env_of_w" || fail "node 2's worker lacks NCCL_IB_DISABLE=1"
  kill -9 "$w"
}
stop_remote_worker() {
  local w
  w=$(ip netns pids "${ns[2]}" | grep -vx "$pid2" | head -n 1)
  [ -n "$w" ] || fail "no worker found in node 2's namespace"
  kill -STOP "$w"
}
cut_link() { ip -n "${ns[1]}" link set e1 down; }

fail_case agent-killed kill_agent "node 1 at 198.18.0.12"
fail_case worker-killed kill_remote_worker "rank 3 (node 2 at 198.18.0.13" "killed by signal 9"
fail_case worker-stopped stop_remote_worker "rank 3 (node 2 at 198.18.0.13" "stopped heartbeating"
fail_case link-down cut_link "node 1 at 198.18.0.12" "stopped heartbeating"
grep -q "lost the coordinator" "$tmp/link-down-1.out" || fail "link-down: node 1 did not say it lost the coordinator"
ip -n "${ns[1]}" link set e1 up

# kill -9 of node 0's launcher: its workers die with it (PR_SET_PDEATHSIG); each agent loses the
# coordinator (its long poll breaks) and stops its own workers: every namespace is empty within 5 s.
start_job coordinator-killed tiny 100000
for _ in $(seq 600); do
  grep -qs "step 3/" "$tmp/coordinator-killed-0.out" && break
  kill -0 "$pid0" 2>/dev/null || fail "coordinator-killed: node 0 ended before step 3"
  sleep 0.1
done
grep -q "step 3/" "$tmp/coordinator-killed-0.out" || fail "coordinator-killed: no step 3 within 60 s"
ms0=$(date +%s%3N)
kill -9 "$pid0"
wait_all 5
nothing_left coordinator-killed
for i in 1 2; do
  eval "rc=\$rc$i"
  [ "$rc" -ne 0 ] || fail "coordinator-killed: node $i exited 0"
  grep -q "lost the coordinator" "$tmp/coordinator-killed-$i.out" ||
    fail "coordinator-killed: node $i did not say it lost the coordinator: $(tail -n 3 "$tmp/coordinator-killed-$i.out")"
done
echo "multinode_netns_test: coordinator-killed: both agents stopped their workers within $(($(date +%s%3N) - ms0)) ms"

# A non-loopback coordinator without TLS is refused at start (exit 2), naming what to pass.
set +e
in_node 0 "$launcher" --nodes=3 --coordinator_address="$coordinator" --device=cpu --workers=2 \
  --run_dir="$tmp/refused" >"$tmp/refused.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "a non-loopback start without TLS: exit $rc, not 2"
grep -q -- "--tls_cert" "$tmp/refused.out" || fail "the refusal does not say to pass --tls_cert"
[ ! -e "$tmp/refused" ] || fail "the refused launcher created its run directory"
pids=()
echo "multinode_netns_test: ok"
