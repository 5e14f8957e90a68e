#!/usr/bin/env bash
# What each single-rank spec file costs on its own, slowest first: wall seconds, CPU seconds (user +
# system, children included) and its counts.
# scripts/bench/spec-times.sh [build folder (default build)] [spec files or dirs (default spec)]
set -uo pipefail
# runs in the current folder (a checkout), so it times an older checkout too
BUILD=${1:-build}; shift || true
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1} FLOW_BIN=$PWD/$BUILD/flowlua
t=$(mktemp)
trap 'rm -f "$t"' EXIT
printf '%7s %7s  %-40s %s\n' wall cpu file counts
for f in $(find "${@:-spec}" -name '*_spec*.lua' | sort); do
  line=$(FLOW_SPEC_LABEL=specs FLOW_SPEC_JOBS=1 /usr/bin/time -o "$t" -f '%e %U %S' \
    "$BUILD/flowlua" spec/run.lua "$f" 2>&1 | grep '^specs: ' | tail -1)
  read -r wall user sys < "$t"
  printf '%7.2f %7.2f  %-40s %s\n' "$wall" "$(echo "$user + $sys" | bc)" "$f" "${line#specs: }"
done | sort -rn
