#!/usr/bin/env bash
# The cost of the default agreement check (every rank compares a hash of the global ops it ran
# before data moves) on the data-parallel GPT step: `train_gpt.lua --dp 2` with the check on (the
# default) and off (FLOW_CHECK=0), taking turns, ROUNDS times each (default 5), STEPS steps per run
# (default 40; the first 5 are warm-up and not counted). Prints each run's median ms/step and the
# ratio of the medians of all runs.
#   scripts/bench/check_cost.sh [ROUNDS] [STEPS]      (FLOW_BUILD: the build folder, default build)
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-5}
steps=${2:-40}
bin=${FLOW_BUILD:-build}/flowlua
launch=(mpirun --oversubscribe -np 2)
[ "$(id -u)" = 0 ] && launch+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1 FLOW_NUM_THREADS=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# median ms/step of the steps after the warm-up in a train_gpt --log file
median() {
  "$bin" -e "path = '$1'" -e '
    local t = {}
    for l in io.lines(path) do
      local s, ms = l:match([["step":(%d+),.*"ms":([%d.e+-]+)]])
      if s and tonumber(s) > 5 then t[#t + 1] = tonumber(ms) end
    end
    table.sort(t)
    print(("%.2f"):format(t[(#t + 1) // 2]))'
}

on=() off=()
for r in $(seq "$rounds"); do
  for mode in on off; do
    rm -f "$log"
    env $([ $mode = off ] && echo FLOW_CHECK=0) "${launch[@]}" "$bin" scripts/train_gpt.lua --dp 2 --steps "$steps" \
      --no-eval --sample-len 0 --log-every 1000 --log "$log" > /dev/null
    m=$(median "$log")
    if [ $mode = on ]; then on+=("$m"); else off+=("$m"); fi
    echo "round $r, check $mode: median $m ms/step"
  done
done
"$bin" -e "on_s, off_s = '${on[*]}', '${off[*]}'" -e '
  local function med(s)
    local t = {}
    for x in s:gmatch("%S+") do t[#t + 1] = tonumber(x) end
    table.sort(t)
    return t[(#t + 1) // 2]
  end
  local on, off = med(on_s), med(off_s)
  print(("check on %.2f ms/step, off %.2f ms/step (medians of the runs): the check costs %.1f%%"):format(
    on, off, 100 * (on / off - 1)))'
