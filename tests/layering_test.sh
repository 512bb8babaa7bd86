#!/usr/bin/env bash
# The layering of ../shared/design.md, checked on the sources: the launcher includes nothing from the
# worker's rooms and they nothing from the launcher; the schedule library and the model descriptions use
# no LibTorch (both sides share them), nor does the launcher (it starts fast; the c10d store it hosts
# for a launched PyTorch program speaks torch's wire protocol itself); the engine (engine/, the
# worker's pipeline driver) names no model family. Every room includes only its own and lower rooms'
# headers (the order below), so no two rooms include each other. Fails listing every offending line.
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
worker=(kernels/**/*.h kernels/**/*.cc kernels/**/*.cu kernels/**/*.cuh nn/**/*.h nn/**/*.cc engine/**/*.h
        engine/**/*.cc transport/**/*.h transport/**/*.cc models/**/*.h models/**/*.cc worker/**/*.h worker/**/*.cc)
[ "${#launcher[@]}" -gt 10 ] && [ "${#worker[@]}" -gt 10 ] || { echo "layering: sources not found in $PWD"; exit 1; }
check "launcher/, control/ or client/ includes the worker's rooms" '#include "(worker|engine|nn|kernels|transport)/' "${launcher[@]}"
check "the worker's rooms include launcher/, control/ or client/" '#include "(launcher|control|client)/' "${worker[@]}"
check "schedule/ uses LibTorch" '#include <(torch|ATen|c10)/' schedule/*.h schedule/*.cc
check "model descriptions use LibTorch" '#include <(torch|ATen|c10)/' models/*.h models/*.cc models/*/*_description.*
check "kernels/ uses LibTorch" '#include <(torch|ATen|c10)/' kernels/*
check "the engine names a model family" '(gpt|llama|Gpt|Llama)' engine/*.h engine/*.cc worker/pipeline.*
check "launcher, control or client BUILD depends on a worker library" '"//(worker:[a-z_]+|(engine|nn|kernels|transport)(:[a-z_]+)?)"' launcher/BUILD.bazel launcher/*/BUILD.bazel control/BUILD.bazel client/BUILD.bazel
check "launcher/, control/ or client/ uses LibTorch" '#include <(torch|ATen|c10)/' "${launcher[@]}"
check "launcher, control or client BUILD depends on LibTorch" '@libtorch' launcher/BUILD.bazel launcher/*/BUILD.bazel control/BUILD.bazel client/BUILD.bazel
check "include/ (what user programs include) includes a header of the project's" '^[[:space:]]*#include "' include/**/*.h

# The rooms, lowest first. A room includes headers of its own and of rooms before it, never of one
# after it. A room is a directory and what is under it, but for the rooms of its own inside it
# (launcher/ holds only its top-level files; models/ holds models/gpt and models/llama).
# At the bottom, what both sides share: the protos, common/, the schedule, telemetry.
# The worker's rooms: the CUDA kernels (no LibTorch), nn's building blocks on them, the transports, the
# engine on nn and a transport, the models (descriptions, the family registry, stages on the engine
# and nn), the worker process on all of them.
# The launcher's, in the order its includes have: plan's job plan needs the coordinator's types, the
# supervisor the devices (plan), the run directory the supervisor, the agent the job, a run the
# nodes, the server a run; the client resolves jobs (job) and names roles (control); the server's
# control service test drives it with the client library, so client/ sits below serve. The two sides
# never include each other (the checks above), whatever their places in one order.
rooms=(protos common schedule telemetry
       kernels nn transport engine models worker
       launcher/store control launcher/coordinator launcher/plan launcher/supervise launcher/job client
       launcher/multihost launcher/run launcher/serve launcher)
sourceless=(protos)  # its headers are generated (.pb.h)
declare -A rank
for i in "${!rooms[@]}"; do rank[${rooms[$i]}]=$i; done
room_of() {  # room_of PATH: the innermost room holding PATH's directory, or nothing
  local d=${1%/*}
  [ "$d" != "$1" ] || return 0
  while :; do
    if [ -n "${rank[$d]+set}" ]; then echo "$d"; return 0; fi
    [ "${d%/*}" != "$d" ] || return 0
    d=${d%/*}
  done
}
edges=()
files_seen=0
for room in "${rooms[@]}"; do
  files=()
  for f in "$room"/**/*.h "$room"/**/*.cc "$room"/**/*.cu "$room"/**/*.cuh; do
    [ "$(room_of "$f")" = "$room" ] && files+=("$f")
  done
  if [ "${#files[@]}" -eq 0 ]; then
    [[ " ${sourceless[*]} " == *" $room "* ]] || { echo "layering: no sources of $room/ in $PWD"; status=1; }
    continue
  fi
  files_seen=$((files_seen + ${#files[@]}))
  while IFS=: read -r file line header; do
    dir=$(room_of "$header")
    [ -n "$dir" ] && [ "$dir" != "$room" ] || continue  # its own room, or not a room
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
# the worker's rooms or a model's LibTorch stage (the descriptions' list of attention kernels,
# //nn:attention_kernels, is a header of names), none from the worker's into launcher/.
worker_rooms='//(worker|engine|kernels|transport)[:/]|//nn:(nn|model_options)$'
check "//launcher/serve, //launcher/multihost:slurm or //client depends (transitively) on" "^($worker_rooms|//models/[a-z]+:[a-z_]*stage|//models:model_family|@libtorch)" tests/launcher_deps
check "//launcher/store:c10d_store depends (transitively) on" "^($worker_rooms|//nn|//models|@libtorch)" tests/launcher_store_deps
check "//worker:worker_main depends (transitively) on" '^//(launcher|control|client)[:/]' tests/worker_deps
[ "$status" -eq 0 ] && echo "layering: ok (${#launcher[@]} launcher, control and client files, ${#worker[@]} files of the worker's rooms; $files_seen files in ${#rooms[@]} rooms)"
exit "$status"
