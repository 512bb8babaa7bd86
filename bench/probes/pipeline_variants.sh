#!/usr/bin/env bash
# Probe: gpt-1.3b runs of the launcher under variants (flags and environment), each with the SM clock
# and power of the GPUs over its own run, summarised from report.json: step time and each rank's
# layers, forward, backward and wait.
# Usage on a GPU host, from the repository root, with the bundle: bench/probes/variants.sh LIST
# where each line of LIST is: NAME GPUS ENV LAUNCHER-FLAGS... (# starts a comment); ENV is -- for none,
# or VAR=VALUE assignments joined by commas.
set -uo pipefail
cd "$(dirname "$0")/../.."
list=$1
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
summary="$out/summary.txt"
: >"$summary"
while read -r name gpus envs flags; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  if [ "$envs" = "--" ]; then envs=; else envs=${envs//,/ }; fi
  nvidia-smi --query-gpu=index,clocks.sm,power.draw --format=csv,noheader,nounits -lms 250 >"$out/$name.smi" 2>&1 &
  smi=$!
  # shellcheck disable=SC2086
  env $envs dist/bundle/run launcher --gpus="$gpus" --model=gpt-1.3b --steps=11 --run_dir="$out/$name" $flags \
    >"$out/$name.log" 2>&1 </dev/null
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  rm -f "$out/$name/trace.json"
  python3 - "$name" "$out" "$envs $flags" >>"$summary" <<'PY'
import json, sys, collections
name, out, what = sys.argv[1:4]
try:
    r = json.load(open(f"{out}/{name}/report.json"))
except Exception as e:
    print(f"{name}: no report ({e})"); sys.exit()
ranks = " | ".join(f"r{x.get('rank', 0)} L{x.get('first_layer', 0)}-{x.get('last_layer', 0)} F {x['forward_ms']:.1f} B {x['backward_ms']:.1f} wait {x['wait_ms']:.1f} {int(x['peak_memory_bytes']) / 2**30:.1f}GiB" for x in r["ranks"])
clk = collections.defaultdict(list)
for line in open(f"{out}/{name}.smi"):
    p = [x.strip() for x in line.split(",")]
    try:
        if float(p[2]) > 300: clk[p[0]].append((float(p[1]), float(p[2])))
    except (IndexError, ValueError):
        pass
gpus = " ".join(f"gpu{g} {sorted(c for c, _ in v)[len(v)//2]:.0f}MHz {sorted(w for _, w in v)[len(v)//2]:.0f}W" for g, v in sorted(clk.items()))
print(f"{name:22s} step {r['step_seconds']:.4f} s loss {r.get('last_loss', 0):.4f}  {ranks}  [{gpus}]  ({what.strip()})")
PY
  tail -n 1 "$summary"
done <"$list"
echo "== summary"; cat "$summary"
