-- The GPT training step of gpt_step.lua under two settings in one process: blocks of steps
-- alternate between them, so both see the same machine (a shared machine's speed drifts by more
-- than the differences measured here). Prints each setting's median and best ms per step and the
-- speed-up of the second over the first: the median of adjacent blocks' ratios.
--   --vs threads: 1 thread against N (--threads, default 2)
--   --vs amp:     float32 against bf16 autocast, on this run's threads
--   flowlua scripts/bench/gpt_ab.lua [--vs threads|amp --threads 2 --rounds 8 --block 4]
local flow = require "flow"
local utils = require "flow.utils"
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local step_timer = require "step_timer"

local args = utils.parse_args(arg, step_timer.gpt_options({ vs = "threads", threads = 2, rounds = 8, block = 4 }))
if args.vs ~= "threads" and args.vs ~= "amp" then error(("--vs %s: expected threads or amp"):format(args.vs), 0) end
local _, opt, loss = step_timer.gpt(args)

-- the two settings: a name and a step function each
local settings
if args.vs == "threads" then
  local step = step_timer.train_step(loss, opt, "off")
  local function on(n) return function() flow._bench.set_threads(n); return step() end end
  settings = { { "1 thread", on(1) }, { args.threads .. " threads", on(args.threads) } }
else
  if not flow._bench.onednn().bf16 then print("gpt_ab: this CPU runs bf16 autocast in float32 (no AVX512-BF16)") end
  settings = { { "float32", step_timer.train_step(loss, opt, "off") },
               { "bf16 autocast", step_timer.train_step(loss, opt, "bf16") } }
end

local all, ratios = { {}, {} }, {}
for _, s in ipairs(settings) do -- warm-up (primitives, allocator, bf16 copies)
  s[2]()
  s[2]()
end
for _ = 1, args.rounds do
  local med = {}
  for i, s in ipairs(settings) do
    s[2]() -- the first step after a switch wakes the threads
    local times = step_timer.times(s[2], 0, args.block)
    for _, t in ipairs(times) do table.insert(all[i], t) end
    med[i] = step_timer.median(times)
  end
  ratios[#ratios + 1] = med[1] / med[2]
end
for i = 1, 2 do table.sort(all[i]) end
table.sort(ratios)
print(("gpt_ab: L=%d D=%d T=%d B=%d, %s against %s, %d rounds of %d steps each"):format(args.layers, args.dim,
  args.seq, args.batch, settings[2][1], settings[1][1], args.rounds, args.block))
for i, s in ipairs(settings) do
  print(("  %-14s median %.1f ms, best %.1f ms"):format(s[1] .. ":", step_timer.median(all[i]), all[i][1]))
end
print(("speed-up of %s: %.2fx (median of the rounds' ratios; they ranged %.2f-%.2f), %.2fx best to best"):format(
  settings[2][1], step_timer.median(ratios), ratios[1], ratios[#ratios], all[1][1] / all[2][1]))
