#!/usr/bin/env bash
# `launcher --slurm` on a real Slurm cluster of two nodes (tests/slurm_cluster.sh: munged, slurmctld,
# two slurmd in network namespaces): srun's sanity across both nodes; a one-node job step trains the
# tiny GPT (exit 0, report.json); scancel of a running step leaves no launcher or worker behind; a
# two-node step (srun -N2 --ntasks-per-node=1 launcher --slurm, mutual TLS with certificates from
# tools/make_certs, %N in their paths) trains a 2-stage pipeline across the nodes and matches a
# single process (losses within 1e-5 relative, fp32); scancel of a running two-node job leaves
# nothing on either node; scancel of one that writes checkpoints (a preemption) has every rank write
# one into node 0's run directory, both launchers exit 75, and the job resumes from it on one node;
# a program as the workers (`launcher --slurm ... -- PYTHON tests/programs/ddp_train.py`, the .venv's
# torch, gloo on CPU): two nodes of 2 workers end with the one-node losses (1e-6 relative), every rank
# sees torchrun's multi-node variables with node 0's address (not loopback) as MASTER_ADDR and eth0 as
# GLOO_SOCKET_IFNAME, and an exception on node 1's rank ends the job with node 0's root cause naming
# the rank, its node and the ValueError with its file:line; the README's sbatch script trains on both
# nodes.
#
# The nodes' hostname resolves to nothing in the private /etc/hosts, so Gloo's own choice would be
# loopback: the program job checks the launcher's GLOO_SOCKET_IFNAME.
#
# The nodes' names (n1, n2: what SLURM_JOB_NODELIST holds) resolve through the cluster's private
# /etc/hosts to their namespaces' addresses (198.18.0.11, .12), so node 0 serves on n1's address and
# node 1 dials n1 by name; every node has the same hostname, which no check relies on.
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
make_certs=$PWD/tools/make_certs
ddp_train=$PWD/tests/programs/ddp_train.py
show_env=$PWD/tests/programs/show_env.py
[ -x "$launcher" ] && [ -f "$examples/train.sbatch" ] && [ -x "$make_certs" ] && [ -f "$ddp_train" ] && [ -f "$show_env" ] ||
  { echo "slurm_test: launcher, examples/slurm, tools/make_certs or tests/programs not found in $PWD"; exit 1; }
# Python for the program jobs: $STAGEHAND_PYTHON, else the checkout's .venv/bin/python (tools/setup installs torch).
checkout=$(dirname "$(dirname "$(readlink -f tests/slurm_test.sh)")")
py=${STAGEHAND_PYTHON:-$checkout/.venv/bin/python}
"$py" -c 'import torch.distributed' 2>/dev/null || { echo "slurm_test: $py has no torch: run tools/setup"; exit 1; }
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
grep -q 'stagehand: stopped by SIGTERM (exit 143)' "$work/run2.out" || fail "the launcher did not stop on SIGTERM: $(tail -n 5 "$work/run2.out")"
[ -s "$work/run2/report.json" ] || fail "the cancelled run wrote no report.json"
grep -q 'FAILED\|failed at the marked action' "$work/run2.out" && fail "a cancelled run reads as a failure: $(tail -n 5 "$work/run2.out")"
step "cancelled: $(grep -m1 'stopped by SIGTERM' "$work/run2.out")"

# --- Two nodes: node 0 (n1) coordinates at n1:<29500 + job id % 10000>, node 1 (n2) joins it, every
# hop mutual TLS. One set of flags for both nodes, as srun gives them: %N is each node's name.
step "certificates (tools/make_certs)"
certs=$work/certs
"$make_certs" --out="$certs" --ca >/dev/null || fail "make_certs --ca"
for n in 1 2; do
  "$make_certs" --out="$certs" --node="n$n" --ip="198.18.0.$((10 + n))" --dns="n$n" >/dev/null || fail "make_certs n$n"
done
tls=(--tls_cert="$certs/%N.pem" --tls_key="$certs/%N.key" --tls_ca="$certs/ca.pem")
train=(--device=cpu --workers=1 --model=tiny --fp32 --schedule=1f1b --micro_batches=4 --global_batch=16 --steps=3
  --lr=0.003 --partition=uniform --seed=7)
