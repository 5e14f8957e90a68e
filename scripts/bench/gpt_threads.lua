-- The GPT training step of gpt_step.lua on 1 thread and on N (default 2), in one process: blocks
-- of steps alternate between the two thread counts, so both see the same machine; prints each
-- count's median and best ms per step and the speed-up, the median of adjacent blocks' ratios.
--   flowlua scripts/bench/gpt_threads.lua [--threads 2 --rounds 8 --block 4 --amp bf16]
local flow = require "flow"
local utils = require "flow.utils"
local gpt = require "flow.gpt"
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local step_timer = require "step_timer"

local args = utils.parse_args(arg, { layers = 4, dim = 256, heads = 8, seq = 128, batch = 8, vocab = 256,
                                     threads = 2, rounds = 8, block = 4, amp = "off" })
if args.amp ~= "off" and args.amp ~= "bf16" then error(("--amp %s: expected off or bf16"):format(args.amp), 0) end
flow.manual_seed(0)
local model = gpt.GPT({ vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers, n_head = args.heads, n_embd = args.dim })
local opt = model:configure_optimizer({ lr = 1e-4, weight_decay = 0.1 })
local x = flow.randint(0, args.vocab, { args.batch, args.seq })
local y = flow.randint(0, args.vocab, { args.batch, args.seq })
local step = step_timer.train_step(function()
  local _, l = model(x, y)
  return l
end, opt, args.amp)

local counts = { 1, args.threads }
local all, ratios = { {}, {} }, {}
for _, n in ipairs(counts) do -- warm-up at each count (primitives, allocator)
  flow._bench.set_threads(n)
  step()
  step()
end
for _ = 1, args.rounds do
  local med = {}
  for i, n in ipairs(counts) do
    flow._bench.set_threads(n)
    step() -- the first step after a switch wakes the threads
    local times = step_timer.times(step, 0, args.block)
    for _, t in ipairs(times) do table.insert(all[i], t) end
    med[i] = step_timer.median(times)
  end
  ratios[#ratios + 1] = med[1] / med[2]
end
for i = 1, 2 do table.sort(all[i]) end
table.sort(ratios)
print(("gpt_threads: L=%d D=%d T=%d B=%d, %s, %d rounds of %d steps per thread count"):format(args.layers,
  args.dim, args.seq, args.batch, args.amp == "bf16" and "bf16 autocast" or "float32", args.rounds, args.block))
for i, n in ipairs(counts) do
  print(("  %d thread(s): median %.1f ms, best %.1f ms"):format(n, step_timer.median(all[i]), all[i][1]))
end
print(("speed-up on %d threads: %.2fx (median of the rounds' ratios; they ranged %.2f-%.2f), %.2fx best to best"):format(
  args.threads, step_timer.median(ratios), ratios[1], ratios[#ratios], all[1][1] / all[2][1]))
