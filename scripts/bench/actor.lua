-- Actor runtime overhead and pipelining: µs per act of a chain of no-op actors on one stream and
-- on two (alternating: every register crosses streams; in two blocks: one crosses), against the
-- target of 2 µs; and the speed-up of a two-stage chain of busy 2 ms acts with register_num 2 over
-- register_num 1, against the ideal 2P / (P + 1) of a two-stage pipeline of P pieces.
-- Usage: flowlua scripts/bench/actor.lua [tasks] [pieces]
local flow = require "flow"

local TASKS = tonumber(arg and arg[1]) or 1000
local PIECES = tonumber(arg and arg[2]) or 200
local REPEATS = 7 -- the minimum over repeats filters out interference from other processes
local TARGET_US = 2.0

local function best_us_per_act(opts)
  local best = math.huge
  for _ = 1, REPEATS do
    local r = flow._actor_chain(opts)
    assert(not r.error and r.in_order and r.data_ok, r.error)
    best = math.min(best, r.seconds / r.acts * 1e6)
  end
  return best
end

print(("actor chain of %d no-op actors, %d pieces (min of %d runs)"):format(TASKS, PIECES, REPEATS))
for _, c in ipairs{
  {streams = 1, layout = "blocks", what = "1 stream"},
  {streams = 2, layout = "roundrobin", what = "2 streams, alternating"},
  {streams = 2, layout = "blocks", what = "2 streams, two blocks"},
} do
  local us = best_us_per_act{tasks = TASKS, pieces = PIECES, streams = c.streams, layout = c.layout}
  print(("  %-24s %8.3f µs/act   %6.2fx the %.0f µs target"):format(c.what, us, us / TARGET_US, TARGET_US))
end

-- Two stages on two streams: with one slot they take turns, with two they overlap.
local P, WORK_US = 12, 2000
local function best_seconds(register_num)
  local best = math.huge
  for _ = 1, 3 do
    local r = flow._actor_chain{tasks = 2, streams = 2, pieces = P, work_us = WORK_US, register_num = register_num}
    best = math.min(best, r.seconds)
  end
  return best
end
local serial, piped = best_seconds(1), best_seconds(2)
print(("two stages of %d µs busy acts, %d pieces (best of 3)"):format(WORK_US, P))
print(("  register_num 1 %8.2f ms   register_num 2 %8.2f ms   speed-up %.2fx (ideal %.2fx)")
  :format(serial * 1e3, piped * 1e3, serial / piped, 2 * P / (P + 1)))
