#!/usr/bin/env bash
# Rows of bench/bench_pipeline in one run on a GPU host, from the repository root with DIST/ carried
# (DIST/bundle from tools/bundle; dist/bundle is pointed at it):
#   OUT=DIR bash bench/probes/bench_pipeline_rows.sh DIST FAMILY [ROW|PATTERN...]
# e.g. (gpt or llama)  1 GPU:  ... dist-main gpt 'train_1gpu*' 'infer_1gpu*'
#                      2 GPUs: ... dist-main gpt train_1gpu train_1gpu_eager 'train_2gpu_*'
#                      4 GPUs: ... dist-main llama train_1gpu 'train_4gpu_*'
# (a whole family takes more than 10 minutes: each compiled peer compiles for a minute or more).
# Each row is bounded (BENCH_ROW_TIMEOUT, 480 s here), the whole at 560 s. One tarball of the logs,
# rows and tables goes to $OUT (the run directories' steps.csv and report.json, not their traces);
# its temporary directory is removed. The GPUs and the table are printed last.
set -uo pipefail
dist=${1:?usage: bench_pipeline_rows.sh DIST FAMILY [ROW|PATTERN...]}
shift
[ -x "$dist/bundle/run" ] || { echo "bench_pipeline_rows.sh: $dist/bundle/run not found; carry $dist (tools/bundle)"; exit 2; }
rm -rf dist && mkdir -p dist && ln -s "$PWD/$dist/bundle" dist/bundle
o=$(mktemp -d)
nvidia-smi --query-gpu=name,uuid,clocks.sm,power.draw,temperature.gpu --format=csv >"$o/gpu.txt" 2>&1
git log -1 --format='%H %s' >"$o/commit.txt" 2>&1
BENCH_ROW_TIMEOUT=${BENCH_ROW_TIMEOUT:-480} OUT=$o/bench timeout -k 20 560 bench/bench_pipeline "$@" >"$o/bench.txt" 2>&1
rc=$?
echo "bench_pipeline rc $rc" >>"$o/bench.txt"
# Cut short: no table, but the rows that finished.
[ "$rc" = 124 ] && cat "$o"/bench/*/rows.tsv >>"$o/bench.txt" 2>/dev/null
tar -czf "${OUT:?set OUT to the directory for the results}/bench_pipeline_rows.tgz" -C "$o" --exclude='trace*.json' --exclude='*.pt' . 2>/dev/null
cat "$o/gpu.txt" "$o/commit.txt" "$o/bench.txt"
rm -rf "$o"
