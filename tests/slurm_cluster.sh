# A real Slurm cluster on this machine, for tests: munged, slurmctld and N slurmd (Debian's packages),
# each node a network namespace (198.18.0.11, .12, ...; the controller 198.18.0.10) joined by a bridge
# inside the controller's namespace, so nothing is added to the root namespace. Every file lives in
# one temporary directory. Source it from a test that runs as root under `unshare --mount` (see
# slurm_test.sh), then:
#
#   slurm_cluster_up 2          # start munged, slurmctld, slurmd n1 and n2; wait until both are idle
#   in_ctl srun -N2 hostname    # Slurm's clients run in the controller's namespace (SLURM_CONF is set)
#   in_node 1 CMD               # a command in node n1's namespace
#   node_pids 1                 # the processes in n1's namespace but its slurmd
#   slurm_cluster_down          # stop every daemon, kill what is left in the namespaces, remove them
#
# slurm_cluster_down runs from the EXIT trap that slurm_cluster_up installs (it chains an existing
# one), also when the test fails. See ../shared/notes/multihost.md for why nsenter (slurmd reads
# /sys/fs/cgroup, which `ip netns exec` remounts) and why a private /etc/hosts.

SLURM_CLUSTER_TMP=""
SLURM_CLUSTER_NODES=0
SLURM_CLUSTER_PIDS=()      # munged, slurmctld, the slurmds: stopped in reverse order
SLURM_CLUSTER_NS_PREFIX="stagehand-slurm-$$"

slurm_cluster_log() { echo "slurm_cluster: $*" >&2; }

