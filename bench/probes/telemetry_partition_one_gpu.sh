#!/usr/bin/env bash
# The clock-aware partition's clocks on one GPU, through the bundle (tools/bundle //launcher:launcher //worker:worker; carry
# dist/): gpt-1.3b, one stage, profiled (--profile_single_stage=true) so that the plan has a prediction.
# Run "fresh" measures the profile with the GPU sampled meanwhile (its SM clock goes with the costs);
# run "cached" reads that profile from the cache and this GPU's clock under load from run "fresh"
# (kept beside the cache at the end of each run).
# Prints the plan line, the end-of-run GPU lines (predicted against measured per rank) and
# report.json's per-rank figures, then a short table. One GPU cannot show a clock-aware re-partition:
# there is one rank, whose speed is the reference (1.0). About 30 s on one H200.
set -uo pipefail
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
export XDG_CACHE_HOME=$(mktemp -d)   # an empty profile cache: run "fresh" measures, run "cached" reads
runs=$(mktemp -d)                     # the run directories (only logs and report.json go to $out)
trap 'rm -rf "$XDG_CACHE_HOME" "$runs"' EXIT
run=dist/bundle/run
args=(--model=gpt-1.3b --gpus=1 --pipeline_stages=1 --steps=8 --schedule=1f1b --micro_batches=4 --global_batch=32
      --profile_single_stage=true --overwrite)
fail=0
for name in fresh cached; do
  $run launcher "${args[@]}" --run_dir="$runs/$name" >"$out/$name.log" 2>&1 ||
    { echo "FAIL  $name exited non-zero:"; tail -n 5 "$out/$name.log"; fail=1; }
  cp "$runs/$name/report.json" "$out/$name.report.json" 2>/dev/null || true
  cat "$runs/$name/rank0.log" >>"$out/$name.log" 2>/dev/null || true
done
{ ls -la "$XDG_CACHE_HOME/stagehand/profiles"
  for f in "$XDG_CACHE_HOME"/stagehand/profiles/*.textproto; do  # the clocks, and each profile's head
    echo "== $f"; grep -E '^#|sm_mhz|samples|source|power_capped' "$f" | cut -c1-200
  done; } >"$out/cache_listing.txt" 2>&1 || true
python3 - "$out" "$fail" <<'PY'
import json, os, sys
out, fail = sys.argv[1], int(sys.argv[2])
rows = []
for name in ("fresh", "cached"):
    log = os.path.join(out, name + ".log")
    if not os.path.exists(log): continue
    text = open(log).read()
    print(f"--- {name}")
    for line in text.splitlines():
        if ("SM clocks (" in line or "clock-blind" in line or "profile:" in line or "GPU clock under load" in line
                or line.startswith(("stagehand: GPU:", "stagehand: predicted"))):
            print(line[:400])
    ok_line = "stagehand: GPU: rank 0: predicted" in text
    print(("PASS  " if ok_line else "FAIL  ") + f"{name}: the predicted-against-measured line")
    fail |= not ok_line
    rep = os.path.join(out, name + ".report.json")
    if os.path.exists(rep):
        r = json.load(open(rep))["ranks"][0]
        t = r.get("telemetry", {})
        rows.append((name, r.get("predicted_compute_ms", 0), r.get("forward_ms", 0) + r.get("backward_ms", 0),
                     r.get("planned_sm_mhz", 0), t.get("sm_mhz_mean", 0), t.get("power_capped_fraction", 0),
                     json.load(open(rep)).get("step_seconds", 0)))
print("\n| run | predicted compute ms | measured fwd+bwd ms | diff | planned SM MHz | measured SM MHz mean | power-capped | s/step |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for n, p, m, pl, sm, cap, s in rows:
    d = f"{100 * (m / p - 1):+.1f}%" if p > 0 else "n/a"
    print(f"| {n} | {p:.1f} | {m:.1f} | {d} | {pl:.0f} | {sm:.0f} | {100 * cap:.0f}% | {s:.4f} |")
print(open(os.path.join(out, "cache_listing.txt")).read())
sys.exit(fail)
PY
