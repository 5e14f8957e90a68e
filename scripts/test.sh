#!/usr/bin/env bash
# Runs every spec: set-up and build first (scripts/setup.sh), then the single-rank suite, then
# the multi-rank suite (spec/mpi) under mpirun -np 2 and -np 4, and under flowlua's own --ranks 2 and
# --ranks 4 (no mpirun; also in a build without MPI). Ends with "total: N passed, N failed".
# FLOW_BUILD picks the build folder; FLOW_SKIP_SETUP=1 reuses an existing build. The single-rank
# suite runs its files in parallel worker processes (spec/run.lua; FLOW_SPEC_JOBS=N sets how many,
# 1 runs them in one process); the multi-rank ones run each rank's specs in order.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${FLOW_BUILD:-build}
if [ "${FLOW_SKIP_SETUP:-0}" != 1 ]; then
  scripts/setup.sh || exit 1
fi
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
export FLOW_BIN=$PWD/$BUILD/flowlua   # specs that drive the binary (REPL) use this
export OMPI_MCA_rmaps_base_oversubscribe=1
mpirun_args=(--oversubscribe)
[ "$(id -u)" -eq 0 ] && mpirun_args+=(--allow-run-as-root)

log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0

run() { # label, command...
  local label=$1; shift
  echo "== $label: $*"
  FLOW_SPEC_LABEL=$label "$@" 2>&1 | tee -a "$log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    status=1
    grep -q "^$label: [0-9]* passed" "$log" || echo "$label: 0 passed, 1 failed (exit $rc before any summary)" | tee -a "$log"
  fi
}

run ranks1 "$BUILD/flowlua" spec/run.lua spec
if grep -q '^FLOW_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
  echo "== ranks2, ranks4: skipped (this build has no MPI: FLOW_MPI=OFF)"
elif ls spec/mpi/*_spec.lua >/dev/null 2>&1; then
  for np in 2 4; do
    run "ranks$np" timeout 600 mpirun "${mpirun_args[@]}" -np "$np" "$BUILD/flowlua" spec/run.lua spec/mpi
  done
fi

if ls spec/mpi/*_spec.lua >/dev/null 2>&1; then
  for np in 2 4; do
    run "local$np" timeout 600 "$BUILD/flowlua" --ranks "$np" spec/run.lua spec/mpi
  done
fi

passed=$(grep -Eo '^(ranks|local)[0-9]+: [0-9]+ passed' "$log" | awk '{s += $2} END {print s + 0}')
failed=$(grep -Eo '^(ranks|local)[0-9]+: [0-9]+ passed, [0-9]+ failed' "$log" | awk '{s += $4} END {print s + 0}')
[ "$failed" -gt 0 ] && status=1
echo
echo "total: $passed passed, $failed failed"
exit $status
