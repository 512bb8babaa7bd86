#!/usr/bin/env bash
# Launch to the first step on a dropped page cache, with the library readahead and without, and in
# which order to read: BUNDLE/bin/launcher reads the CUDA driver and NVML first (the launcher's own
# device query needs them before it spawns); BUNDLE/bin/launcher_a, where present (a launcher built to
# read in the loader's order), is `on_a`; off is --prefetch_libraries=false. gpt-1.3b, one stage,
# --steps=3, one GPU; caches dropped before each cold run (root), three rounds of on / on_a / off; also
# the launcher's own cold start (--version). From the repository root:
#   OUT=DIR BUNDLE=dist/bundle bash bench/probes/readahead_cold_start.sh
# One tarball; the table last.
set -uo pipefail
tmp=$(mktemp -d)
bundle=${BUNDLE:-dist/bundle}
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
logs="$tmp/logs" work="$tmp/runs"
export XDG_CACHE_HOME="$tmp/cache"
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/readahead_cold_start.tgz" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; rm -rf "$tmp"' EXIT
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
run="$bundle/run"
args=(--gpus=1 --model=gpt-1.3b --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite)
sp=/opt/torch/.venv/lib/python3.12/site-packages
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
resident() {  # MiB of the libraries resident now
  { find "$sp/torch/lib" "$sp/nvidia" "$bundle" -name '*.so*' -type f; echo "$bundle/bin/worker"; } | tr '\n' '\0' \
    | xargs -0 fincore --bytes --noheadings -o RES,SIZE,FILE 2>"$logs/fincore.err" | sort -n -r >"$logs/resident-$1.txt"
  awk -v t="$1" '{r+=$1; s+=$2} END {printf "%s: %.0f MiB of %.0f MiB of the libraries resident\n", t, r/2^20, s/2^20}' "$logs/resident-$1.txt"
}
one() {  # NAME [FLAGS...]: a launch; its ledger and lines
  local name=$1; shift
  local t0=$(date +%s.%N)
  local bin=launcher; [ "${1:-}" = "--a" ] && { bin=launcher_a; shift; }
  timeout 150 "$run" "$bin" "${args[@]}" --run_dir="$work/$name" "$@" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 3 "$logs/$name.log")"
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
echo "== facts"; uname -r; command -v fincore || echo "no fincore"
one warm0
list=$(ls "$XDG_CACHE_HOME"/stagehand/readahead/*.list 2>/dev/null | head -1)
[ -n "$list" ] || { echo "no list written"; exit 1; }
cp "$list" "$logs/readahead.list"
awk '$1=="file"{f++} $1=="range"{b+=$3; n++} END {printf "list: %d files, %d ranges, %.1f MiB\n", f, n, b/2^20}' "$list"
for i in 1 2; do
  drop; /usr/bin/time -f "launcher --version, cold: %e s" "$run" launcher --version >/dev/null
done
/usr/bin/time -f "launcher --version, warm: %e s" "$run" launcher --version >/dev/null
for i in 1 2 3; do
  drop; one cold_on$i
  [ "$i" = 1 ] && resident after-cold_on1
  drop; one cold_on_a$i --a
  drop; one cold_off$i --prefetch_libraries=false
done
head -12 "$logs/resident-after-cold_on1.txt" 2>/dev/null | awk '{printf "%8.1f MiB of %8.1f  %s\n", $1/2^20, $2/2^20, $3}'
head -3 "$logs/fincore.err" 2>/dev/null
for f in "$logs"/warm0.log "$logs"/cold_*.log; do [[ "$f" == *.rank0.log ]] && continue; printf "%s %s; " "$(basename "$f" .log)" "$(grep -h "step 2/3" "$f" | awk '{print $6}')"; done; echo "(step 1 s)"
echo
echo "| run | spawned | cuda_ready | registered | first_step | launch_to_first_step s |"
echo "| --- | --- | --- | --- | --- | --- |"
cat "$logs/rows.txt"
