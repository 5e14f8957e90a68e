-- The GEMMs of one GPT training step (the benchmark model of gpt_step.lua: D=256, B*T=1024 tokens,
-- MLP 4D), forward, input gradient and weight gradient of each linear layer and attention's
-- batched products, in ms on this run's threads: flowlua's GEMM (cut into one piece per thread,
-- each on oneDNN's one-thread kernel) against the same GEMM run whole on oneDNN's own threads,
-- alternating in the same process, and the ratio. Float32, or bf16 autocast with --amp bf16.
--   FLOW_NUM_THREADS=2 flowlua scripts/bench/gemm_threads.lua [--amp bf16 --rounds 5]
local flow = require "flow"
local utils = require "flow.utils"

local args = utils.parse_args(arg, { amp = "off", rounds = 5, dim = 256, tokens = 1024 })
if args.amp ~= "off" and args.amp ~= "bf16" then error(("--amp %s: expected off or bf16"):format(args.amp), 0) end
local D, N = args.dim, args.tokens
-- name, A's shape and B's shape as flow.matmul takes them, with its transpose options
local cases = {}
local function linear(name, out, inp)
  cases[#cases + 1] = { name .. " fwd", { N, inp }, { out, inp }, false, true }
  cases[#cases + 1] = { name .. " dX", { N, out }, { out, inp }, false, false }
  cases[#cases + 1] = { name .. " dW", { N, out }, { N, inp }, true, false }
end
linear("qkv", 3 * D, D)
linear("proj", D, D)
linear("fc1", 4 * D, D)
linear("fc2", D, 4 * D)
local H, T = 8, 128
local B, hd = N // T, D // H
cases[#cases + 1] = { "q k^T", { B, H, T, hd }, { B, H, T, hd }, false, true }
cases[#cases + 1] = { "p v", { B, H, T, T }, { B, H, T, hd }, false, false }

local function ms(f)
  local t0 = flow.now()
  for _ = 1, 10 do f() end
  return (flow.now() - t0) / 10 * 1e3
end

print(("GEMMs of a GPT step (D=%d, %d tokens), %s, %d thread(s), best of %d rounds"):format(
  D, N, args.amp == "bf16" and "bf16 autocast" or "float32", flow._bench.onednn().threads, args.rounds))
print(("  %-10s %10s %10s %7s"):format("gemm", "flow ms", "whole ms", "ratio"))
local total_cut, total_whole = 0, 0
for _, c in ipairs(cases) do
  local name, sa, sb, ta, tb = table.unpack(c)
  local a, b = flow.randn(sa), flow.randn(sb)
  local function run() return flow.matmul(a, b, { transpose_a = ta, transpose_b = tb }) end
  local f = args.amp == "bf16" and function() return flow.autocast("bfloat16", run) end or run
  local best = { [false] = math.huge, [true] = math.huge }
  for _ = 1, args.rounds do
    for _, w in ipairs({ false, true }) do
      local was = flow._bench.gemm_whole(w)
      f()
      best[w] = math.min(best[w], ms(f))
      flow._bench.gemm_whole(was)
    end
  end
  total_cut, total_whole = total_cut + best[false], total_whole + best[true]
  print(("  %-10s %10.3f %10.3f %7.2f"):format(name, best[false], best[true], best[true] / best[false]))
end
print(("  %-10s %10.3f %10.3f %7.2f"):format("total", total_cut, total_whole, total_whole / total_cut))
