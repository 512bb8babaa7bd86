#!/usr/bin/env bash
# GPU telemetry on one GPU, through the bundle (tools/bundle; carry dist/): gpt-1.3b training with
# --telemetry=true and =false alternated (on off on off on off, so drift cancels), each the mean of
# steps 3..12. Checks that the telemetry runs carry the GPU columns per step in steps.csv, the
# counters in trace.json and the end-of-run GPU line, that the off runs carry none, and that the
# health gate ran; prints a short table last. With 2 GPUs visible, one 2-stage run shows the gate's
# neighbour link and the slowest-rank line too. About 3 minutes on one H200.
# Usage, from the repository root: OUT=DIR bash bench/probes/telemetry_cost_one_gpu.sh; logs and run dirs
# go to $OUT.
set -uo pipefail
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out"
run=dist/bundle/run
train=(--model=gpt-1.3b --gpus=1 --pipeline_stages=1 --steps=13 --schedule=1f1b --micro_batches=4 --global_batch=32)
fail=0
for round in 1 2 3; do
  for t in true false; do
    name=train.$t.$round
    $run launcher "${train[@]}" --telemetry=$t --overwrite --run_dir="$out/$name" >"$out/$name.log" 2>&1 ||
      { echo "FAIL  $name exited non-zero:"; tail -n 5 "$out/$name.log"; fail=1; }
  done
done
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -ge 2 ]; then
  $run launcher --model=gpt-1.3b --gpus=2 --steps=13 --schedule=1f1b --micro_batches=8 --overwrite \
    --run_dir="$out/pipe2" >"$out/pipe2.log" 2>&1 || { echo "FAIL  pipe2 exited non-zero"; fail=1; }
fi
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,clocks_event_reasons.active \
  --format=csv >"$out/nvidia-smi.csv" 2>&1 || true
python3 - "$out" "$fail" <<'PY'
import csv, glob, json, os, statistics, sys
out, fail = sys.argv[1], int(sys.argv[2])
gpu_cols = ["sm_mhz_mean", "sm_mhz_min", "mem_mhz_mean", "power_w_mean", "power_w_max", "power_limit_w",
            "temperature_c_max", "fan_percent_max", "utilization_percent_mean", "power_capped_fraction",
            "thermal_fraction", "throttled_fraction", "throttle_reasons"]
def check(ok, what):
    global fail
    print(("PASS  " if ok else "FAIL  ") + what)
    fail |= not ok
times, last_on = {"true": [], "false": []}, None
for d in sorted(glob.glob(out + "/train.*.*")):
    if not os.path.isdir(d): continue
    _, t, rnd = os.path.basename(d).split(".")
    rows = list(csv.DictReader(open(d + "/steps.csv")))
    secs = [float(r["seconds"]) for r in rows if 3 <= int(r["step"]) < 13]
    if secs: times[t].append(statistics.mean(secs))
    header = list(rows[0].keys()) if rows else []
    if t == "true":
        check(all(c in header for c in gpu_cols) and all(r["sm_mhz_mean"] for r in rows), f"{d}: GPU columns on every step")
        last_on = d
    else:
        check(not any(c in header for c in gpu_cols), f"{d}: --telemetry=false, no GPU columns")
    log = open(d + ".log").read()
    check("stagehand: health:" in log, f"{d}: the health gate ran")
    if t == "true": check("stagehand: GPU: rank 0" in log, f"{d}: the end-of-run GPU line")
if last_on:
    trace = json.load(open(last_on + "/trace.json"))
    names = sorted({e["name"] for e in trace["traceEvents"] if e.get("ph") == "C"})
    open(out + "/counter_names.txt", "w").write("\n".join(names) + "\n")
    check("GPU SM clock" in names and "GPU power" in names and "GPU throttle" in names,
          f"trace.json counters: {', '.join(names)}")
    rank = json.load(open(last_on + "/report.json"))["ranks"][0]
    print("report.json rank 0 telemetry:", json.dumps(rank.get("telemetry", {}), sort_keys=True))
    print("report.json rank 0 health:", json.dumps(rank.get("health", {}), sort_keys=True))
    for line in open(last_on + ".log"):
        if line.startswith(("stagehand: health:", "stagehand: GPU:")): print(line.rstrip())
    print("\nsteps.csv of", last_on, "(GPU columns, steps 0-5):")
    rows = list(csv.DictReader(open(last_on + "/steps.csv")))
    print("step " + " ".join(gpu_cols))
    for r in rows[:6]: print(r["step"], " ".join(r[c] or "-" for c in gpu_cols))
if os.path.isdir(out + "/pipe2"):
    for line in open(out + "/pipe2.log"):
        if line.startswith(("stagehand: health:", "stagehand: GPU:")): print("2 GPUs:", line.rstrip())
on, off = times["true"], times["false"]
print("\n| run | telemetry on, s/step | off, s/step | on / off |")
print("| --- | --- | --- | --- |")
if on and off:
    ratio = statistics.mean(on) / statistics.mean(off)
    print(f"| gpt-1.3b, 1 GPU, steps 3-12 | {' '.join(f'{x:.4f}' for x in on)} | {' '.join(f'{x:.4f}' for x in off)} | {ratio:.4f} |")
    check(ratio <= 1.005, f"sampling costs at most 0.5% of step time (on / off = {ratio:.4f})")
sys.exit(fail)
PY
