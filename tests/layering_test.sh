#!/usr/bin/env bash
# The layering of ../shared/design.md, checked on the sources: the launcher includes nothing from the
# worker and the worker nothing from the launcher; the schedule library and the model descriptions use
# no LibTorch (both sides share them), nor does the launcher (it starts fast; the c10d store it hosts
# for a launched PyTorch program speaks torch's wire protocol itself); the engine (worker/executor, worker/pipeline) names no model
# family. Fails listing every offending line.
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
launcher=(launcher/**/*.h launcher/**/*.cc)
worker=(worker/**/*.h worker/**/*.cc)
[ "${#launcher[@]}" -gt 10 ] && [ "${#worker[@]}" -gt 10 ] || { echo "layering: sources not found in $PWD"; exit 1; }
check "launcher/ includes worker/" '#include "worker/' "${launcher[@]}"
check "worker/ includes launcher/" '#include "launcher/' "${worker[@]}"
check "schedule/ uses LibTorch" '#include <(torch|ATen|c10)/' schedule/*.h schedule/*.cc
check "model descriptions use LibTorch" '#include <(torch|ATen|c10)/' models/*.h models/*.cc models/*/*_description.*
check "the engine names a model family" '(gpt|llama|Gpt|Llama)' worker/executor.* worker/pipeline.* worker/stage.*
check "launcher BUILD depends on a worker library" '"//worker:[a-z_]+"' launcher/BUILD.bazel launcher/*/BUILD.bazel
check "launcher/ uses LibTorch" '#include <(torch|ATen|c10)/' "${launcher[@]}"
check "launcher BUILD depends on LibTorch" '@libtorch' launcher/BUILD.bazel launcher/*/BUILD.bazel
# Transitively, as Bazel resolves the targets (genquery): no path from the launcher's library into
# worker/ or a model's LibTorch stage, none from the worker's into launcher/.
check "//launcher/run:launch depends (transitively) on" '^(//worker|//models/[a-z]+:[a-z_]*stage|@libtorch)' tests/launcher_deps
check "//launcher/store:c10d_store depends (transitively) on" '^(//worker|//models|@libtorch)' tests/launcher_store_deps
check "//worker:worker_main depends (transitively) on" '^//launcher' tests/worker_deps
[ "$status" -eq 0 ] && echo "layering: ok (${#launcher[@]} launcher files, ${#worker[@]} worker files)"
exit "$status"
