#!/usr/bin/env bash
# Every C++ and CUDA source of the repository (not third_party/) is formatted as .clang-format says
# (clang-format 14, Debian's). Fails listing each file that differs; `tools/format` rewrites them.
# The check itself is shown to fail first, on a file formatted otherwise.
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
command -v clang-format >/dev/null || { echo "format: clang-format not found; tools/setup installs it"; exit 1; }
[ -f .clang-format ] || { echo "format: .clang-format is not among the test's files in $PWD"; exit 1; }

# A planted file in another format must be caught, or the check below proves nothing.
scratch=$(mktemp -d "${TEST_TMPDIR:-/tmp}/format.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
cp .clang-format "$scratch/"
printf 'int  f( int x ){return x;}\n' > "$scratch/bad.cc"
if clang-format --style=file --dry-run -Werror "$scratch/bad.cc" >/dev/null 2>&1; then
  echo "format: clang-format passed a misformatted file; the check cannot fail"
  exit 1
fi

files=()
while IFS= read -r -d '' f; do files+=("${f#./}"); done < <(find -L . -path ./external -prune -o -path ./third_party -prune \
  -o -type f \( -name '*.cc' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)
[ "${#files[@]}" -gt 200 ] || { echo "format: only ${#files[@]} sources found in $PWD; is //:all_sources its data?"; exit 1; }
status=0
for f in "${files[@]}"; do
  if ! clang-format --style=file --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "format: $f differs from .clang-format's style; run tools/format"
    status=1
  fi
done
[ $status -eq 0 ] && echo "format: ${#files[@]} sources formatted"
exit $status
