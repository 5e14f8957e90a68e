-- Model-parallel vocabulary from SBP rules alone: an embedding table split on the vocabulary axis
-- (S(0), ids B -> P) and cross-entropy over logits split on the class axis (flow.parallel) equal
-- the 1-rank results, forward and backward; the GPT's tied wte is vocab-split under tensor_parallel_sbp.
local flow = require "flow"
local F = flow.nn.functional
local gpt = require "flow.gpt"
local S, B = flow.sbp.split, flow.sbp.broadcast
local ws = flow.world_size()
flow.set_check_consistency(true)

local ranks = {}
for i = 0, ws - 1 do ranks[#ranks + 1] = i end
local P = flow.placement("cpu", ranks)

local function global(full, sbp) return full:to_global(P, B):to_global(P, sbp) end
local function whole(g) return g:to_global(P, B):to_local() end
local flat = require("support.gradcheck").flat
local function assert_close(expected, actual, tol)
  local e, a = flat(expected:totable()), flat(actual:totable())
  assert.equal(#e, #a)
  for i = 1, #e do assert.near(e[i], a[i], tol or 1e-5) end
end

describe("vocab-parallel embedding #mpi", function()
  -- V = 7 does not divide evenly over 2 or 4 ranks: uneven shards
  flow.manual_seed(3)
  local w = flow.randn({ 7, 3 })
  local ids = flow.tensor({ { 0, 6, 3 }, { 2, 5, 1 }, { 6, 6, 4 } }, { dtype = "int64" })
  local g = flow.randn({ 3, 3, 3 })

  it("table S(0), ids B -> partial sums whose total is the 1-rank lookup, and an S(0) gradient", function()
    local w1 = w:detach():requires_grad_(true)
    local y1 = flow.embedding(ids, w1)
    flow.sum(y1 * g):backward()
    -- the hand lookup: row r of the output is w[ids[r]]
    local wt, it = w:totable(), ids:totable()
    local yt = y1:totable()
    for a = 1, 3 do for b = 1, 3 do for d = 1, 3 do assert.equal(wt[it[a][b] + 1][d], yt[a][b][d]) end end end

    local wg = global(w, S(0)):detach():requires_grad_(true)
    local y = flow.embedding(global(ids, B), wg)
    assert.equal("P", tostring(y.sbp))
    assert_close(y1, whole(y))
    flow.sum(y * global(g, B)):backward()
    assert.equal("S(0)", tostring(wg.grad.sbp))
    assert_close(w1.grad, whole(wg.grad))
  end)

  it("each rank's shard holds only the rows of its own ids", function()
    local y = flow.embedding(global(ids, B), global(w, S(0)))
    local mine = y:to_local():totable()
    local lo = 0
    for r = 0, flow.rank() - 1 do lo = lo + 7 // ws + (r < 7 % ws and 1 or 0) end
    local hi = lo + 7 // ws + (flow.rank() < 7 % ws and 1 or 0)
    local it, wt = ids:totable(), w:totable()
    for a = 1, 3 do
      for b = 1, 3 do
        local v = it[a][b]
        for d = 1, 3 do assert.equal((v >= lo and v < hi) and wt[v + 1][d] or 0, mine[a][b][d]) end
      end
    end
  end)

  it("ids out of the whole vocabulary are an error on every rank; a local call keeps its bounds check", function()
    local bad = flow.tensor({ 1, 7 }, { dtype = "int64" })
    assert.matches("embedding.*7 out of range %[0, 7%)", select(2, pcall(flow.embedding, global(bad, B), global(w, S(0)))))
    assert.matches("out of range %[0, 7%)", select(2, pcall(flow.embedding, bad, w)))
    assert.matches("out of range %[0, 7%)", select(2, pcall(flow.embedding, flow.tensor({ -1 }, { dtype = "int64" }), w)))
  end)
end)

describe("vocab-parallel cross-entropy #mpi", function()
  -- logits [3, 4, 7] (7 classes last) go to the loss as PyTorch's [N, C, d1] = [3, 7, 4]: a
  -- transposed view, so the class axis split S(2) is S(1) there
  local function classes_at_1(logits) return logits:transpose(1, 2) end
  flow.manual_seed(5)
  local x = flow.randn({ 3, 4, 7 }) * 3
  local t = flow.tensor({ { 0, 6, 3, -100 }, { 2, 5, 1, 4 }, { -100, 6, 0, 3 } }, { dtype = "int64" })
  local gnone = flow.randn({ 3, 4 })

  local function check(opts)
    local x1 = x:detach():requires_grad_(true)
    local l1 = F.cross_entropy(classes_at_1(x1), t, opts)
    local xg = global(x, S(2)):detach():requires_grad_(true)
    local lg = F.cross_entropy(classes_at_1(xg), global(t, B), opts)
    assert_close(l1, whole(lg))
    if opts.reduction == "none" then
      flow.sum(l1 * gnone):backward()
      flow.sum(lg * global(gnone, B)):backward()
    else
      l1:backward()
      lg:backward()
    end
    assert.equal("S(2)", tostring(xg.grad.sbp))
    assert_close(x1.grad, whole(xg.grad))
    return l1
  end

  it("mean over the targets not ignored, with its gradient", function()
    local l = check({})
    -- by hand: -log softmax at the target, averaged over the 10 rows not ignored
    local xt, tt, sum = x:totable(), t:totable(), 0
    for a = 1, 3 do
      for b = 1, 4 do
        if tt[a][b] ~= -100 then
          local row, m, z = xt[a][b], -math.huge, 0
          for c = 1, 7 do m = math.max(m, row[c]) end
          for c = 1, 7 do z = z + math.exp(row[c] - m) end
          sum = sum + math.log(z) + m - row[tt[a][b] + 1]
        end
      end
    end
    assert.near(sum / 10, l:item(), 1e-5)
  end)
  it("sum", function() check({ reduction = "sum" }) end)
  it("none (ignored rows are 0)", function()
    local l = check({ reduction = "none" })
    assert.equal(0, l:totable()[1][4])
  end)
  it("another ignore_index", function()
    t = flow.where(flow.eq(t, -100), flow.full_like(t, 6), t)
    check({ ignore_index = 6 })
    t = flow.where(flow.eq(t, 6), flow.full_like(t, -100), t)
  end)
  it("a target out of range is an error, as on one rank", function()
    local bad = flow.tensor({ { 1, 7 } }, { dtype = "int64" })
    local x2 = flow.randn({ 1, 2, 7 })
    local want = select(2, pcall(F.cross_entropy, classes_at_1(x2), bad))
    assert.matches("target 7 is out of range for 7 classes", want)
    assert.matches("cross_entropy: target 7 is out of range for 7 classes", select(2, pcall(F.cross_entropy, classes_at_1(global(x2, S(2))), global(bad, B))))
  end)
  it("a bad reduction names the op", function()
    assert.matches("cross_entropy: reduction", select(2, pcall(F.cross_entropy, classes_at_1(global(x, S(2))), global(t, B), { reduction = "avg" })))
  end)
  it("the logits are never gathered: only the small per-row tensors move", function()
    local big = flow.randn({ 2, 3, 64 })
    local trace = flow.explain(function() return F.cross_entropy(classes_at_1(global(big, S(2))), global(flow.randint(0, 64, { 2, 3 }), B)) end)
    if ws > 1 then assert.matches("all%-to%-all", trace) end
    assert.is_nil(trace:match("{2,3,64} S%(2%) %-> B"))
    assert.is_nil(trace:match("input %d: S%(2%) %-> B"))
  end)
end)

describe("vocab-parallel GPT #mpi", function()
  -- a vocabulary much larger than the batch's tokens (as in GPT-2): gathering the activations
  -- costs less than moving the table, so the logits come out vocab-split
  local cfg = { vocab_size = 128, block_size = 8, n_layer = 1, n_head = 4, n_embd = 16 }
  it("tensor_parallel_sbp splits the tied wte on the vocabulary; logits, loss and gradients equal 1 rank", function()
    assert.equal("S(0)", tostring(gpt.tensor_parallel_sbp("wte.weight")))
    assert.equal("B", tostring(gpt.tensor_parallel_sbp("wpe.weight")))
    flow.manual_seed(0)
    local ref = gpt.GPT(cfg)
    flow.manual_seed(0)
    local model = gpt.GPT(cfg)
    model:to_global(P, gpt.tensor_parallel_sbp)
    flow.manual_seed(1)
    local idx, tgt = flow.randint(0, 128, { 4, 4 }), flow.randint(0, 128, { 4, 4 })
    local l1, loss1 = ref(idx, tgt)
    loss1:backward()
    local lg, loss = model(global(idx, B), global(tgt, B))
    loss:backward()
    if ws > 1 then
      assert.equal("S(0)", tostring(model.wte.weight.sbp))
      assert.equal("S(2)", tostring(lg.sbp))
      assert.equal("S(0)", tostring(model.wte.weight.grad.sbp))
    end
    assert_close(l1, whole(lg))
    assert.near(loss1:item(), loss:item(), 1e-5)
    assert_close(ref.wte.weight.grad, whole(model.wte.weight.grad))
  end)

  it("AdamW training with the vocab-split table gives the 1-rank losses", function()
    local function train(place)
      flow.manual_seed(0)
      local model = gpt.GPT(cfg)
      if place then model:to_global(place, gpt.tensor_parallel_sbp) end
      local opt = model:configure_optimizer({ lr = 1e-2, weight_decay = 0.1 })
      flow.manual_seed(1)
      local idx, tgt = flow.randint(0, 128, { 4, 4 }), flow.randint(0, 128, { 4, 4 })
      if place then idx, tgt = global(idx, B), global(tgt, B) end
      local losses = {}
      for step = 1, 5 do
        local _, loss = model(idx, tgt)
        loss:backward()
        flow.optim.clip_grad_norm(model:parameters(), 1.0)
        opt:step()
        opt:zero_grad()
        losses[step] = loss:item()
      end
      return losses
    end
    local want, got = train(nil), train(P)
    assert.is_true(want[5] < want[1])
    for i = 1, 5 do assert.near(want[i], got[i], 1e-4) end
  end)
end)
