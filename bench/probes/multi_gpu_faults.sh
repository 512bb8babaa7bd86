#!/usr/bin/env bash
# A restart after kill -9, and a model too big for one GPU, on GPUS GPUs (default 2).
# `bash bench/probes/multi_gpu_faults.sh [GPUS]` from the repository root with dist/bundle carried. On one
# GPU it is the dry run: the refusal, and the restart with rank 0 as the victim.
#
# 1. Too big for one GPU: Llama at Llama-2-13B's sizes (--hidden=5120 --heads=40 --kv_heads=40
#    --ffn_hidden=13824 --layers=40, TinyLlama's vocabulary and sequence; 13.0B parameters: AdamW's fp32
#    state alone is 208 GB). Asked for on one GPU, the launcher must refuse it before any worker starts:
#    exit 2, one line. On GPUS >= 2, it trains as a GPUS-stage pipeline for 6 steps: exit code, tokens/s
#    and peak memory per GPU. Where the planner also refuses that on GPUS GPUs (its line says so), the
#    same is tried with 32 layers (10.5B parameters), which does not fit one H200 either. (Llama-3-8B's
#    shape, 7.24B parameters, trains on one H200: 0.755 s a step of 8 x 1024 tokens, the dry run of
#    2026-12-03.)
# 2. Restart: GPT at --hidden=1024 --heads=16 --layers=8 (gpt-1.3b's vocabulary and sequence, 168M
#    parameters, a 2 GB checkpoint) as a GPUS-stage pipeline, 50 steps over a token file, seed 1.
#    U runs uninterrupted. K runs with --checkpoint_every=20 --max_restarts=1, and once step 30 is
#    printed its last rank gets kill -9. K must exit 0, and its loss curve (each step's last
#    incarnation) must match U's within 2e-2 relative, step by step.
# Logs under $OUT (one tarball); run directories in a temporary directory, removed however the script exits. The
# table is printed last.
set -uo pipefail
tmp=$(mktemp -d)
gpus=${1:-2}
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
work="$tmp/mgf" logs="$tmp/mgf_logs"
rm -rf "$work" "$logs"; mkdir -p "$work" "$logs"
trap 'pkill -f -- "--run_dir=$work/" 2>/dev/null; tar -C "$logs" -czf "$out/mgf.tgz" . 2>/dev/null; rm -rf "$work" "$logs"; rm -rf "$tmp"' EXIT
run=dist/bundle/run
rows=$logs/rows.md
t() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(t)" 'BEGIN {printf "%.2f", b - a}'; }
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader >"$logs/gpus.txt" 2>&1
have=$(grep -c . "$logs/gpus.txt")
[ "$have" -ge "$gpus" ] || { echo "multi_gpu_faults.sh: asked for $gpus GPUs, the host has $have"; exit 2; }

# 1. Too big for one GPU.
l13=(--model=tinyllama-1.1b --hidden=5120 --heads=40 --kv_heads=40 --ffn_hidden=13824 --layers=40)
l10=(--model=tinyllama-1.1b --hidden=5120 --heads=40 --kv_heads=40 --ffn_hidden=13824 --layers=32)
big() {  # NAME GPUS SIZE-ARGS...
  local name=$1 n=$2; shift 2
  local t0=$(t)
  timeout 400 $run launcher --gpus="$n" "$@" --steps=6 --global_batch=8 --micro_batches=8 --pipeline_stages="$n" \
    --overwrite --run_dir="$work/$name" >"$logs/$name.log" 2>&1
  local rc=$? secs=$(since "$t0")
  local spawned=no; [ -f "$work/$name/rank0.log" ] && spawned=yes
  python3 - "$work/$name" "$name" "$rc" "$secs" "$spawned" "$(grep -m1 '^stagehand: ' "$logs/$name.log" | cut -c1-300)" >>"$rows" <<'PY'
import csv, json, sys
d, name, rc, secs, spawned, line = sys.argv[1:]
try:
    r = json.load(open(f"{d}/report.json"))
    peak = {}
    for x in csv.DictReader(open(f"{d}/steps.csv")):
        peak[x["rank"]] = max(peak.get(x["rank"], 0), int(x.get("peak_memory_bytes") or 0))
    mem = " / ".join(f"{peak[k] / 2**30:.1f}" for k in sorted(peak, key=int))
    # report.json is proto JSON: 64-bit integers come as strings.
    what = f"{float(r.get('parameters') or 0) / 1e9:.2f}B parameters, {float(r.get('tokens_per_second') or 0):.0f} tokens/s, peak GiB per GPU {mem}, last loss {r.get('last_loss')}"
except Exception:
    what = line
print(f"| big {name} | exit {rc} in {secs} s | workers spawned: {spawned} | {what} |")
PY
  cp "$work/$name"/rank*.log "$logs/" 2>/dev/null
  rm -rf "$work/$name"
  return $rc
}
big 13b_1gpu 1 "${l13[@]}"
big 10b_1gpu 1 "${l10[@]}"
if [ "$gpus" -ge 2 ]; then
  big "13b_${gpus}gpu" "$gpus" "${l13[@]}" || { [ $? = 2 ] && big "10b_${gpus}gpu" "$gpus" "${l10[@]}"; }
