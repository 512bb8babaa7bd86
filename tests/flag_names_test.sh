#!/usr/bin/env bash
# Every --flag a message in the launcher's rooms (launcher/ but its store), control/ and client/ names
# is a flag that exists: the launcher's (its --help) or, for the command lines it gives workers, the
# worker's (ABSL_FLAG in worker/), or the client's (the control service's messages tell its users what
# to pass). Tests are exempt, and so are literals that show an srun command line (its flags are Slurm's).
set -u
cd "${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stagehand}" 2>/dev/null || true
shopt -s nullglob
sources=()
for f in launcher/*.cc launcher/*/*.cc control/*.cc client/*.cc; do
  [[ "$f" == *_test.cc || "$f" == launcher/store/* ]] || sources+=("$f")
done
[ "${#sources[@]}" -gt 10 ] || { echo "flag_names: sources not found in $PWD"; exit 1; }
defined=$( { { launcher/launcher --help; client/client --help; } | grep -oE '^  --[a-z0-9_]+' | sed 's/^  --//';
             echo help;  # ParseFlags' own
             grep -hoE 'ABSL_FLAG\([^,]+, *[a-z0-9_]+' worker/*.cc | sed -E 's/.*, *//'; } | sort -u)
[ -n "$defined" ] || { echo "flag_names: launcher --help listed no flags"; exit 1; }
status=0
# Names in string literals only (comments may name anything), each literal's every --name.
while IFS= read -r hit; do
  location=${hit%%:\"*}
  [[ "${hit#*:\"}" == *srun\ * ]] && continue  # an srun command line (launcher/multihost/slurm.cc) names srun's flags
  for flag in $(grep -oE -- '--[a-z][a-z0-9_-]*' <<<"${hit#*:\"}"); do
    if ! grep -qx -- "${flag#--}" <<<"$defined"; then
      echo "flag_names: $location: no flag $flag"
      status=1
    fi
  done
done < <(grep -noE '"([^"\\]|\\.)*"' "${sources[@]}" | sed -E 's/^([^:]+:[0-9]+):/\1:/')
exit $status
