#!/usr/bin/env bash
# The layering of ../shared/design.md, checked on the sources: the launcher includes nothing from the
# worker and the worker nothing from the launcher; the schedule library and the model descriptions use
# no LibTorch (both sides share them), nor does the launcher (it starts fast; the c10d store it hosts
# for a launched PyTorch program speaks torch's wire protocol itself); the engine (worker/executor, worker/pipeline) names no model
# family. The launcher's rooms, control/ and client/ include only their own and lower rooms' headers
# (the order below), so no two rooms include each other. Fails listing every offending line.
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
status=0
check() {  # check DESCRIPTION PATTERN FILES...
  local what=$1 pattern=$2; shift 2
  local hits
  # Comment lines may name anything: the rules are about code.
  hits=$(grep -nE "$pattern" "$@" 2>/dev/null | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
  if [ -n "$hits" ]; then
    echo "layering: $what:"
    echo "$hits"
    status=1
  fi
}
shopt -s nullglob globstar
launcher=(launcher/**/*.h launcher/**/*.cc control/*.h control/*.cc client/*.h client/*.cc)
worker=(worker/**/*.h worker/**/*.cc)
[ "${#launcher[@]}" -gt 10 ] && [ "${#worker[@]}" -gt 10 ] || { echo "layering: sources not found in $PWD"; exit 1; }
check "launcher/, control/ or client/ includes worker/" '#include "worker/' "${launcher[@]}"
check "worker/ includes launcher/, control/ or client/" '#include "(launcher|control|client)/' "${worker[@]}"
check "schedule/ uses LibTorch" '#include <(torch|ATen|c10)/' schedule/*.h schedule/*.cc
check "model descriptions use LibTorch" '#include <(torch|ATen|c10)/' models/*.h models/*.cc models/*/*_description.*
check "the engine names a model family" '(gpt|llama|Gpt|Llama)' worker/executor.* worker/pipeline.* worker/stage.*
check "launcher, control or client BUILD depends on a worker library" '"//worker:[a-z_]+"' launcher/BUILD.bazel launcher/*/BUILD.bazel control/BUILD.bazel client/BUILD.bazel
check "launcher/, control/ or client/ uses LibTorch" '#include <(torch|ATen|c10)/' "${launcher[@]}"
check "launcher, control or client BUILD depends on LibTorch" '@libtorch' launcher/BUILD.bazel launcher/*/BUILD.bazel control/BUILD.bazel client/BUILD.bazel

# The rooms, lowest first. A room includes headers of its own and of rooms before it, never of one
# after it. The order is the one the includes have: plan's job plan needs the coordinator's types,
# the supervisor the devices (plan), the run directory the supervisor, the agent the job, a run the
# nodes, the server a run; the client resolves jobs (job) and names roles (control); the server's
# control service test drives it with the client library, so client/ sits below serve.
rooms=(launcher/store control launcher/coordinator launcher/plan launcher/supervise launcher/job client
       launcher/multihost launcher/run launcher/serve launcher)
declare -A rank
for i in "${!rooms[@]}"; do rank[${rooms[$i]}]=$i; done
edges=()
for room in "${rooms[@]}"; do
  files=("$room"/*.h "$room"/*.cc)
  [ "${#files[@]}" -gt 0 ] || { echo "layering: no sources of $room/ in $PWD"; status=1; continue; }
  while IFS=: read -r file line header; do
    dir=${header%/*}
    [ -n "${rank[$dir]+set}" ] && [ "$dir" != "$room" ] || continue  # its own room, or not a room
    edges+=("$room $dir")
    if [ "${rank[$dir]}" -gt "${rank[$room]}" ]; then
      echo "layering: $file:$line: $room/ includes $header, of $dir/, a room above it"
      status=1
    fi
  done < <(grep -HnE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[^"]+"' "${files[@]}" |
           sed -E 's/^([^:]+):([0-9]+):[^"]*"([^"]+)".*/\1:\2:\3/')
done
# Whatever the order says: rooms that include each other, directly or through others, are a cycle.
loops=$(printf '%s\n' "${edges[@]}" | sort -u | tsort 2>&1 >/dev/null)
if [ -n "$loops" ]; then
  echo "layering: rooms include each other in a cycle (each line one loop tsort found):"
  sed 's/^tsort: //' <<<"$loops" |
    awk '/input contains a loop/ {if (l) print "  " l; l = ""; next} {l = l (l ? " " : "") $0} END {if (l) print "  " l}'
  status=1
fi
# Transitively, as Bazel resolves the targets (genquery): no path from the launcher's library into
# worker/ or a model's LibTorch stage, none from the worker's into launcher/.
check "//launcher/serve, //launcher/multihost:slurm or //client depends (transitively) on" '^(//worker|//models/[a-z]+:[a-z_]*stage|@libtorch)' tests/launcher_deps
check "//launcher/store:c10d_store depends (transitively) on" '^(//worker|//models|@libtorch)' tests/launcher_store_deps
check "//worker:worker_main depends (transitively) on" '^//launcher' tests/worker_deps
[ "$status" -eq 0 ] && echo "layering: ok (${#launcher[@]} launcher, control and client files in ${#rooms[@]} rooms, ${#worker[@]} worker files)"
exit "$status"