export OMP_NUM_THREADS=1  # the same reduction order in every process (tests/pipeline_test.cc); srun passes it on

# both_nodes_empty: no process but its slurmd in either node's namespace.
both_nodes_empty() { [ -z "$(node_pids 1)$(node_pids 2)" ]; }
# losses FILE: "step loss" per step, from steps.csv (the loss is on the rank with the head).
losses() { awk -F, 'NR > 1 && $3 != "" { print $1, $3 }' "$1" | sort -n; }

step "srun -N2 launcher --slurm without TLS (refused on both nodes before anything starts)"
set +e
out=$(in_ctl timeout 60 srun -N2 --ntasks-per-node=1 "$launcher" --slurm "${train[@]}" --run_dir="$work/notls" 2>&1)
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "a two-node step without TLS ran: $out"
[ "$(grep -c 'is not loopback: every hop between nodes is mutual TLS; pass --tls_cert=DIR/%N.pem' <<<"$out")" -eq 2 ] ||
  fail "the two-node refusal without TLS (exit $rc): $out"
[ ! -e "$work/notls" ] && [ ! -e "$work/notls-node1" ] || fail "a refused launcher created its run directory"

step "srun -N2 launcher --slurm (a 2-stage pipeline across both nodes)"
"$launcher" "${train[@]}" --run_dir="$work/ref" >"$work/ref.out" 2>&1 || fail "the single-process run failed: $(tail -n 20 "$work/ref.out")"
out=$(in_ctl timeout 180 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$launcher" --slurm "${tls[@]}" "${train[@]}" \
  --pipeline_stages=2 --run_dir="$work/run3" 2>&1) || fail "srun -N2 launcher --slurm exited $?: $out"
grep -q 'stagehand: --slurm: job [0-9]*, node 0 of 2 (n1), coordinates, coordinator n1:[0-9]*' <<<"$out" ||
  fail "node 0 did not say it coordinates: $out"
grep -q 'stagehand: --slurm: job [0-9]*, node 1 of 2 (n2), coordinator n1:[0-9]*' <<<"$out" || fail "no node 1 line: $out"
grep -q 'rank 0 on node 0 (198.18.0.11), rank 1 on node 1 (198.18.0.12)' <<<"$out" || fail "the ranks are not one per node: $out"
grep -q 'links across hosts: stage 0 -> 1 (node 0 -> 1)' <<<"$out" || fail "the plan does not report the link across hosts: $out"
grep -q 'stagehand: node 1 at 198.18.0.12: done' <<<"$out" || fail "node 1's agent did not finish: $out"
[ -s "$work/run3-node1/rank1.log" ] || fail "node 1's run directory ($work/run3-node1) has no rank1.log"
losses "$work/ref/steps.csv" >"$work/want"
losses "$work/run3/steps.csv" >"$work/got"
[ "$(wc -l <"$work/want")" -eq 3 ] || fail "the reference has not 3 losses: $(cat "$work/ref/steps.csv")"
[ "$(wc -l <"$work/got")" -eq 3 ] || fail "the two-node run has not 3 losses: $(cat "$work/run3/steps.csv")"
paste -d' ' "$work/want" "$work/got" | awk '
  { d = $2 - $4; if (d < 0) d = -d; a = $2 < 0 ? -$2 : $2
    if ($1 != $3 || d > 1e-5 * a) { printf "step %s: loss %s, single process %s\n", $1, $4, $2; bad = 1 } }
  END { exit bad }' || fail "the two-node losses differ from a single process"
both_nodes_empty || fail "processes left after the two-node run: n1: $(node_pids 1) n2: $(node_pids 2)"
step "two nodes match a single process: $(tr '\n' ' ' <"$work/got")"

# --- A program as the workers (`launcher --slurm ... -- PYTHON ddp_train.py`, the .venv's torch, gloo
# on CPU): one node is the reference; two nodes of 2 workers each end with its losses; every rank sees
# torchrun's multi-node variables with node 0's address as MASTER_ADDR; an exception on a rank of node
# 1 ends the job with node 0's root cause naming it (under --kill-on-bad-exit=1, as the sbatch script
# runs: srun's SIGTERM to node 0 once node 1's launcher exits does not displace it).
# same A B: the two loss files have as many lines and agree within 1e-6 relative (float64 DDP).
same() {
  [ "$(wc -l <"$1")" -eq "$(wc -l <"$2")" ] && [ "$(wc -l <"$1")" -gt 0 ] || fail "$1 and $2 differ in length"
  paste -d' ' "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1
    if (d > 1e-6 * a) { printf "line %d: %s against %s\n", NR, $2, $1; bad = 1 } } END { exit bad }' ||
    fail "$2 differs from $1"
}
step "srun -N1 launcher --slurm -- PYTHON ddp_train.py (one worker: the reference)"
out=$(in_ctl timeout 120 srun -N1 --ntasks-per-node=1 "$launcher" --slurm --device=cpu --workers=1 \
  --run_dir="$work/prog1" -- "$py" "$ddp_train" --out "$work/prog1.losses" 2>&1) || fail "one node exited $?: $out"
