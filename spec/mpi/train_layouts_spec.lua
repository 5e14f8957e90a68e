-- GPT training under data, tensor and 2-D (dp x tp) layouts, expressed only through placement and
-- SBP annotations, gives the same losses as the 1-rank run (scripts/train_gpt.lua uses the same
-- annotations for --dp/--tp).
local flow = require "flow"
local gpt = require "flow.gpt"
local S, B = flow.sbp.split, flow.sbp.broadcast
local ws = flow.world_size()

local cfg = { vocab_size = 32, block_size = 8, n_layer = 2, n_head = 4, n_embd = 16 }
local STEPS = 20

-- Losses of STEPS AdamW steps; layout(model) returns the placement, the batch SBP and the
-- all-broadcast SBP, or nothing for the 1-rank run.
local function train(layout)
  flow.manual_seed(0)
  local model = gpt.GPT(cfg)
  local place, batch_sbp, whole
  if layout then place, batch_sbp, whole = layout(model) end
  local opt = model:configure_optimizer({ lr = 1e-2, weight_decay = 0.1 })
  flow.manual_seed(1)
  -- one fixed batch: the model memorises it, so the losses fall steadily
  local idx, tgt = flow.randint(0, 32, { 4, 8 }), flow.randint(0, 32, { 4, 8 })
  if place then
    idx = idx:to_global(place, whole):to_global(place, batch_sbp)
    tgt = tgt:to_global(place, whole):to_global(place, batch_sbp)
  end
  local losses = {}
  for step = 1, STEPS do
    local _, loss = model(idx, tgt)
    loss:backward()
    flow.optim.clip_grad_norm(model:parameters(), 1.0)
    opt:step()
    opt:zero_grad()
    losses[step] = loss:item()
  end
  return losses
end

local function ranks()
  local r = {}
  for i = 0, ws - 1 do r[#r + 1] = i end
  return r
end

local function assert_same_losses(want, got)
  for i = 1, STEPS do assert.near(want[i], got[i], 1e-4 * math.max(1, math.abs(want[i]))) end
end

describe("GPT training layouts #mpi", function()
  local reference = train(nil)

  it("losses fall on one rank (the reference is meaningful)", function()
    assert.is_true(reference[STEPS] < reference[1] - 0.2)
  end)

  it("data parallel: parameters B, batch S(0)", function()
    assert_same_losses(reference, train(function(model)
      local P = flow.placement("cpu", ranks())
      model:to_global(P, B)
      return P, S(0), B
    end))
  end)

  it("tensor parallel: Megatron-split Linear layers, batch B", function()
    assert_same_losses(reference, train(function(model)
      local P = flow.placement("cpu", ranks())
      model:to_global(P, gpt.tensor_parallel_sbp)
      if ws > 1 then assert.equal("S(0)", tostring(model.h[1].mlp.c_fc.weight.sbp)) end
      return P, B, B
    end))
  end)

  it("2-D mesh dp x tp: {B, Megatron} parameters, {S(0), B} batch", function()
    if ws % 2 ~= 0 then return pending("needs an even number of ranks") end
    local dp, tp = ws // 2, 2
    assert_same_losses(reference, train(function(model)
      local mesh = {}
      for i = 0, dp - 1 do mesh[i + 1] = { 2 * i, 2 * i + 1 } end
      local P = flow.placement("cpu", mesh)
      model:to_global(P, function(name) return { B, gpt.tensor_parallel_sbp(name) } end)
      return P, { S(0), B }, { B, B }
    end))
  end)
end)
