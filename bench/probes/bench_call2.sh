#!/usr/bin/env bash
# Both families, ours beside eager and torch.compile, one call; logs tarred under $OUT.
set -uo pipefail
o=/tmp/call2; rm -rf $o; mkdir -p $o
OUT=$o bench/bench_one_gpu gpt >$o/gpt.txt 2>&1
OUT=$o bench/bench_one_gpu llama >$o/llama.txt 2>&1
tar -czf "$OUT/call2.tgz" -C /tmp call2
cat $o/gpt/table.md $o/llama/table.md
