#!/usr/bin/env bash
# 1,000 simulated workers register, use the key-value store and pass a barrier in under 20 s; a
# --workers beyond the cap is refused with exit 2.
set -euo pipefail
tool=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}/tools/coordinator_load/coordinator_load
[ -x "$tool" ] || { echo "coordinator_load_test: $tool not found"; exit 1; }
"$tool" --workers=1000 --max_seconds=20 --timeout_s=60
set +e
"$tool" --workers=20001 >/dev/null 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "coordinator_load_test: FAIL: --workers=20001 exited $rc, expected 2"; exit 1; }
echo "coordinator_load_test: PASS"
