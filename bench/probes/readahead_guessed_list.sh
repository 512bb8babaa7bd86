#!/usr/bin/env bash
# A readahead list guessed from the libraries' ELF sections, for the launch that
# has no recorded list (a fresh machine, a rebuilt worker). First the machine's first launch (records
# the list); then which sections its pages lie in (readahead_guessed_list.py analyse); then, on a dropped page cache
# each, gpt-1.3b training with: no list, the recorded list, and lists guessed by each heuristic (same
# files, ranges from the sections). The JIT cache stays warm after the first launch. One tarball; the
# table last. From the repository root with dist/bundle (root: it drops the page cache):
#   OUT=DIR bash bench/probes/readahead_guessed_list.sh
#   OUT=DIR VARIANTS='none recorded dyn' ROUNDS=3 bash bench/probes/readahead_guessed_list.sh
set -uo pipefail
tmp=$(mktemp -d)
out=${OUT:?set OUT to the directory for the results}; mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export XDG_CACHE_HOME="$tmp/cache"
logs="$tmp/logs" work="$tmp/runs"
rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; mkdir -p "$logs" "$work"
trap 'tar -C "$logs" -czf "$out/readahead_guessed_list.tgz" . 2>/dev/null; rm -rf "$logs" "$work" "$XDG_CACHE_HOME"; rm -rf "$tmp"' EXIT
run=dist/bundle/run
args=(--gpus=1 --model=gpt-1.3b --steps=3 --pipeline_stages=1 --schedule=1f1b --micro_batches=4 --global_batch=32 --overwrite)
drop() { sync; echo 3 >/proc/sys/vm/drop_caches; }
one() {  # NAME
  local name=$1
  timeout 150 $run launcher "${args[@]}" --run_dir="$work/$name" >"$logs/$name.log" 2>&1 || echo "$name FAILED: $(tail -n 2 "$logs/$name.log")"
  cp "$work/$name/startup_ledger.tsv" "$logs/$name.ledger.tsv" 2>/dev/null
  cp "$work/$name/rank0.log" "$logs/$name.rank0.log" 2>/dev/null
  local ra=$(grep -ho "library readahead: [^;]*" "$logs/$name.log" | head -1)
  local pb=$(grep -ho "the start waited [0-9]* ms" "$work/$name/rank0.log" 2>/dev/null | head -1)
  python3 - "$work/$name" "$name" "$ra" "$pb" >>"$logs/rows.md" <<'PY'
import csv, json, sys
d, name, ra, pb = sys.argv[1:]
try:
    r = json.load(open(f"{d}/report.json"))
    lines = [l for l in open(f"{d}/startup_ledger.tsv").read().split("\n") if l and not l.startswith("#")]
    led = dict(zip(lines[0].split("\t"), lines[1].split("\t")))
    steps = [float(x["seconds"]) for x in csv.DictReader(open(f"{d}/steps.csv"))]
    print(f"| {name} | {led.get('spawned')} | {led.get('cuda_ready')} | {steps[0]:.2f} | {float(r['launch_to_first_step_seconds']):.2f} | {ra} | {pb} |")
except Exception as e:
    print(f"| {name} | failed: {e} | | | | | |")
PY
  rm -rf "$work/$name"
}
echo "== facts"; uname -r; lsblk -o NAME,SIZE,ROTA,SCHED 2>/dev/null | head -5; cat /sys/block/*/queue/read_ahead_kb 2>/dev/null | head -3
ls ~/.nv/ComputeCache 2>/dev/null | head -2 | sed 's/^/JIT cache has: /'
one first0
list=$(ls "$XDG_CACHE_HOME"/stagehand/readahead/*.list 2>/dev/null | head -1)
[ -n "$list" ] || { echo "no list written"; cat "$logs/rows.md"; exit 1; }
cp "$list" "$logs/recorded.list"
python3 bench/probes/readahead_guessed_list.py analyse "$logs/recorded.list" | tee "$logs/analysis.md"
LD_LIBRARY_PATH="$PWD/dist/bundle/lib:/opt/torch/.venv/lib/python3.12/site-packages/torch/lib" ldd dist/bundle/bin/worker \
  | awk '$3 ~ /^\// {print $3}' | xargs -r readlink -f | sort -u >"$logs/ldd.txt"
awk '$1=="file"{print $4}' "$logs/recorded.list" | xargs -r readlink -f | sort -u >"$logs/listed.txt"
echo "listed files not in the worker's DT_NEEDED closure:"; comm -23 "$logs/listed.txt" "$logs/ldd.txt" | tee "$logs/dlopened.txt"
variants=${VARIANTS:-none recorded data nofat}
for h in $variants; do [ "$h" = none ] || [ "$h" = recorded ] || python3 bench/probes/readahead_guessed_list.py write "$logs/recorded.list" $h "$logs/$h.list"; done
for r in $(seq "${ROUNDS:-2}"); do
  for v in $variants; do
    rm -f "$list"; [ "$v" = none ] || cp "$logs/$v.list" "$list"
    drop; one "${v}$r"
  done
done
echo; echo "| run | spawned | cuda_ready | step 0 s | launch to first step s | readahead | prebuild |"; echo "| --- | --- | --- | --- | --- | --- | --- |"
cat "$logs/rows.md"