fi

# 2. Restart after kill -9 of the last rank.
python3 -c "
import array, random
r = random.Random(0)
array.array('H', (r.randrange(32768) for _ in range(2 * 1024 * 1024))).tofile(open('$work/tokens.bin', 'wb'))"
steps=50
small=(--gpus="$gpus" --model=gpt-1.3b --hidden=1024 --heads=16 --layers=8 --pipeline_stages="$gpus" --schedule=1f1b
       --micro_batches=8 --global_batch=32 --seed=1 --steps=$steps --lr=3e-4 --warmup_steps=4 --min_lr=3e-5
       --data=$work/tokens.bin --overwrite)
t0=$(t)
timeout 300 $run launcher "${small[@]}" --run_dir="$work/U" >"$logs/U.log" 2>&1
u_rc=$? u_secs=$(since "$t0")
t0=$(t)
timeout 400 $run launcher "${small[@]}" --checkpoint_every=20 --max_restarts=1 --run_dir="$work/K" >"$logs/K.log" 2>&1 &
k_pid=$!
for _ in $(seq 2400); do grep -q "step 30/$steps" "$logs/K.log" && break; sleep 0.05; done
job=$(grep -o "job [0-9a-f]*" "$logs/K.log" | head -n 1 | cut -d' ' -f2)
victim=$(pgrep -f -- "--job_id=$job --worker_index=$((gpus - 1)) " | head -n 1)
tk=$(t)
if [ -n "$victim" ]; then kill -9 "$victim"; else echo "no victim found for job '$job'"; fi
wait "$k_pid"
k_rc=$? k_secs=$(since "$tk")
for r in U K; do cp "$work/$r/steps.csv" "$logs/$r.steps.csv" 2>/dev/null; cp "$work/$r/report.json" "$logs/$r.report.json" 2>/dev/null; done
ls -la "$work"/K/checkpoints >"$logs/K_checkpoints.txt" 2>&1
grep -h "restart\|FAILED\|resuming\|checkpoint" "$logs/K.log" | grep -v '^\[rank' | head -8 | tee "$logs/K_lines.txt"
python3 - "$logs" "$u_rc" "$u_secs" "$k_rc" "$k_secs" "${victim:-none}" >>"$rows" <<'PY'
import csv, sys
logs, u_rc, u_secs, k_rc, k_secs, victim = sys.argv[1:]
def losses(run):
    out = {}
    try:
        for r in csv.DictReader(open(f"{logs}/{run}.steps.csv")):
            if r.get("loss"):
                inc = int(r.get("incarnation") or 0)
                s = int(r["step"])
                if s not in out or inc >= out[s][0]:
                    out[s] = (inc, float(r["loss"]))
    except OSError:
        pass
    return {s: v for s, (_, v) in out.items()}
u, k = losses("U"), losses("K")
incs = set()
try:
    incs = {r.get("incarnation") for r in csv.DictReader(open(f"{logs}/K.steps.csv"))}
except OSError:
    pass
common = sorted(set(u) & set(k))
worst = max((abs(k[s] - u[s]) / abs(u[s]) for s in common), default=float("nan"))
ok = u_rc == "0" and k_rc == "0" and len(common) == len(u) == 50 and worst < 2e-2
print(f"| restart | U exit {u_rc} ({u_secs} s); K exit {k_rc}, {k_secs} s after kill -9 of pid {victim} | incarnations {sorted(i for i in incs if i)} | "
      f"{len(common)} steps in both, worst relative loss difference {worst:.2e}: {'PASS' if ok else 'FAIL'} |")
PY
echo
echo "multi_gpu_faults.sh on $gpus of $have GPUs ($(head -n 1 "$logs/gpus.txt")), $(date -u +%FT%TZ)"
echo "| check | outcome | | |"; echo "| --- | --- | --- | --- |"
cat "$rows"
