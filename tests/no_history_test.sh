#!/usr/bin/env bash
# The repository describes the code, not when or how it was written: no line of its own text (//:all_sources,
# README.md and docs/ included; bench/results/ and CHANGELOG.md not) numbers the calls, rounds, sessions or issues
# of its making, says "as" "before", "this" "round", "as of <commit>" or "frozen" "copy". Fails listing
# each such line as file:line. History lives in git and CHANGELOG.md.
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true

# The phrases are split in this file so that it does not match itself.
patterns=(
  # A numbered call, round, session or issue; not a decimal ("round 2.5 to even").
  '\b(call|round|session|issue)s? #?[0-9]+\b(?![.,][0-9])'
  '\bas'' before\b'
  '\bthis'' round\b'
  '\bas of [0-9a-f]{7}\b'
  '\bfrozen'' copy\b'
)
regex=$(IFS='|'; echo "${patterns[*]}")

files=()
while IFS= read -r -d '' f; do files+=("${f#./}"); done < <(find -L . -path ./external -prune -o -type f \
  ! -name MANIFEST ! -name _repo_mapping ! -name '*.runfiles_manifest' -print0 | sort -z)
for must in README.md launcher/main.cc nn/nn.cc schedule/reference_schedules.h tests/no_history_test.sh; do
  if [ ! -f "$must" ]; then
    echo "no_history: $must is not among the test's files in $PWD; is //:all_sources its data?"
    exit 1
  fi
done

status=0
hits=$(grep -InHiP -- "$regex" "${files[@]}")
if [ -n "$hits" ]; then
  echo "$hits"
  echo "no_history: $(echo "$hits" | wc -l) line(s) above date the work instead of describing the code;"
  echo "  say what the code does and why, in the present tense (history lives in git and CHANGELOG.md)"
  status=1
fi

# Best effort, where the checkout is reachable through the runfiles' links: every tracked file outside
# bench/results/, CHANGELOG.md and the rule stubs must be among the scanned ones (a new package adds its
# all_sources to //:all_sources).
root=$(dirname "$(readlink -f WORKSPACE 2>/dev/null || echo .)")
if tracked=$(git -C "$root" ls-files 2>/dev/null) && [ -n "$tracked" ]; then
  missing=()
  while IFS= read -r f; do
    case "$f" in
      bench/results/* | CHANGELOG.md | third_party/rules_*/* | third_party/remote_coverage_tools/*) continue ;;
    esac
    [ -e "$root/$f" ] && [ ! -e "$f" ] && missing+=("$f")
  done <<< "$tracked"
  if [ "${#missing[@]}" -gt 0 ]; then
    printf 'not scanned: %s\n' "${missing[@]}"
    echo "no_history: ${#missing[@]} tracked file(s) above are not in //:all_sources; add their package's"
    echo "  all_sources filegroup (or, at the root, the file) to //:all_sources in BUILD.bazel"
    status=1
  fi
fi

[ "$status" -eq 0 ] && echo "no_history: ok (${#files[@]} files)"
exit "$status"
