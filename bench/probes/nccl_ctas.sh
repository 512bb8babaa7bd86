#!/usr/bin/env bash
# Probe: does the number of thread blocks NCCL's point-to-point kernels hold (NCCL_MAX_CTAS) slow the
# compute they overlap? Runs bench_pipeline rows under several NCCL_MAX_CTAS values while nvidia-smi
# logs SM clock and power, then prints step time and per-rank forward/backward/wait from report.json.
# Usage on the 2-GPU host, from the repository root, with the bundle: bench/probes/nccl_ctas.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/probe_ctas}
mkdir -p "$out"
nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 >"$out/smi.csv" 2>&1 &
smi=$!
summary="$out/summary.txt"
: >"$summary"
probe() {  # probe ROW CTAS (CTAS "-" leaves NCCL_MAX_CTAS unset)
  local row=$1 c=$2 dir="$out/$1.ctas$2"
  if [ "$c" = "-" ]; then (unset NCCL_MAX_CTAS; OUT=$dir tools/bench_pipeline "$row" >/dev/null 2>&1)
  else NCCL_MAX_CTAS=$c OUT=$dir tools/bench_pipeline "$row" >/dev/null 2>&1; fi
  python3 - "$row" "$c" "$dir" >>"$summary" <<'PY'
import json, sys
row, c, d = sys.argv[1:4]
try:
    r = json.load(open(f"{d}/{row}/report.json"))
except Exception as e:
    print(f"{row} ctas={c}: no report ({e})"); sys.exit()
ranks = " | ".join(f"r{x.get('rank', 0)} F {x['forward_ms']:.1f} B {x['backward_ms']:.1f} wait {x['wait_ms']:.1f}" for x in r["ranks"])
print(f"{row} ctas={c}: step {r['step_seconds']:.4f} s  {ranks}")
PY
  tail -n 1 "$summary"
}
for c in 8 1 2 4 8; do probe infer_2gpu_m16 "$c"; done
probe infer_1gpu -
for c in - 2; do probe train_2gpu_1f1b_m32 "$c"; done
kill $smi 2>/dev/null
python3 - "$out/smi.csv" <<'PY' | tee -a "$summary"
import sys, collections
clk = collections.defaultdict(list); pw = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = [x.strip() for x in line.split(",")]
    if len(p) < 5 or not p[2].endswith("MHz"): continue
    mhz, w = float(p[2].split()[0]), float(p[3].split()[0])
    if w > 300:  # busy samples
        clk[p[1]].append(mhz); pw[p[1]].append(w)
for g in sorted(clk):
    c = sorted(clk[g])
    print(f"gpu {g} busy samples {len(c)}: SM MHz min {c[0]:.0f} median {c[len(c)//2]:.0f} max {c[-1]:.0f}; power median {sorted(pw[g])[len(c)//2]:.0f} W")
PY
echo "== summary"; cat "$summary"
