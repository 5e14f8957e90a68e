-- One GPT training step (forward + backward + AdamW) in ms:
--   FLOW_NUM_THREADS=1 flowlua scripts/bench/gpt_step.lua [--layers 4 --dim 256 --heads 8
--                                                          --seq 128 --batch 8 --steps 10 --amp bf16
--                                                          --torch off]
-- float32 (or bf16 autocast), vocab 256 (byte level), random tokens; the first steps are warm-up
-- and not timed. Prints the FLOP floor (the step's FLOPs at oneDNN's own 1024^3 GEMM rate,
-- measured in this run in the same precision) and the fraction of it reached, and PyTorch's time
-- on the same model, run twice: as configured, and with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
-- unset for that one command (its OpenBLAS then picks its own kernel); the faster is the anchor.
local flow = require "flow"
local utils = require "flow.utils"
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local step_timer = require "step_timer"

local args = utils.parse_args(arg, step_timer.gpt_options({ steps = 10, warmup = 2, device = "cpu", amp = "off",
                                                             torch = "on" }))
if args.amp ~= "off" and args.amp ~= "bf16" then error(("--amp %s: expected off or bf16"):format(args.amp), 0) end
local function amp(fn)
  if args.amp == "bf16" then return flow.autocast("bfloat16", fn) end
  return fn()
end
local model, opt, loss = step_timer.gpt(args)
local step = step_timer.train_step(loss, opt, args.amp)

local times, cpu_ms = step_timer.times(step, args.warmup, args.steps)
local sum = 0
for _, t in ipairs(times) do sum = sum + t end
local tokens = args.batch * args.seq
local threads = flow._bench.onednn().threads
print(("gpt_step: L=%d D=%d H=%d T=%d B=%d vocab=%d, %.2fM params, %s, %d thread(s)"):format(
  args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab, model:num_parameters() / 1e6,
  args.amp == "bf16" and "bf16 autocast" or "float32", threads))
local median = step_timer.median(times)
print(("ms/step: mean %.1f  median %.1f  min %.1f  (%d steps; %.0f tokens/s; process CPU %.1f ms/step)"):format(
  sum / #times, median, times[1], #times, tokens / (sum / #times / 1000), cpu_ms))

-- The FLOP floor: training FLOPs (PaLM's estimate, as train_gpt.lua: 6 per parameter per token plus
-- the attention scores) at oneDNN's peak, a 1024^3 GEMM measured now in the step's precision.
local n = 1024
local a, b, c = flow.ones({ n, n }), flow.ones({ n, n }), flow.zeros({ n, n })
local peak_s = math.huge
for _ = 1, 3 do peak_s = math.min(peak_s, amp(function() return flow._bench.sgemm(a, b, c, 4) end)) end
local peak = 2 * n ^ 3 / peak_s
local flops = tokens * (6 * model:num_parameters() + 12 * args.layers * args.seq * args.dim)
local floor_ms = flops / peak * 1000
print(("FLOP floor: %.1f GFLOP/step at oneDNN's %.0f GFLOP/s (1024^3) = %.1f ms; median reaches %.0f%% of it"):format(
  flops / 1e9, peak / 1e9, floor_ms, 100 * floor_ms / median))

if args.torch == "off" then return end -- our own figures only (comparing two builds)

-- The reference: the same model in PyTorch (Debian's python3-torch), same thread count, twice.
local configured, unset = step_timer.torch_ms("gpt_step_torch.py", ("%d %d %d %d %d %d %d %s"):format(args.layers,
  args.dim, args.heads, args.seq, args.batch, args.vocab, args.steps, args.amp), threads)
if configured or unset then
  local best = math.min(configured or math.huge, unset or math.huge)
  print(("PyTorch same model%s: median %s ms/step as configured, %s ms with OPENBLAS_CORETYPE/L2_SIZE unset"):format(
    args.amp == "bf16" and " (bf16 autocast)" or "", configured and ("%.1f"):format(configured) or "-",
    unset and ("%.1f"):format(unset) or "-"))
  print(("-> flowlua throughput %.2fx PyTorch's faster"):format(best / median))
else
  print("PyTorch reference: not run (/usr/bin/python3 with torch not found)")
end