grep -q 'stagehand: --slurm: job [0-9]*, one node' <<<"$out" || fail "no --slurm line: $out"
[ "$(wc -l <"$work/prog1.losses")" -eq 5 ] || fail "the reference has not 5 losses: $out"

step "srun -N2 launcher --slurm -- PYTHON ddp_train.py (2 CPU workers on each node)"
out=$(in_ctl timeout 120 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$launcher" --slurm "${tls[@]}" \
  --device=cpu --workers=2 --run_dir="$work/prog2" -- "$py" "$ddp_train" --out "$work/prog2.losses" --report 2>&1) ||
  fail "two nodes exited $?: $out"
grep -q "stagehand: all 2 nodes joined: 4 workers of $py $ddp_train .*; c10d store 198\.18\.0\.11:[0-9]* (MASTER_ADDR, MASTER_PORT)" \
  <<<"$out" || fail "no start line with node 0's store: $out"
grep -q "stagehand: done: 4 workers of $py $ddp_train" <<<"$out" || fail "no done line: $out"
grep -q 'stagehand: node 1 at 198.18.0.12: done' <<<"$out" || fail "node 1's agent did not finish: $out"
[ -e "$work/prog2-node1/rank3.log" ] || fail "node 1's run directory has no rank3.log: $(ls "$work" "$work/prog2-node1")"
same "$work/prog1.losses" "$work/prog2.losses"
# Node 0's steps.csv has every rank's 5 steps: node 1's come through its agent.
for r in 0 1 2 3; do
  [ "$(grep -c "^[0-9]*,$r,0\." "$work/prog2/steps.csv")" -eq 5 ] || fail "node 0's steps.csv lacks rank $r's 5 steps: $(cat "$work/prog2/steps.csv")"
done
both_nodes_empty || fail "processes left after the two-node program: n1: $(node_pids 1) n2: $(node_pids 2)"
step "a program on two nodes matches one process: $(tr '\n' ' ' <"$work/prog2.losses")"

step "srun -N2 launcher --slurm -- PYTHON show_env.py (each rank's variables)"
out=$(in_ctl timeout 120 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$launcher" --slurm "${tls[@]}" \
  --device=cpu --workers=2 --run_dir="$work/env" -- "$py" "$show_env" 2>&1) || fail "show_env exited $?: $out"
port=$(grep -h '^MASTER_PORT=' "$work/env/rank0.log")
[[ "$port" =~ ^MASTER_PORT=[0-9]+$ ]] || fail "rank 0 has no MASTER_PORT: $(cat "$work/env/rank0.log")"
for r in 0 1 2 3; do
  node=$((r / 2))
  dir=$work/env
  [ "$node" -eq 0 ] || dir=$work/env-node$node
  for want in "cwd=$work" "RANK=$r" "LOCAL_RANK=$((r % 2))" "WORLD_SIZE=4" "LOCAL_WORLD_SIZE=2" "GROUP_RANK=$node" \
    "GROUP_WORLD_SIZE=2" "ROLE_RANK=$r" "MASTER_ADDR=198.18.0.11" "$port" "TORCHELASTIC_ERROR_FILE=$dir/rank$r.error.json" \
    "OMP_NUM_THREADS=1" "CUDA_VISIBLE_DEVICES=" "GLOO_SOCKET_IFNAME=eth0"; do
    grep -qx -- "$want" "$dir/rank$r.log" || fail "rank $r on node $node lacks $want: $(cat "$dir/rank$r.log")"
  done
done
both_nodes_empty || fail "processes left after show_env: n1: $(node_pids 1) n2: $(node_pids 2)"

step "srun -N2 launcher --slurm -- PYTHON ddp_train.py --fail_rank 1 (an exception on node 1)"
set +e
in_ctl timeout 120 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 --output="$work/exc.%t.out" "$launcher" --slurm "${tls[@]}" \
  --device=cpu --workers=1 --run_dir="$work/exc" -- "$py" "$ddp_train" --steps 1000 --fail_rank 1 --fail_step 2
rc=$?
set -e
outputs() { echo "--- node 0:"; tail -n 15 "$work/exc.0.out"; echo "--- node 1:"; tail -n 15 "$work/exc.1.out"; }
[ "$rc" -eq 1 ] || fail "srun exited $rc, not 1: $(outputs)"
last=$(tail -n 1 "$work/exc.0.out")
grep -qE '^stagehand: FAILED \(exit 1\): rank 1 \(node 1 at 198\.18\.0\.12, host [^,]+, pid [0-9]+\) (exited with code 1|was killed by signal 6 \(Aborted\)): ValueError: bad batch at step 2 on rank 1 \(ddp_train.py:[0-9]+\); run directory ' \
  <<<"$last" || fail "node 0's root cause: $(outputs)"
# A raise can also end in Gloo's abort at interpreter exit (docs/programs.md, "Known issue").
tail -n 1 "$work/exc.1.out" |
  grep -qE 'stagehand: node 1 at 198\.18\.0\.12: rank 1 \(pid [0-9]+\) (exited with code 1|was killed by signal 6)' ||
  fail "node 1's verdict: $(outputs)"
slurm_cluster_wait 20 both_nodes_empty ||
  fail "processes left after the exception: n1: $(node_pids 1 | xargs -r ps -o pid,args -p) n2: $(node_pids 2 | xargs -r ps -o pid,args -p)"
step "$last"

# --- scancel of a running two-node job: both launchers stop their workers; nothing is left on either.
step "scancel of a running two-node launcher --slurm"
in_ctl srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 --job-name=cancel2 "$launcher" --slurm "${tls[@]}" \
  "${train[@]/--steps=3/--steps=1000000}" --pipeline_stages=2 --run_dir="$work/run5" >"$work/run5.out" 2>&1 &
srun_pid=$!
slurm_cluster_wait 120 bash -c "[ -f '$work/run5/steps.csv' ] && [ \$(wc -l <'$work/run5/steps.csv') -ge 3 ]" ||
  fail "the two-node job to cancel never reached its third step: $(cat "$work/run5.out")"
[ -n "$(node_pids 1)" ] && [ -n "$(node_pids 2)" ] || fail "the two-node job does not run on both nodes"
job_id=$(in_ctl squeue -h -n cancel2 -o %i)
[ -n "$job_id" ] || fail "squeue does not show the two-node job"
in_ctl scancel "$job_id"
t0=$SECONDS
slurm_cluster_wait 30 bash -c "! kill -0 $srun_pid 2>/dev/null" || fail "srun did not end within 30 s of scancel"
wait "$srun_pid" || true
slurm_cluster_wait 20 both_nodes_empty ||
  fail "processes left after scancel: n1: $(node_pids 1 | xargs -r ps -o pid,args -p) n2: $(node_pids 2 | xargs -r ps -o pid,args -p)"
left=$(pgrep -f -- "--run_dir=$work/run5" || true)
[ -z "$left" ] || fail "processes of the cancelled two-node job left: $(ps -o pid,args -p "$left")"
for pid in $(pgrep -f -- "$launcher" || true); do fail "a launcher is left: $(ps -o pid,args -p "$pid")"; done
grep -q 'stagehand: stopped by SIGTERM (exit 143)' "$work/run5.out" || fail "the launchers did not stop on SIGTERM: $(tail -n 8 "$work/run5.out")"
[ -s "$work/run5/report.json" ] || fail "the cancelled two-node run wrote no report.json"
step "cancelled on both nodes, nothing left after $((SECONDS - t0)) s"

# --- A preemption of a two-node job that writes checkpoints: scancel's SIGTERM reaches both launchers;
# every rank writes a checkpoint at one step into node 0's run directory and both exit 75; the job
# resumes from it on one node with one stage.
step "scancel of a two-node launcher --slurm with --checkpoint_every (a preemption)"
in_ctl srun -N2 --ntasks-per-node=1 --job-name=preempt "$launcher" --slurm "${tls[@]}" \
  "${train[@]/--steps=3/--steps=1000000}" --pipeline_stages=2 --checkpoint_every=100000 --run_dir="$work/run6" \
  >"$work/run6.out" 2>&1 &
srun_pid=$!
slurm_cluster_wait 120 bash -c "[ -f '$work/run6/steps.csv' ] && [ \$(wc -l <'$work/run6/steps.csv') -ge 3 ]" ||
  fail "the job to preempt never reached its third step: $(cat "$work/run6.out")"
job_id=$(in_ctl squeue -h -n preempt -o %i)
[ -n "$job_id" ] || fail "squeue does not show the job to preempt"
in_ctl scancel "$job_id"
slurm_cluster_wait 30 bash -c "! kill -0 $srun_pid 2>/dev/null" || fail "srun did not end within 30 s of scancel"
wait "$srun_pid" || true
slurm_cluster_wait 20 both_nodes_empty ||
  fail "processes left after the preemption: n1: $(node_pids 1 | xargs -r ps -o pid,args -p) n2: $(node_pids 2 | xargs -r ps -o pid,args -p)"
grep -q 'stagehand: stopped (exit 75): stopped by .*SIGTERM after a checkpoint at step [0-9]' "$work/run6.out" ||
  fail "node 0 did not stop after a checkpoint: $(tail -n 12 "$work/run6.out")"
grep -q 'stagehand: node 1 at 198.18.0.12: stopped by .*SIGTERM after a checkpoint at step [0-9]* (rank 1, exit 75)' \
  "$work/run6.out" || fail "node 1 did not stop after the checkpoint: $(tail -n 12 "$work/run6.out")"
ckpt=$(ls -d "$work"/run6/checkpoints/step_* | tail -n 1)
[ -f "$ckpt/MANIFEST" ] && [ -f "$ckpt/rank0.safetensors" ] && [ -f "$ckpt/rank1.safetensors" ] ||
  fail "the checkpoint is not whole in node 0's run directory: $(ls -R "$work/run6/checkpoints")"
at=$((10#${ckpt##*step_}))
out=$(in_ctl timeout 180 srun -N1 --ntasks-per-node=1 "$launcher" --slurm --device=cpu --workers=1 \
  --resume="$work/run6" --steps=$((at + 2)) --run_dir="$work/run7" 2>&1) || fail "the resumed run failed: $out"
grep -q "resuming from step $at of " <<<"$out" || fail "the resumed run did not start at step $at: $out"
[ "$(losses "$work/run7/steps.csv" | wc -l)" -eq 2 ] || fail "the resumed run has not 2 losses: $(cat "$work/run7/steps.csv")"
step "preempted at step $at on both nodes (exit 75), resumed on one node"

# --- The README's sbatch script (less its GPU request: this cluster has none) trains on both nodes.
step "sbatch examples/slurm/train.sbatch (two nodes)"
sed '/--gpus-per-node/d' "$examples/train.sbatch" >"$work/train.sbatch"
in_ctl timeout 180 sbatch --wait --quiet -o "$work/sbatch.out" --export="ALL,LAUNCHER=$launcher,CERTS=$certs" \
  "$work/train.sbatch" --device=cpu --workers=1 --model=tiny --steps=3 --fp32 --run_dir="$work/run4" ||
  fail "sbatch --wait of the example script failed: $(tail -n 20 "$work/sbatch.out")"
grep -q 'stagehand: done' "$work/sbatch.out" || fail "the sbatch job did not finish its run: $(tail -n 20 "$work/sbatch.out")"
grep -q 'rank 0 on node 0 (198.18.0.11), rank 1 on node 1 (198.18.0.12)' "$work/sbatch.out" ||
  fail "the sbatch job did not run on both nodes: $(tail -n 20 "$work/sbatch.out")"
[ -s "$work/run4/report.json" ] || fail "the sbatch job wrote no report.json"
both_nodes_empty || fail "processes left after the sbatch job: n1: $(node_pids 1) n2: $(node_pids 2)"

echo "slurm_test: PASS"
