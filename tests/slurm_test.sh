#!/usr/bin/env bash
# `launcher --slurm` on a real Slurm cluster of two nodes (tests/slurm_cluster.sh: munged, slurmctld,
# two slurmd in network namespaces): srun's sanity across both nodes; a one-node job step trains the
# tiny GPT (exit 0, report.json); scancel of a running step leaves no launcher or worker behind; the
# README's sbatch script trains; a two-node step is refused until the multi-node launcher lands (then
# the marked block runs it).
#
# Root (namespaces and daemons); runs under `unshare --mount` for the private /etc/hosts.
set -euo pipefail
if [ -z "${STAGEHAND_SLURM_TEST_INNER:-}" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "slurm_test: needs root (network namespaces, Slurm daemons)"; exit 1; }
  exec env STAGEHAND_SLURM_TEST_INNER=1 unshare --mount bash "$0" "$@"
fi
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
launcher=$PWD/launcher/launcher
examples=$PWD/examples/slurm
[ -x "$launcher" ] && [ -f "$examples/train.sbatch" ] || { echo "slurm_test: launcher or examples/slurm not found in $PWD"; exit 1; }
# shellcheck source=tests/slurm_cluster.sh
source "$PWD/tests/slurm_cluster.sh"

fail() { echo "slurm_test: FAIL: $*"; slurm_cluster_dump_logs; exit 1; }
step() { echo "slurm_test: $*"; }

slurm_cluster_up 2 || fail "the cluster did not start"
work=$SLURM_CLUSTER_TMP/work
mkdir -p "$work"
cd "$work"  # srun runs tasks in the directory it was called from

# --- srun across both nodes: one task each, told its node id; each node is its own host (address).
step "srun -N2 sanity"
out=$(in_ctl timeout 60 srun -N2 --ntasks-per-node=1 bash -c \
  'echo "$SLURM_NODEID $SLURM_NNODES $(ip -4 -o addr show dev eth0 | grep -o "198\.18\.0\.[0-9]*") $(scontrol show hostnames "$SLURM_JOB_NODELIST" | tr "\n" " ")"' \
  2>&1) || fail "srun -N2: $out"
[ "$(sort <<<"$out")" = "$(printf '0 2 198.18.0.11 n1 n2 \n1 2 198.18.0.12 n1 n2 ')" ] || fail "srun -N2 printed: $out"

# --- A one-node step trains.
step "srun -N1 launcher --slurm (train the tiny GPT)"
out=$(in_ctl timeout 180 srun -N1 --ntasks-per-node=1 "$launcher" --slurm --device=cpu --workers=2 --model=tiny \
  --steps=5 --fp32 --run_dir="$work/run1" 2>&1) || fail "launcher --slurm exited $?: $out"
grep -q 'stagehand: --slurm: job [0-9]*, one node' <<<"$out" || fail "no --slurm line: $out"
grep -q 'stagehand: done' <<<"$out" || fail "no done line: $out"
[ -s "$work/run1/report.json" ] || fail "no report.json in $work/run1"
grep -qE '"steps_done": "?5"?' "$work/run1/report.json" || fail "report.json: $(head -c 400 "$work/run1/report.json")"

# --- scancel of a running step: the launcher stops its workers and nothing of the job is left.
step "scancel of a running launcher --slurm"
in_ctl srun -N1 --ntasks-per-node=1 --job-name=cancelme "$launcher" --slurm --device=cpu --workers=2 --model=tiny \
  --steps=1000000 --fp32 --run_dir="$work/run2" >"$work/run2.out" 2>&1 &
srun_pid=$!
# Running once steps arrive (the workers are up).
slurm_cluster_wait 120 bash -c "[ -f '$work/run2/steps.csv' ] && [ \$(wc -l <'$work/run2/steps.csv') -ge 3 ]" \
  || fail "the job to cancel never reached its third step: $(cat "$work/run2.out")"
job_id=$(in_ctl squeue -h -n cancelme -o %i)
[ -n "$job_id" ] || fail "squeue does not show the job"
node=$(in_ctl squeue -h -j "$job_id" -o %N)
node=${node#n}
[ -n "$(node_pids "$node")" ] || fail "no processes in n$node's namespace while the job runs"
in_ctl scancel "$job_id"
slurm_cluster_wait 30 bash -c "! kill -0 $srun_pid 2>/dev/null" || fail "srun did not end within 30 s of scancel"
wait "$srun_pid" || true
# Nothing of the job in the node's namespace, nor anywhere with its binaries or run directory.
slurm_cluster_wait 20 bash -c "[ -z \"\$(ip netns pids $(ns_name "$node") | grep -vx ${SLURM_CLUSTER_PIDS[$node + 1]})\" ]" \
  || fail "processes left in n$node after scancel: $(node_pids "$node" | xargs -r ps -o pid,args -p)"
left=$(pgrep -f -- "--run_dir=$work/run2" || true)
[ -z "$left" ] || fail "processes of the cancelled job left: $(ps -o pid,args -p "$left")"
for pid in $(pgrep -f -- "$launcher" || true); do fail "a launcher is left: $(ps -o pid,args -p "$pid")"; done
# Slurm's SIGTERM reached the launcher, which stopped its workers and wrote its results.
grep -q 'interrupted by SIGTERM' "$work/run2.out" || fail "the launcher did not stop on SIGTERM: $(tail -n 5 "$work/run2.out")"
[ -s "$work/run2/report.json" ] || fail "the cancelled run wrote no report.json"
step "cancelled: $(grep -m1 'interrupted by SIGTERM' "$work/run2.out")"

# --- The README's sbatch script (less its GPU request: this cluster has none) trains too.
step "sbatch examples/slurm/train.sbatch"
sed '/--gpus-per-node/d' "$examples/train.sbatch" >"$work/train.sbatch"
in_ctl timeout 180 sbatch --wait --quiet -o "$work/sbatch.out" --export="ALL,LAUNCHER=$launcher" "$work/train.sbatch" \
  --device=cpu --workers=2 --model=tiny --steps=3 --fp32 --run_dir="$work/run4" \
  || fail "sbatch --wait of the example script failed: $(tail -n 20 "$work/sbatch.out")"
grep -q 'stagehand: done' "$work/sbatch.out" || fail "the sbatch job did not finish its run: $(tail -n 20 "$work/sbatch.out")"
[ -s "$work/run4/report.json" ] || fail "the sbatch job wrote no report.json"

# --- Two nodes.
# MULTI-NODE (issue 13): until --slurm fills --nodes/--node_rank/--coordinator_address (and the TLS
# files: tools/make_certs), a two-node step is refused (exit 2). Then replace this block with the
# training run below and its checks (rank 0's report.json holds every rank; node 1 runs an agent;
# scancel leaves nothing on either node):
#   in_ctl srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$launcher" --slurm --device=cpu \
#     --workers=2 --model=tiny --steps=5 --fp32 --run_dir="$work/run3"
step "srun -N2 launcher --slurm (refused until --slurm is wired to --nodes)"
set +e
out=$(in_ctl timeout 60 srun -N2 --ntasks-per-node=1 "$launcher" --slurm --device=cpu --workers=2 --model=tiny \
  --steps=5 --fp32 --run_dir="$work/run3" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a two-node step ran: $out"
[ "$(grep -c 'is not wired to --nodes yet' <<<"$out")" -eq 2 ] || fail "two-node refusal (exit $rc): $out"
grep -q 'the coordinator would be n1:' <<<"$out" || fail "the refusal does not name n1 as the coordinator: $out"

echo "slurm_test: PASS"
