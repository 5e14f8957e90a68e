#!/usr/bin/env bash
# Start-up cost: wall time and peak RSS of `flowlua -e 'print(1)'` and of `require "flow"` from stock
# lua5.4, against `lua5.4 -e 'print(1)'` measured in the same run (the commands take turns, so a
# drifting machine moves all three alike).
#   scripts/bench/startup.sh [RUNS]      (default 10; FLOW_BUILD picks the build folder, default build)
# Prints, per command, the median and min wall time (ms, bash's clock around /usr/bin/time, which
# adds about 1 ms) and the median peak RSS (MB, from /usr/bin/time).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${FLOW_BUILD:-build}
RUNS=${1:-10}
[ -x /usr/bin/time ] || { echo "startup.sh: needs /usr/bin/time (Debian package time)" >&2; exit 1; }
[ -x "$BUILD/flowlua" ] || { echo "startup.sh: no $BUILD/flowlua (build first, or set FLOW_BUILD)" >&2; exit 1; }

names=("lua5.4 -e 'print(1)'" "flowlua -e 'print(1)'" "lua5.4 -e 'require\"flow\"'")
cmds=("lua5.4 -e print(1)"
      "$BUILD/flowlua -e print(1)"
      "lua5.4 -e package.cpath=\"$BUILD/?.so;\"..package.cpath;require\"flow\"")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for ((r = 0; r < RUNS; r++)); do
  for i in "${!cmds[@]}"; do
    # shellcheck disable=SC2086  # the command is split into words on purpose
    t0=$EPOCHREALTIME
    /usr/bin/time -f '%M' -o "$tmp/rss" ${cmds[$i]} >/dev/null 2>"$tmp/err" \
      || { echo "startup.sh: '${names[$i]}' failed:" >&2; cat "$tmp/err" >&2; exit 1; }
    t1=$EPOCHREALTIME
    echo "$t0 $t1 $(cat "$tmp/rss")" | awk '{print ($2 - $1) * 1000, $3 / 1024}' >>"$tmp/$i"
  done
done

median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
printf '%-32s %12s %12s %12s\n' command "median ms" "min ms" "RSS MB"
for i in "${!cmds[@]}"; do
  ms=$(awk '{print $1}' "$tmp/$i" | median)
  lo=$(awk '{print $1}' "$tmp/$i" | sort -g | head -1)
  mb=$(awk '{print $2}' "$tmp/$i" | median)
  printf '%-32s %12.0f %12.0f %12.1f\n' "${names[$i]}" "$ms" "$lo" "$mb"
done
echo "($RUNS runs each, taking turns)"
