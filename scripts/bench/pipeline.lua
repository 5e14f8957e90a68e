-- Pipeline parallelism in graph mode: a GPT step (forward + backward + AdamW) with its blocks on 2
-- stages (ranks 0 and 1) and the batch in 4 micro-batches, against the same model and micro-batches
-- on one rank, in one run:
--   OPENBLAS_NUM_THREADS=1 mpirun -np 2 flowlua scripts/bench/pipeline.lua [--layers 4 --dim 256 --heads 8
--                                                                         --seq 128 --batch 8 --micro 4]
-- The micro-batches are the pieces of each run: stage 0's forward runs ahead of its backward as
-- far as the pipeline buffer's credits allow. Steps alternate: rank 0 times a step of the 1-rank
-- graph while rank 1 waits, then both time a step of the 2-stage graph, so load on a shared
-- machine falls on both alike; each side's best step counts. Prints the throughput ratio (ideal
-- with a 1/5 bubble: 1.6x) and each stage's compute busy fraction (forward and backward
-- streams) from the trace.
local flow = require "flow"
local utils = require "flow.utils"
local gpt = require "flow.gpt"

local args = utils.parse_args(arg, { layers = 4, dim = 256, heads = 8, seq = 128, batch = 8, vocab = 256, micro = 4,
                                     steps = 6, warmup = 2 })
if flow.world_size() ~= 2 then error("pipeline bench: run under mpirun -np 2 (2 stages)") end
local S, B = flow.sbp.split, flow.sbp.broadcast
local cfg = { vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers, n_head = args.heads, n_embd = args.dim }

local function graph_of(model, opt)
  return flow.nn.Graph { model = model, optimizer = opt, config = { grad_accumulation_steps = args.micro },
    build = function(self, x, y) local _, l = self.model(x, y); l:backward(); return l end }
end

local function step_time(G, x, y)
  local t0 = utils.now()
  G(x, y):item()
  return utils.now() - t0
end

flow.manual_seed(0)
local x = flow.randint(0, args.vocab, { args.batch, args.seq })
local y = flow.randint(0, args.vocab, { args.batch, args.seq })
local all = flow.placement("cpu", { 0, 1 })
local rank0 = flow.placement("cpu", { 0 })

-- the reference: one rank, local tensors, the same micro-batches
local one_G
if flow.rank() == 0 then
  flow.manual_seed(1)
  local m = gpt.GPT(cfg)
  one_G = graph_of(m, m:configure_optimizer({ lr = 1e-4 }))
end
local barrier = flow.ones({ 1 })

flow.manual_seed(1)
local model = gpt.GPT(cfg)
model:to_global(rank0, B)
local G = graph_of(model, model:configure_optimizer({ lr = 1e-4 }))
for _, st in ipairs(gpt.pipeline_stages(model, { rank0, flow.placement("cpu", { 1 }) })) do G:set_stage(st[1], st[2]) end
local gx, gy = x:to_global(all, B), y:to_global(all, B)

local one, two = math.huge, math.huge
for i = 1, args.warmup + args.steps do
  if one_G then
    local t = step_time(one_G, x, y)
    if i > args.warmup then one = math.min(one, t) end
  end
  barrier:to_global(all, B) -- rank 1 waits here for rank 0's reference step
  local t = step_time(G, gx, gy)
  if i > args.warmup then two = math.min(two, t) end
end

-- busy fraction of each rank's compute over one step, from the merged trace: the union of its
-- forward and backward compute streams' acts (the two overlap in time on one core)
local events = G:trace(nil, function() G(gx, gy):item() end)
local busy = {}
for r, s in ipairs(events) do
  local t0, t1, spans = math.huge, 0, {}
  for tid, ts, dur in s:gmatch('"tid":"([%a-]+)","ts":([%d.]+),"dur":([%d.]+)') do
    ts, dur = tonumber(ts), tonumber(dur)
    t0, t1 = math.min(t0, ts), math.max(t1, ts + dur)
    if tid == "compute" or tid == "compute-backward" then spans[#spans + 1] = { ts, ts + dur } end
  end
  table.sort(spans, function(a, b) return a[1] < b[1] end)
  local sum, reach = 0, -math.huge
  for _, sp in ipairs(spans) do
    if sp[2] > reach then
      sum = sum + sp[2] - math.max(sp[1], reach)
      reach = sp[2]
    end
  end
  busy[r] = t1 > t0 and sum / (t1 - t0) or 0
end

if flow.rank() == 0 then
  print(("pipeline bench: L=%d D=%d H=%d T=%d B=%d, %d micro-batches, 2 stages, OPENBLAS_NUM_THREADS=%s"):format(
    args.layers, args.dim, args.heads, args.seq, args.batch, args.micro, os.getenv("OPENBLAS_NUM_THREADS") or "unset"))
  print(("step: 1 rank %.1f ms, 2 stages %.1f ms -> throughput %.2fx (ideal with a 1/%d bubble %.2fx)"):format(
    one * 1000, two * 1000, one / two, args.micro + 1, 2 * args.micro / (args.micro + 1)))
  print(("compute stream busy over a step: stage 0 %.0f%%, stage 1 %.0f%%"):format(100 * busy[1], 100 * busy[2]))
end
