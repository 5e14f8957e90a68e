-- Batch norm under data parallelism: with the batch split on dim 0, training statistics are the
-- whole batch's (SyncBatchNorm), so a conv net trained on N ranks gives the 1-rank losses, running
-- statistics and evaluation outputs.
local flow = require "flow"
local G = require "support.global"
local nn = flow.nn
local S, B = flow.sbp.split, flow.sbp.broadcast
local ws = flow.world_size()

local STEPS = 4

-- conv + bn + relu, a residual conv + bn, global average pooling and a linear layer
local Net = nn.class("BNNet", nn.Module)
function Net:__init()
  self.conv1 = nn.Conv2d(2, 6, 3, { padding = 1, bias = false })
  self.bn1 = nn.BatchNorm2d(6)
  self.conv2 = nn.Conv2d(6, 6, 3, { padding = 1, bias = false })
  self.bn2 = nn.BatchNorm2d(6)
  self.pool = nn.AvgPool2d(6)
  self.fc = nn.Linear(6, 5)
end
function Net:forward(x)
  local h = flow.relu(self.bn1(self.conv1(x)))
  h = flow.relu(self.bn2(self.conv2(h)) + h)
  h = self.pool(h)
  return self.fc(flow.reshape(h, { h:shape()[1], -1 }))
end

-- STEPS SGD steps on one batch of 8; returns the losses, the running statistics and the eval-mode
-- logits, all as plain Lua numbers. place: nil for the 1-rank run; graph: the steps run as an
-- nn.Graph (lazy mode) instead of eagerly.
local function train(place, graph)
  flow.manual_seed(0)
  local model = Net()
  if place then model:to_global(place, B) end
  local opt = flow.optim.SGD(model:parameters(), { lr = 0.1, momentum = 0.9 })
  flow.manual_seed(1)
  local x, y = flow.randn({ 8, 2, 6, 6 }) * 2 + 0.5, flow.randint(0, 5, { 8 })
  if place then
    x, y = G.global(x, place, S(0)), G.global(y, place, S(0))
  end
  local g = graph and nn.Graph { model = model, optimizer = opt, build = function(self, xb, yb)
    local loss = nn.functional.cross_entropy(self.model(xb), yb)
    loss:backward()
    return loss
  end }
  local losses = {}
  for step = 1, STEPS do
    if g then
      losses[step] = g(x, y):item()
    else
      local loss = nn.functional.cross_entropy(model(x), y)
      loss:backward()
      opt:step()
      opt:zero_grad()
      losses[step] = loss:item()
    end
  end
  local function whole(t) return t:totable() end -- a global tensor reads its logical value
  model:eval()
  local logits = flow.no_grad(function() return model(x) end)
  return losses, whole(model.bn1.running_mean), whole(model.bn2.running_var), whole(logits)
end

local function assert_near_lists(want, got, tol)
  assert.are.equal(#want, #got)
  for i = 1, #want do
    if type(want[i]) == "table" then assert_near_lists(want[i], got[i], tol)
    else assert.near(want[i], got[i], tol * math.max(1, math.abs(want[i]))) end
  end
end

describe("batch_norm data parallel #mpi", function()
  local losses, rmean, rvar, logits = train(nil)

  it("the 1-rank losses fall (the reference is meaningful)", function()
    assert.is_true(losses[STEPS] < losses[1] - 0.1)
  end)

  -- train(place, graph) gives the eager 1-rank run's losses, running statistics and eval outputs
  local function same_as_one_rank(place, graph)
    local l, m, v, o = train(place, graph)
    assert_near_lists(losses, l, 1e-5)
    assert_near_lists(rmean, m, 1e-5)
    assert_near_lists(rvar, v, 1e-5)
    assert_near_lists(logits, o, 1e-5)
  end

  it("batch S(0): the losses, running statistics and eval outputs of 1 rank", function()
    same_as_one_rank(flow.placement("cpu", G.all_ranks()))
  end)

  it("in graph mode, local tensors: the eager losses, running statistics and eval outputs", function()
    same_as_one_rank(nil, true)
  end)

  it("in graph mode, batch S(0): the 1-rank losses, running statistics and eval outputs", function()
    same_as_one_rank(flow.placement("cpu", G.all_ranks()), true)
  end)

  it("keeps the batch split: a training output is S(0), so the conv net runs on shards", function()
    local P = flow.placement("cpu", G.all_ranks())
    flow.manual_seed(0)
    local bn = nn.BatchNorm2d(3)
    bn:to_global(P, B)
    local x = G.global(flow.randn({ 4 * ws, 3, 2, 2 }), P, S(0))
    assert.are.equal("S(0)", tostring(bn(x).sbp))
    bn:eval()
    assert.are.equal("S(0)", tostring(bn(x).sbp))
  end)

  it("checks its inputs as the op does, naming batch_norm", function()
    local P = flow.placement("cpu", G.all_ranks())
    local x = G.global(flow.randn({ 2 * ws, 3, 2, 2 }), P, S(0))
    local w, b = flow.ones({ 4 }):to_global(P, B), flow.zeros({ 3 }):to_global(P, B)
    local rm, rv = flow.zeros({ 3 }):to_global(P, B), flow.ones({ 3 }):to_global(P, B)
    local ok, err = pcall(flow.batch_norm, x, w, b, rm, rv, { training = true })
    assert.is_false(ok)
    assert.matches("batch_norm: weight must have shape {3}", err)
  end)
end)
