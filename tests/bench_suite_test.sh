#!/usr/bin/env bash
# bench/ stays a benchmark suite (bench/README.md, "Rules"):
#   1. every file under bench/ is named in bench/README.md (by its path inside bench/);
#   2. results are bench/results/<topic>-<hw>-<date>.md, a real date, and name a commit;
#   3. no raw output (.log, .tgz, .tar.gz, .out) and no directory under bench/results/;
#   4. no probe names a hard-coded /tmp path ($OUT and mktemp -d instead).
# Each problem is one line saying what to change. The checker also runs on a made-up bad suite and must
# find each kind of problem there.
set -uo pipefail

# check_suite DIR: prints one line per problem found in the suite at DIR; returns 1 if any.
check_suite() {
  local dir=$1 bad=0 f rel name
  local readme="$dir/README.md"
  if [ ! -f "$readme" ]; then
    echo "bench/README.md is missing: describe the suite there"; return 1
  fi
  while IFS= read -r -d '' f; do
    rel=${f#"$dir"/}
    [ "$rel" = README.md ] && continue
    if ! grep -qF -- "$rel" "$readme"; then
      echo "bench/$rel is not named in bench/README.md: describe it there (or git rm it)"; bad=1
    fi
    case "$rel" in
      *.log | *.tgz | *.tar.gz | *.out)
        echo "bench/$rel is raw output: quote its figures in a result and git rm it"; bad=1 ;;
    esac
  done < <(find -L "$dir" -type f -print0 | sort -z)
  if [ -d "$dir/results" ]; then
    while IFS= read -r -d '' f; do
      name=${f##*/}
      if [ -d "$f" ]; then
        echo "bench/results/$name/ is a directory of raw files: quote the figures in a result and git rm -r it"
        bad=1; continue
      fi
      if ! [[ "$name" =~ ^[a-z0-9][a-z0-9.]*(-[a-z0-9.]+)*-([a-z][a-z0-9]*)-([0-9]{4}-[0-9]{2}-[0-9]{2})\.md$ ]]; then
        echo "bench/results/$name: name it <topic>-<hw>-<date>.md (e.g. one-gpu-vs-compile-h200-2026-12-03.md)"
        bad=1; continue
      fi
      local day=${BASH_REMATCH[3]}
      if [ "$(date -u -d "$day" +%F 2>/dev/null)" != "$day" ]; then
        echo "bench/results/$name: $day is not a date (YYYY-MM-DD)"; bad=1
      fi
      if ! grep -qE '\b[0-9a-f]{7,40}\b' "$f"; then
        echo "bench/results/$name: name the commit that was measured (a git hash)"; bad=1
      fi
    done < <(find "$dir/results" -mindepth 1 -maxdepth 1 -print0 | sort -z)
  fi
  if [ -d "$dir/probes" ]; then
    while IFS= read -r -d '' f; do
      if grep -qE '(^|[^A-Za-z0-9_])/tmp([/" ]|$)' "$f"; then
        echo "bench/${f#"$dir"/} names /tmp: keep results under \$OUT and scratch files in a mktemp -d directory"
        bad=1
      fi
    done < <(find "$dir/probes" -type f -print0 | sort -z)
  fi
  return "$bad"
}

fail() { echo "FAIL: $*"; exit 1; }

suite=$PWD/bench
[ -f "$suite/README.md" ] || fail "bench/ not found in $PWD (the test's data)"

files=$(find -L "$suite" -type f | wc -l)
[ "$files" -ge 10 ] || fail "bench/ holds $files files here: the test's data (//bench:suite) did not come"

# 1. The suite as committed.
if ! out=$(check_suite "$suite"); then
  echo "$out"
  fail "bench/ breaks the rules of bench/README.md (lines above)"
fi
echo "PASS  bench/: $files files, each named in bench/README.md; results named" \
  "<topic>-<hw>-<date>.md; no raw output; no /tmp in probes"

# 2. A made-up bad suite: every kind of problem is found, each on one line.
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
mkdir -p "$t/bad/results/2026-12-01-old" "$t/bad/probes"
cat >"$t/bad/README.md" <<'EOF'
results/one-gpu-h200-2026-12-01.md results/speed-h200-2026-13-01.md probes/x.sh probes/run.log
results/nocommit-cpu-2026-12-01.md results/2026-12-01-one-gpu-speed-2.md results/2026-12-01-old/a.txt
EOF
echo "commit abc1234" >"$t/bad/results/one-gpu-h200-2026-12-01.md"
echo "commit abc1234" >"$t/bad/results/speed-h200-2026-13-01.md"
echo "no hash here" >"$t/bad/results/nocommit-cpu-2026-12-01.md"
echo "commit abc1234" >"$t/bad/results/2026-12-01-one-gpu-speed-2.md"
echo "raw" >"$t/bad/results/2026-12-01-old/a.txt"
# shellcheck disable=SC2016
echo 'out=${OUT:-/tmp/x}' >"$t/bad/probes/x.sh"
echo "raw" >"$t/bad/probes/run.log"
echo "unlisted" >"$t/bad/probes/unlisted.sh"
if out=$(check_suite "$t/bad"); then fail "the checker passed a bad suite"; fi
want=(
  "bench/probes/unlisted.sh is not named in bench/README.md"
  "bench/probes/run.log is raw output"
  "bench/results/2026-12-01-old/ is a directory of raw files"
  "bench/results/2026-12-01-one-gpu-speed-2.md: name it <topic>-<hw>-<date>.md"
  "bench/results/speed-h200-2026-13-01.md: 2026-13-01 is not a date"
  "bench/results/nocommit-cpu-2026-12-01.md: name the commit"
  "bench/probes/x.sh names /tmp"
)
for w in "${want[@]}"; do
  grep -qF -- "$w" <<<"$out" || { echo "$out"; fail "the checker did not report: $w"; }
done
n=$(grep -c '' <<<"$out")
[ "$n" -eq "${#want[@]}" ] || { echo "$out"; fail "the checker printed $n lines for ${#want[@]} problems"; }
echo "PASS  a made-up bad suite: each of ${#want[@]} problems reported in one line"
