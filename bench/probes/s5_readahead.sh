#!/usr/bin/env bash
# Issue 16: launch to the first training step on a cold page cache, with and without the library
# readahead (--prefetch_libraries), gpt-1.3b, one stage, --steps=3, one H200. A warm run writes the
# list (its size is printed), then caches are dropped before each of cold_on, cold_off, cold_on,
# cold_off; the ledger of each, the worker's startup line, how long reading the list's ranges alone
# takes from a cold cache, and what is resident after a cold run. Run from the checkout:
# `bash dist-s5-ra/s5_readahead.sh` (the bundle in dist-s5-ra/bundle). One tarball; the table last.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-/tmp/s5ra}; mkdir -p "$out"
logs=/tmp/s5ra_logs work=/tmp/s5ra_runs
export XDG_CACHE_HOME=/tmp/s5ra_cache
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/s5ra.tgz" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run="$here/bundle/run"
args=(--gpus=1 --model=gpt-1.3b --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite)
sp=/opt/torch/.venv/lib/python3.12/site-packages
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
resident() {  # MiB of the libraries resident now
  { find "$sp/torch/lib" "$sp/nvidia" "$here/bundle" -name '*.so*' -type f; echo "$here/bundle/bin/worker"; } | tr '\n' '\0' \
    | xargs -0 fincore --bytes --noheadings -o RES,SIZE,FILE 2>/dev/null | sort -n -r >"$logs/resident-$1.txt"
  awk -v t="$1" '{r+=$1; s+=$2} END {printf "%s: %.0f MiB of %.0f MiB of the libraries resident\n", t, r/2^20, s/2^20}' "$logs/resident-$1.txt"
}
one() {  # NAME [FLAGS...]: a launch; its ledger and lines
  local name=$1; shift
  local t0=$(date +%s.%N)
  timeout 150 "$run" launcher "${args[@]}" --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 3 "$logs/$name.log")"
  local t1=$(date +%s.%N)
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null
  cp "$work/$name/rank0.log" "$logs/$name.rank0.log" 2>/dev/null
  echo "== $name (wall $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.2f", b-a}') s)"
  cat "$work/$name/startup_ledger.tsv" 2>/dev/null
  grep -h "library readahead" "$logs/$name.log" "$work/$name/rank0.log" 2>/dev/null
  grep -ho "startup: .*" "$work/$name/rank0.log" 2>/dev/null
  python3 - "$work/$name" "$name" >>"$logs/rows.txt" <<'PY'
import json, sys
d, name = sys.argv[1:]
try:
    r = json.load(open(f"{d}/report.json"))
    lines = [l for l in open(f"{d}/startup_ledger.tsv").read().split("\n") if l and not l.startswith("#")]
    led = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
except Exception as e:
    print(f"| {name} | failed: {e} | | | | |"); sys.exit(0)
print(f"| {name} | {led.get('spawned')} | {led.get('cuda_ready')} | {led.get('registered')} | {led.get('first_step')} | {r.get('launch_to_first_step_seconds')} |")
PY
  rm -rf "$work/$name"
}
echo "== facts"; nvidia-smi --query-gpu=name --format=csv,noheader; uname -r; cat /sys/block/vda/queue/scheduler /sys/block/vda/queue/read_ahead_kb 2>/dev/null
resident fresh
one warm0
one warm1
list=$(ls "$XDG_CACHE_HOME"/stagehand/readahead/*.list 2>/dev/null | head -1)
if [ -z "$list" ]; then echo "no list written"; exit 1; fi
cp "$list" "$logs/readahead.list"
awk '$1=="file"{f++} $1=="range"{b+=$3; n++} END {printf "list: %d files, %d ranges, %.1f MiB\n", f, n, b/2^20}' "$list"
awk '$1=="file"{p=$4} $1=="range"{m[p]+=$3} END {for (p in m) printf "%8.1f MiB %s\n", m[p]/2^20, p}' "$list" | sort -rn | head -15
drop; resident dropped
python3 - "$list" <<'PY'
import os, sys, time
t = time.time(); n = 0
for line in open(sys.argv[1]):
    f = line.split(" ", 3)
    if f[0] == "file": fd = os.open(f[3].rstrip("\n"), os.O_RDONLY); path = f[3]
    elif f[0] == "range": n += len(os.pread(fd, int(f[2]), int(f[1])))
print(f"reading the list's ranges in order from a cold cache: {n/2**20:.1f} MiB in {time.time()-t:.2f} s")
PY
for i in 1 2; do
  drop; one cold_on$i
  [ "$i" = 1 ] && resident after-cold_on1
  drop; one cold_off$i --prefetch_libraries=false
  [ "$i" = 1 ] && resident after-cold_off1
done
head -20 "$logs/resident-after-cold_off1.txt" | awk '{printf "%8.1f MiB of %8.1f  %s\n", $1/2^20, $2/2^20, $3}'
echo
echo "| run | spawned | cuda_ready | registered | first_step | launch_to_first_step s |"
echo "| --- | --- | --- | --- | --- | --- |"
cat "$logs/rows.txt"
