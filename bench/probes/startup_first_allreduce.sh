#!/usr/bin/env bash
# Where launch to the first all-reduce goes on one GPU: our launcher's variants alternating with
# torchrun, each of our runs' startup ledger and (with a bundle built with startup_trace.patch) the
# timestamps of every step of the launcher's and the worker's start-up, as seconds since launch.
#   OUT=DIR BUNDLE=dist-trace/bundle ROUNDS=4 bash bench/probes/startup_first_allreduce.sh
# Variants (names in VARIANTS, default all but gpt_old):
#   ar          --model=allreduce --steps=1 --tensor_elements=1048576 (bench/bench_startup's job now)
#   ar_nopf     the same with --prefetch_libraries=false
#   ar_nonvml   the same with --health=off --telemetry=false (no NVML in the worker)
#   gpt         --steps=1 with no --model: the job bench/bench_startup ran before it passed
#               --model=allreduce (the launcher ignored --tensor_elements then; it refuses it now)
#   torchrun    tools/peer/torch_first_allreduce.py under torchrun --standalone
# Run from the repository root on the GPU host. Logs and the tables go to $OUT.
set -uo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$(dirname "$0")/../.."
bundle=${BUNDLE:-dist/bundle}
rounds=${ROUNDS:-4}
variants=${VARIANTS:-"ar gpt ar_nopf ar_nonvml torchrun"}
out=${OUT:?set OUT to the directory for the results}
mkdir -p "$out/runs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XDG_CACHE_HOME="$tmp/sfa_cache"
now() { date +%s.%N; }

flags_of() {
  case $1 in
    ar) echo "--model=allreduce --steps=1 --tensor_elements=1048576" ;;
    ar_nopf) echo "--model=allreduce --steps=1 --tensor_elements=1048576 --prefetch_libraries=false" ;;
    ar_nonvml) echo "--model=allreduce --steps=1 --tensor_elements=1048576 --health=off --telemetry=false" ;;
    gpt) echo "--steps=1" ;;
  esac
}

one() {  # variant name; prints one result line into $out/samples.txt
  local v=$1 tag=$2 t0 dir log
  dir="$out/runs/${v}_$tag"
  log="$out/runs/${v}_$tag.log"
  t0=$(now)
  if [ "$v" = torchrun ]; then
    BENCH_T0=$t0 torchrun --standalone --nproc_per_node=1 tools/peer/torch_first_allreduce.py >"$log" 2>&1
    local s
    s=$(grep -o "first_allreduce_s [0-9.]*" "$log" | awk '{print $2}')
    echo "$v $tag t0=$t0 total=$s" >>"$out/samples.txt"
    return
  fi
  # shellcheck disable=SC2046
  "$bundle/run" launcher --gpus=1 $(flags_of "$v") --overwrite --run_dir="$dir" >"$log" 2>&1
  echo "$v $tag t0=$t0 rc=$? dir=$dir log=$log" >>"$out/samples.txt"
}

{
  echo "== $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  nvidia-smi --query-gpu=name,driver_version,persistence_mode,clocks.sm,power.draw --format=csv 2>&1
  nproc; uname -r
} | tee "$out/machine.txt"

: >"$out/samples.txt"
for v in $variants; do one "$v" warm; done  # page cache, JIT cache, the gpt run's readahead list
for r in $(seq 1 "$rounds"); do
  for v in $variants; do one "$v" "$r"; done
done

python3 - "$out" <<'PY' | tee "$out/tables.txt"
import collections, re, statistics, sys
out = sys.argv[1]
rows = []
for line in open(f"{out}/samples.txt"):
    f = line.split()
    d = dict(x.split("=", 1) for x in f[2:])
    rows.append((f[0], f[1], d))
cols = ["spawned", "cuda_ready", "registered", "nccl_ready", "first_step"]
per = collections.defaultdict(list)
trace = collections.defaultdict(lambda: collections.defaultdict(list))
print("run                 total  " + " ".join(f"{c:>10}" for c in cols) + "  note")
for v, tag, d in rows:
    if v == "torchrun":
        total = float(d["total"]) if d.get("total") else float("nan")
        print(f"{v + '_' + tag:<18} {total:6.3f}")
        if tag != "warm": per[v].append([total] + [float("nan")] * 5)
        continue
    try:
        lines = open(d["dir"] + "/startup_ledger.tsv").read().split("\n")
    except OSError:
        print(f"{v + '_' + tag:<18} failed rc={d['rc']}")
        continue
    launch = int(lines[0].split("=")[1])
    led = [float("nan") if x == "n/a" else float(x) for x in lines[2].split("\t")[1:6]]
    total = launch / 1e6 + led[4] - float(d["t0"])
    text = open(d["log"]).read()
    job = re.search(r"steps of (\S+);", text)
    ra = re.search(r"library readahead: (.*)", text)
    note = (job.group(1) if job else "?") + ("; readahead " + ra.group(1) if ra else "")
    print(f"{v + '_' + tag:<18} {total:6.3f}  " + " ".join(f"{x:10.3f}" for x in led) + "  " + note)
    ev = {}
    for m in re.finditer(r"stagehand-trace (\S+) (\d+)", text):
        ev.setdefault(m.group(1), (int(m.group(2)) - launch) / 1e6)
    ev["launcher_exec"] = -(launch / 1e6 - float(d["t0"]))  # the bundle's run script and exec, before main
    if tag != "warm":
        per[v].append([total] + led)
        for k, t in ev.items(): trace[v][k].append(t)
print()
print("trace (mean seconds since launch, rounds only)")
order = ("launcher_exec l_main l_flags_done l_prefetch_started l_query_start l_libcuda_loaded l_cuinit_done "
         "l_query_done l_checked l_readahead_start l_readahead_done l_server_started l_spawning l_spawned "
         "l_jobrun_started w_loaded w_main w_connected w_got_job w_cuda_ready w_health_read w_registering "
         "w_registered w_nccl_start w_nccl_done w_telemetry_start w_telemetry_done w_steps_start w_tensors_ready "
         "w_filled w_allreduce_enqueued w_allreduce_done w_first_step").split()
names = sorted({k for v in trace for k in trace[v]}, key=lambda k: (order.index(k) if k in order else len(order), k))
vs = [v for v in trace]
print(f"{'event':<22}" + "".join(f"{v:>11}" for v in vs))
for k in names:
    print(f"{k:<22}" + "".join(f"{statistics.mean(trace[v][k]):11.3f}" if k in trace[v] else f"{'':>11}" for v in vs))
print()
print(f"{'variant':<11} {'n':>2} {'total mean':>10} {'min':>6} {'max':>6}  " + " ".join(f"{c:>10}" for c in cols))
for v, xs in per.items():
    t = [x[0] for x in xs]
    means = [statistics.mean(x[i] for x in xs) for i in range(1, 6)]
    print(f"{v:<11} {len(xs):>2} {statistics.mean(t):10.3f} {min(t):6.3f} {max(t):6.3f}  " +
          " ".join(f"{m:10.3f}" for m in means))
PY
tar -czf "$out/runs.tgz" -C "$out" runs samples.txt && rm -rf "$out/runs"
