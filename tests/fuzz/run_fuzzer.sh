#!/usr/bin/env bash
# Runs a libFuzzer binary on one target for a bounded time:
#   run_fuzzer.sh BINARY TARGET SECONDS [DICT|-] [SEED...]
# A crash, a sanitizer report or a broken invariant fails the test; the crashing input is kept in the
# test's outputs (undeclared outputs) and its bytes are printed as hex.
set -uo pipefail
bin=$1 target=$2 seconds=$3 dict=${4:--}
shift $(( $# < 4 ? $# : 4 ))
out=${TEST_UNDECLARED_OUTPUTS_DIR:-$(mktemp -d)}
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
for seed in "$@"; do cp "$seed" "$corpus/"; done
extra=()
[ "$dict" != "-" ] && extra+=(-dict="$dict")
export STAGEHAND_FUZZ_TARGET=$target
"$bin" -max_total_time="$seconds" -rss_limit_mb=1536 -timeout=10 -print_final_stats=1 "${extra[@]}" \
  -artifact_prefix="$out/" "$corpus" >"$out/fuzz.log" 2>&1
rc=$?
grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::peak_rss_mb)' "$out/fuzz.log"
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$out/fuzz.log"
  for a in "$out"/crash-* "$out"/timeout-* "$out"/oom-*; do [ -f "$a" ] && { echo "input $a:"; od -An -tx1 "$a" | head; }; done
  echo "fuzzing $target failed (exit $rc)"
  exit 1
fi
echo "fuzzed $target for $seconds s without a finding"
