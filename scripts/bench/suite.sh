#!/usr/bin/env bash
# The single-rank spec suite's wall time, old checkout against new, alternating:
#   scripts/bench/suite.sh OLD_DIR NEW_DIR [runs (default 3)] [build folder (default build-s)]
# Each run is `flowlua spec/run.lua spec` in that checkout with its own binary, as scripts/test.sh
# runs it (OPENBLAS_NUM_THREADS=1, FLOW_BIN set); the old one first in each pair. Prints one line
# per run (seconds, the closing line, the load average before it), then min and median per side.
set -uo pipefail
old=$(cd "$1" && pwd); new=$(cd "$2" && pwd); runs=${3:-3}; build=${4:-build-s}
logs=$(mktemp -d)
echo "each run's output: $logs/{old,new}-N.txt"
declare -A secs
one() { # side, dir, run
  local load line log=$logs/$1-$3.txt
  load=$(cut -d' ' -f1 /proc/loadavg)
  (cd "$2" && OPENBLAS_NUM_THREADS=1 FLOW_BIN=$2/$build/flowlua FLOW_SPEC_LABEL=specs \
    /usr/bin/time -o "$log.time" -f '%e' "$build/flowlua" spec/run.lua spec >"$log" 2>&1)
  line=$(grep '^specs: ' "$log" | tail -1)
  local s; s=$(tail -1 "$log.time")
  secs[$1]+="$s "
  printf '%-4s %7.2f s  load %-5s %s\n' "$1" "$s" "$load" "$line"
}
for ((i = 1; i <= runs; i++)); do one old "$old" "$i"; one new "$new" "$i"; done
for side in old new; do
  echo "$side: ${secs[$side]}" | tr ' ' '\n' | tail -n +2 | grep . | sort -n |
    awk -v side="$side" '{v[NR] = $1} END {m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
      printf "%s: min %.2f s, median %.2f s over %d runs\n", side, v[1], m, NR}'
done
