-- One GPT training step (forward + backward + AdamW) in ms:
--   OPENBLAS_NUM_THREADS=1 flowlua scripts/bench/gpt_step.lua [--layers 4 --dim 256 --heads 8
--                                                              --seq 128 --batch 8 --steps 10]
-- float32, vocab 256 (byte level), random tokens; the first steps are warm-up and not timed.
local flow = require "flow"
local utils = require "flow.utils"
local gpt = require "flow.gpt"

local args = utils.parse_args(arg, { layers = 4, dim = 256, heads = 8, seq = 128, batch = 8, vocab = 256,
                                     steps = 10, warmup = 2, device = "cpu" })
flow.manual_seed(0)
local model = gpt.GPT({ vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers, n_head = args.heads, n_embd = args.dim })
local opt = model:configure_optimizer({ lr = 1e-4, weight_decay = 0.1 })
local x = flow.randint(0, args.vocab, { args.batch, args.seq })
local y = flow.randint(0, args.vocab, { args.batch, args.seq })

local function step()
  local _, loss = model(x, y)
  loss:backward()
  opt:step()
  opt:zero_grad()
  local l = loss:item()
  collectgarbage() -- free the step's tensors now, as train_gpt.lua does
  return l
end

for _ = 1, args.warmup do step() end
local times = {}
local cpu0 = os.clock()
for i = 1, args.steps do
  local t0 = utils.now()
  step()
  times[i] = (utils.now() - t0) * 1000
end
local cpu_ms = (os.clock() - cpu0) * 1000 / args.steps -- CPU time of all threads: shows load from others
table.sort(times)
local sum = 0
for _, t in ipairs(times) do sum = sum + t end
local tokens = args.batch * args.seq
print(("gpt_step: L=%d D=%d H=%d T=%d B=%d vocab=%d, %.2fM params, OPENBLAS_NUM_THREADS=%s"):format(
  args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab, model:num_parameters() / 1e6,
  os.getenv("OPENBLAS_NUM_THREADS") or "unset"))
print(("ms/step: mean %.1f  median %.1f  min %.1f  (%d steps; %.0f tokens/s; process CPU %.1f ms/step)"):format(
  sum / #times, times[(#times + 1) // 2], times[1], #times, tokens / (sum / #times / 1000), cpu_ms))

-- The reference: the same model in PyTorch (Debian's python3-torch) in the same command, with the
-- same thread count (torch reads OMP_NUM_THREADS; set it from OPENBLAS_NUM_THREADS).
local threads = os.getenv("OPENBLAS_NUM_THREADS") or ""
local script = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/gpt_step_torch.py"
local cmd = ("%s/usr/bin/python3 %s %d %d %d %d %d %d %d 2>/dev/null"):format(
  threads ~= "" and ("OMP_NUM_THREADS=" .. threads .. " ") or "", script,
  args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab, args.steps)
local p = io.popen(cmd)
local out = p and p:read("a") or ""
if p then p:close() end
local torch_median = tonumber(out:match("torch_ms ([%d.]+)"))
if torch_median then
  local median = times[(#times + 1) // 2]
  print(("PyTorch same model: median %.1f ms/step -> flowlua throughput %.2fx PyTorch"):format(
    torch_median, torch_median / median))
else
  print("PyTorch reference: not run (/usr/bin/python3 with torch not found)")
end
