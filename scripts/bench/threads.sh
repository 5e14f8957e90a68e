#!/bin/sh
# One GPT step (gpt_step.lua --torch off) at 1 and 2 threads, for each configuration given (an
# environment and a binary, e.g. 'GOMP_SPINCOUNT=300000 build/flowlua'), alternating runs:
#   scripts/bench/threads.sh [-r ROUNDS] CONFIG [CONFIG ...]
# Prints, per configuration and thread count, the fastest step of all runs, the median of the runs'
# median ms per step, and the least process CPU ms per step (all threads): on a shared machine the CPU time says
# what the work cost, the wall time what the other tenants left of the cores.
rounds=3
if [ "$1" = "-r" ]; then rounds=$2; shift 2; fi
[ $# -gt 0 ] || { echo "usage: $0 [-r ROUNDS] 'ENV... BIN' ..." >&2; exit 2; }
here=$(dirname "$0")
out=$(mktemp)
r=0
while [ $r -lt "$rounds" ]; do
  r=$((r + 1))
  c=0
  for config in "$@"; do
    c=$((c + 1))
    for t in 1 2; do
      line=$(env OPENBLAS_NUM_THREADS=1 FLOW_NUM_THREADS=$t $config "$here/gpt_step.lua" --torch off 2>&1 | grep '^ms/step')
      echo "$c $t $line" >> "$out"
    done
  done
done
c=0
for config in "$@"; do
  c=$((c + 1))
  echo "($c) $config"
done
printf '%-6s %7s %9s %12s %14s\n' config threads "best ms" "median ms" "least CPU ms"
# fields: config threads "ms/step:" mean M median M min M (N steps; T tokens/s; process CPU C ms/step)
awk '{ k = $1 " " $2; med[k] = med[k] " " $7; cpu = $(NF - 1) + 0;
       if (!(k in best) || $9 + 0 < best[k]) best[k] = $9 + 0;
       if (!(k in lc) || cpu < lc[k]) lc[k] = cpu; keys[k] = 1 }
     END { for (k in keys) { n = split(med[k], v, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
             if (v[j] + 0 < v[i] + 0) { x = v[i]; v[i] = v[j]; v[j] = x }
           split(k, f, " "); printf "%-6s %7s %9.1f %12.1f %14.1f\n", "(" f[1] ")", f[2], best[k], v[int((n + 1) / 2)], lc[k] } }' "$out" | sort
rm -f "$out"
