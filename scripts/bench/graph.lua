-- Graph mode against eager mode, the same GPT step (forward + backward + clipping + AdamW), in one run:
--   OPENBLAS_NUM_THREADS=1 flowlua scripts/bench/graph.lua [--layers 4 --dim 256 --heads 8 --seq 128
--                                                           --batch 8 --steps 10]
--   OPENBLAS_NUM_THREADS=1 mpirun -np 2 flowlua scripts/bench/graph.lua --dp 2
-- Prints step time (median of --steps after --warmup) and peak storage bytes during a step, for
-- eager and graph, and their ratios; with --dp N the batch is split over the ranks (data parallel:
-- in the graph the gradient all-reduces run on the collective stream while backward goes on).
-- Then the add-to-output fusion on and off, and activation checkpointing on every block. Last, the actor engine's own cost: µs per act on a chain of 1000 no-op actors.
local flow = require "flow"
local utils = require "flow.utils"
local gpt = require "flow.gpt"

local args = utils.parse_args(arg, { layers = 4, dim = 256, heads = 8, seq = 128, batch = 8, vocab = 256,
                                     steps = 10, warmup = 3, dp = 1 })
local S, B = flow.sbp.split, flow.sbp.broadcast
if args.dp ~= flow.world_size() then
  error(("graph bench: --dp %d must equal the number of ranks (%d)"):format(args.dp, flow.world_size()))
end

local function setup()
  flow.manual_seed(0)
  local model = gpt.GPT({ vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers, n_head = args.heads,
                          n_embd = args.dim })
  local opt = model:configure_optimizer({ lr = 1e-4, weight_decay = 0.1 })
  local x = flow.randint(0, args.vocab, { args.batch, args.seq })
  local y = flow.randint(0, args.vocab, { args.batch, args.seq })
  if args.dp > 1 then
    local ranks = {}
    for r = 0, args.dp - 1 do ranks[#ranks + 1] = r end
    local P = flow.placement("cpu", ranks)
    model:to_global(P, B)
    x, y = x:to_global(P, B):to_global(P, S(0)), y:to_global(P, B):to_global(P, S(0))
  end
  opt:init_state() -- both modes start with the optimizer state allocated
  return model, opt, x, y
end

local function measure(step)
  for _ = 1, args.warmup do step() end
  collectgarbage()
  flow._graph.memory(true) -- reset the high-water mark
  step()
  local use, peak = flow._graph.memory()
  local times = {}
  for i = 1, args.steps do
    local t0 = utils.now()
    step()
    times[i] = (utils.now() - t0) * 1000
  end
  table.sort(times)
  return times[(#times + 1) // 2], peak, use
end

local model, opt, x, y = setup()
local eager_ms, eager_peak = measure(function()
  local _, loss = model(x, y)
  loss:backward()
  flow.optim.clip_grad_norm(model:parameters(), 1.0)
  opt:step()
  opt:zero_grad()
  local l = loss:item()
  collectgarbage() -- free the step's tensors now, as train_gpt.lua does
  return l
end)

model, opt, x, y = setup()
local G = flow.nn.Graph { model = model, optimizer = opt, clip_grad_norm = 1.0,
  build = function(self, idx, tgt) local _, l = self.model(idx, tgt); l:backward(); return l end }
local graph_ms, graph_peak = measure(function() return G(x, y):item() end)
local mem, fused = G:memory(), G:stats().fused
-- each configuration's peak counts only its own plan: drop the one measured
local function drop() G, model, opt = nil, nil, nil; collectgarbage(); collectgarbage() end
drop()

-- the same graph without the add-to-output fusion
model, opt, x, y = setup()
local G2 = flow.nn.Graph { model = model, optimizer = opt, clip_grad_norm = 1.0, config = { allow_fuse_add_to_output = false },
  build = function(self, idx, tgt) local _, l = self.model(idx, tgt); l:backward(); return l end }
local unfused_ms = measure(function() return G2(x, y):item() end)
G2 = nil
drop()

-- the same graph with every block checkpointed (recomputed in backward)
model, opt, x, y = setup()
local G3 = flow.nn.Graph { model = model, optimizer = opt, clip_grad_norm = 1.0,
  build = function(self, idx, tgt) local _, l = self.model(idx, tgt); l:backward(); return l end }
for i = 1, #model.h do G3:set_activation_checkpointing(model.h[i]) end
local ckpt_ms, ckpt_peak = measure(function() return G3(x, y):item() end)
local ckpt_mem = G3:memory()
local params = model:num_parameters()
G3 = nil
drop()

local MB = 1 / 2 ^ 20
print(("graph bench: L=%d D=%d H=%d T=%d B=%d vocab=%d, %.2fM params, dp %d, OPENBLAS_NUM_THREADS=%s"):format(
  args.layers, args.dim, args.heads, args.seq, args.batch, args.vocab, params / 1e6, args.dp,
  os.getenv("OPENBLAS_NUM_THREADS") or "unset"))
print(("step ms (median of %d): eager %.1f, graph %.1f -> graph/eager %.2fx time"):format(args.steps, eager_ms, graph_ms,
  graph_ms / eager_ms))
print(("fusion add-to-output: %d adds write into their input's buffer; step %.1f ms fused, %.1f ms unfused -> %.3fx"):format(
  fused, graph_ms, unfused_ms, graph_ms / unfused_ms))
print(("peak storage during a step: eager %.1f MB, graph %.1f MB -> graph/eager %.2fx"):format(eager_peak * MB,
  graph_peak * MB, graph_peak / eager_peak))
print(("activation checkpointing (every block): arena %.1f MB vs %.1f MB -> %.2fx activation bytes; peak %.1f MB (%.2fx eager); step %.1f ms (%.2fx the graph without)"):format(
  ckpt_mem.arena * MB, mem.arena * MB, ckpt_mem.arena / mem.arena, ckpt_peak * MB, ckpt_peak / eager_peak, ckpt_ms, ckpt_ms / graph_ms))
print(("graph plan: arena %.1f MB (%.1f MB unpacked, %.1f MB alive at most), dedicated %.1f MB, captured %.1f MB; planned %.1f MB, measured %.1f MB"):format(
  mem.arena * MB, mem.unpacked * MB, mem.bound * MB, mem.dedicated * MB, mem.captured * MB, mem.planned * MB, mem.measured_peak * MB))

if flow.rank() == 0 and flow._actor_chain then
  local r = flow._actor_chain({ tasks = 1000, streams = 1, register_num = 1, pieces = 200 })
  print(("actor engine: %.2f us per act on a chain of 1000 no-op actors (one stream, %d acts)"):format(
    r.seconds / r.acts * 1e6, r.acts))
end