# The daemons' logs, for a failing test.
slurm_cluster_dump_logs() {
  [ -n "$SLURM_CLUSTER_TMP" ] || return 0
  for f in "$SLURM_CLUSTER_TMP"/log/*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }
  done
}

ns_name() { if [ "$1" = ctl ]; then echo "$SLURM_CLUSTER_NS_PREFIX-ctl"; else echo "$SLURM_CLUSTER_NS_PREFIX-n$1"; fi; }
in_ctl() { nsenter --net="/run/netns/$(ns_name ctl)" "$@"; }
in_node() { local n=$1; shift; nsenter --net="/run/netns/$(ns_name "$n")" "$@"; }

# Processes in node N's namespace other than its slurmd: what a job left behind.
node_pids() {
  local slurmd=${SLURM_CLUSTER_PIDS[$1 + 1]:-}  # 0 munged, 1 slurmctld, 1+N slurmd nN
  ip netns pids "$(ns_name "$1")" 2>/dev/null | grep -vx "${slurmd:-none}" || true
}

slurm_cluster_check_tools() {
  PATH=$PATH:/usr/sbin:/sbin  # the daemons live there; Bazel's strict test PATH lacks them
  local missing=()
  for t in munged mungekey slurmctld slurmd srun sbatch scancel squeue sinfo scontrol nsenter ip; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    slurm_cluster_log "missing ${missing[*]}: install Debian's slurmctld slurmd slurm-client munge (tools/setup does)"
    return 1
  fi
  [ "$(id -u)" -eq 0 ] || { slurm_cluster_log "needs root (network namespaces, daemons)"; return 1; }
}

# Name lookups from files only: a DNS lookup inside a namespace hangs for about 34 s.
slurm_cluster_private_etc() {
  local t=$SLURM_CLUSTER_TMP
  { echo "127.0.0.1 localhost"; echo "198.18.0.10 ctl"
    for n in $(seq 1 "$SLURM_CLUSTER_NODES"); do echo "198.18.0.$((10 + n)) n$n"; done; } >"$t/etc/hosts"
  echo 'hosts: files' >"$t/etc/nsswitch.conf"
  : >"$t/etc/resolv.conf"
  mount --bind "$t/etc/hosts" /etc/hosts
  mount --bind "$t/etc/nsswitch.conf" /etc/nsswitch.conf
  mount --bind "$t/etc/resolv.conf" /etc/resolv.conf
}

# The controller's namespace holds the bridge; each node's namespace one end of a veth pair.
slurm_cluster_network() {
  local ctl
  ctl=$(ns_name ctl)
  ip netns add "$ctl"
  ip -n "$ctl" link set lo up
  ip -n "$ctl" link add br0 type bridge
  ip -n "$ctl" addr add 198.18.0.10/24 dev br0
  ip -n "$ctl" link set br0 up
  for n in $(seq 1 "$SLURM_CLUSTER_NODES"); do
    local ns
    ns=$(ns_name "$n")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "sc$$n$n" netns "$ctl" type veth peer name eth0 netns "$ns"
    ip -n "$ctl" link set "sc$$n$n" master br0 up
    ip -n "$ns" addr add "198.18.0.$((10 + n))/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
}

slurm_cluster_conf() {
  local t=$SLURM_CLUSTER_TMP
  # slurmctld accepts only a SlurmctldHost named as its host; the hostname is the same in every
  # namespace, so the controller takes it, at the controller namespace's address.
  cat >"$t/slurm.conf" <<EOF
ClusterName=stagehand
SlurmctldHost=$(hostname -s)(198.18.0.10)
SlurmctldPort=6817
SlurmdPort=6818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$t/munge/munge.sock
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SchedulerType=sched/builtin
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool/%n
SlurmctldPidFile=$t/run/slurmctld.pid
SlurmdPidFile=$t/run/slurmd.%n.pid
SlurmctldLogFile=$t/log/slurmctld.log
SlurmdLogFile=$t/log/slurmd.%n.log
PlugStackConfig=$t/plugstack.conf
MailProg=/bin/true
KillWait=5
InactiveLimit=0
MinJobAge=2
EOF
  for n in $(seq 1 "$SLURM_CLUSTER_NODES"); do
    echo "NodeName=n$n NodeAddr=198.18.0.$((10 + n)) CPUs=$(nproc) State=UNKNOWN" >>"$t/slurm.conf"
  done
  echo "PartitionName=p Nodes=ALL Default=YES State=UP MaxTime=INFINITE" >>"$t/slurm.conf"
  : >"$t/plugstack.conf"
}

# Waits (at most `seconds`) until `check` succeeds.
slurm_cluster_wait() {
  local seconds=$1
  shift
  local deadline=$((SECONDS + seconds))
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

slurm_cluster_all_idle() {
  local idle
  idle=$(in_ctl sinfo -h -N -o '%N %t' 2>/dev/null | grep -c ' idle$')
  [ "$idle" -eq "$SLURM_CLUSTER_NODES" ]
}

slurm_cluster_up() {
  SLURM_CLUSTER_NODES=$1
  slurm_cluster_check_tools || return 1
  # Under /tmp, not TEST_TMPDIR: munged's socket path must fit a sockaddr_un (108 bytes).
  SLURM_CLUSTER_TMP=$(mktemp -d /tmp/stagehand-slurm.XXXXXX)
  local t=$SLURM_CLUSTER_TMP
  mkdir -p "$t"/{etc,munge,state,run,log}
  for n in $(seq 1 "$SLURM_CLUSTER_NODES"); do mkdir -p "$t/spool/n$n"; done
  local previous_trap
  previous_trap=$(trap -p EXIT | sed -E "s/^trap -- '(.*)' EXIT$/\1/")
  # shellcheck disable=SC2064
  trap "slurm_cluster_down; ${previous_trap:-:}" EXIT
  mount --make-rprivate /
  slurm_cluster_private_etc
  slurm_cluster_network
  slurm_cluster_conf
  export SLURM_CONF=$t/slurm.conf

  mungekey -c -k "$t/munge/munge.key" >/dev/null 2>&1 || { slurm_cluster_log "mungekey failed"; return 1; }
  chmod 0711 "$t/munge"  # clients reach the socket; the key stays 0600
  munged --socket="$t/munge/munge.sock" --key-file="$t/munge/munge.key" --pid-file="$t/run/munged.pid" \
    --log-file="$t/log/munged.log" --seed-file="$t/munge/seed" --force --foreground >>"$t/log/munged.out.log" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  slurm_cluster_wait 10 test -S "$t/munge/munge.sock" || {
    slurm_cluster_log "munged did not start"
    slurm_cluster_dump_logs >&2
    return 1
  }

  # nsenter itself, not a function: nsenter execs the daemon, so $! is the daemon's pid.
  nsenter --net="/run/netns/$(ns_name ctl)" slurmctld -D -c -f "$SLURM_CONF" >>"$t/log/slurmctld.out.log" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  for n in $(seq 1 "$SLURM_CLUSTER_NODES"); do
    nsenter --net="/run/netns/$(ns_name "$n")" slurmd -D -f "$SLURM_CONF" -N "n$n" >>"$t/log/slurmd.n$n.out.log" 2>&1 &
    SLURM_CLUSTER_PIDS+=($!)
  done
  if ! slurm_cluster_wait 60 slurm_cluster_all_idle; then
    slurm_cluster_log "the nodes did not come up idle within 60 s:"
    in_ctl sinfo -N >&2 2>&1 || true
    slurm_cluster_dump_logs >&2
    return 1
  fi
}

slurm_cluster_down() {
  local rc=$?
  [ -n "$SLURM_CLUSTER_TMP" ] || return "$rc"
  # The daemons in reverse order (slurmds first: their jobs' steps go with them), TERM then KILL.
  local i pid
  for ((i = ${#SLURM_CLUSTER_PIDS[@]} - 1; i >= 0; i--)); do
    kill -TERM "${SLURM_CLUSTER_PIDS[$i]}" 2>/dev/null || true
  done
  for pid in "${SLURM_CLUSTER_PIDS[@]}"; do
    for _ in $(seq 1 25); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Whatever is left in a namespace (a slurmstepd, a launcher, a worker) dies with it.
  for n in ctl $(seq 1 "$SLURM_CLUSTER_NODES"); do
    local ns
    ns=$(ns_name "$n")
    if [ -e "/run/netns/$ns" ]; then
      for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
      ip netns del "$ns" 2>/dev/null || true
    fi
  done
  # A slurmstepd outside the namespaces' process lists (it should not be): by the job's files.
  for pid in $(pgrep -f -- "$SLURM_CLUSTER_TMP" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
  rm -rf "$SLURM_CLUSTER_TMP"
  SLURM_CLUSTER_TMP=""
  SLURM_CLUSTER_PIDS=()
  return "$rc"
}
