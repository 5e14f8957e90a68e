-- One GPT-2 training step on the GPU (forward + backward + AdamW) with bf16 autocast: tokens/s and
-- MFU. Default: GPT-2 124M (L=12 D=768 H=12, vocab 50257) at T=1024, B=8.
--   flowlua scripts/bench/gpt_gpu.lua [--layers 12 --dim 768 --heads 12 --seq 1024 --batch 8 --steps 10]
local flow = require "flow"
local utils = require "flow.utils"
local gpt = require "flow.gpt"

if not flow.cuda.is_available() then
  print("gpt_gpu: skipped (no GPU: " .. tostring(flow.cuda.unavailable_reason()) .. ")")
  return
end

local args = utils.parse_args(arg, { layers = 12, dim = 768, heads = 12, seq = 1024, batch = 8, vocab = 50257,
                                     steps = 10, warmup = 2, peak_tflops = 989, attention = "fused" })
if args.attention ~= "fused" and args.attention ~= "math" then error("--attention: fused or math") end
-- "math": attention as cuBLAS matmuls and a softmax (scores materialised), against the fused kernel
flow.backends.attention = args.attention == "math" and "math" or nil
flow.manual_seed(0)
local cfg = { vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers, n_head = args.heads,
              n_embd = args.dim, dropout = 0 }
local model = gpt.GPT(cfg)

-- float32 master weights on the GPU (GPT:forward builds its position ids on the ids' device)
model:to("cuda")

local opt = model:configure_optimizer({ lr = 6e-4, weight_decay = 0.1 })
local x = flow.randint(0, args.vocab, { args.batch, args.seq }):cuda()
local y = flow.randint(0, args.vocab, { args.batch, args.seq }):cuda()

local function step()
  local loss = flow.autocast("bfloat16", function()
    local _, l = model(x, y)
    l:backward()
    return l
  end)
  opt:step()
  opt:zero_grad()
  local v = loss:item()
  collectgarbage()
  return v
end

for _ = 1, args.warmup do step() end
flow.cuda.synchronize()
local t0 = flow.now()
local loss
for _ = 1, args.steps do loss = step() end
flow.cuda.synchronize()
local dt = (flow.now() - t0) / args.steps
local tokens = args.batch * args.seq
local nparams = model:num_parameters()
-- 6 N per token for the matmuls (forward + backward), plus attention's 12 L T D
local flops_per_token = 6 * nparams + 12 * args.layers * args.seq * args.dim
local mfu = tokens / dt * flops_per_token / (args.peak_tflops * 1e12)
local stats = flow.cuda.memory_stats()
print(("gpt_gpu: L=%d D=%d H=%d T=%d B=%d vocab=%d, %.1fM params, bf16 autocast, %s attention"):format(args.layers,
  args.dim, args.heads, args.seq, args.batch, args.vocab, nparams / 1e6, args.attention))
print(("gpt_gpu: %.1f ms/step, tokens/s %.0f, MFU %.1f%% (of %d TFLOP/s), loss %.3f, peak memory %.2f GiB"):format(
  dt * 1e3, tokens / dt, mfu * 100, args.peak_tflops, loss, stats.peak / 2 ^ 30))
