-- Eager global ops under mpirun: each result equals the same op on the whole (1-rank) tensor, with
-- the SBP the signature rules give; gradients flow through boxing; ranks that disagree get an error.
local flow = require "flow"
local GL = require "support.global"
local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
local ws, me = flow.world_size(), flow.rank()
flow.set_check_consistency(true)

local ranks = {}
for i = 0, ws - 1 do ranks[#ranks + 1] = i end
local P = flow.placement("cpu", ranks)

local global, whole = GL.global, GL.whole
local flat = require("support.gradcheck").flat
local function assert_close(expected, actual, tol)
  local e, a = flat(expected:totable()), flat(actual:totable())
  assert.equal(#e, #a)
  for i = 1, #e do
    if math.abs(e[i] - a[i]) > (tol or 1e-5) * (1 + math.abs(e[i])) then
      error(("element %d: expected %g, got %g"):format(i, e[i], a[i]), 2)
    end
  end
end
local function randn(shape)
  flow.manual_seed(1234)
  return flow.randn(shape)
end

describe("elementwise SBP", function()
  it("S(0) + B bias broadcast gives S(0)", function()
    local x, b = randn({ 6, 4 }), flow.arange(0, 4):float()
    local y = global(x, P, S(0)) + global(b, P, B)
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(x + b, whole(y))
  end)

  it("P + P stays partial and sums right", function()
    local x = randn({ 3, 5 })
    local y = global(x, P, PS) + global(x, P, PS)
    assert.equal("P", tostring(y.sbp))
    assert_close(x * 2, whole(y))
  end)

  it("P * B stays partial", function()
    local x, w = randn({ 3, 5 }), flow.arange(0, 15):float():view({ 3, 5 })
    local y = global(x, P, PS) * global(w, P, B)
    assert.equal("P", tostring(y.sbp))
    assert_close(x * w, whole(y))
  end)

  it("P + a number stays partial: the number is counted once (rank 0 keeps it, the others add 0)", function()
    local x = randn({ 4 })
    local y = global(x, P, PS) + 1
    if ws > 1 then assert.equal("P", tostring(y.sbp)) end -- one rank: every signature is free
    assert_close(x + 1, whole(y))
  end)

  it("S(1) * S(0) boxes one side", function()
    local x = randn({ 4, 6 })
    local y = global(x, P, S(1)) * global(x, P, S(0))
    assert_close(x * x, whole(y))
  end)
end)

describe("dropout SBP", function()
  it("each shard draws its own slice of the same mask", function()
    local x = randn({ 6, 5 })
    local gx = global(x, P, S(1))
    flow.manual_seed(7)
    local expect = flow.dropout(x, 0.5)
    flow.manual_seed(7)
    local y = flow.dropout(gx, 0.5)
    assert.equal("S(1)", tostring(y.sbp))
    assert_close(expect, whole(y))
  end)
end)

describe("matmul SBP", function()
  local a, w = randn({ 6, 5 }), flow.arange(0, 15):float():view({ 5, 3 }) / 10
  local expect = flow.matmul(a, w)
  it("S(0) x B gives S(0)", function()
    local y = flow.matmul(global(a, P, S(0)), global(w, P, B))
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(expect, whole(y), 1e-4)
  end)
  it("B x S(1) gives S(1)", function()
    local y = flow.matmul(global(a, P, B), global(w, P, S(1)))
    assert.equal("S(1)", tostring(y.sbp))
    assert_close(expect, whole(y), 1e-4)
  end)
  it("S(1) x S(0) gives P", function()
    local y = flow.matmul(global(a, P, S(1)), global(w, P, S(0)))
    assert.equal(ws > 1 and "P" or "P", tostring(y.sbp))
    assert_close(expect, whole(y), 1e-4)
  end)
  it("transposed operands move the split axes", function()
    local y = flow.matmul(global(a:transpose(0, 1):contiguous(), P, S(1)), global(w, P, B), { transpose_a = true })
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(expect, whole(y), 1e-4)
  end)
end)

describe("bfloat16 shards (the CPU computes them in float32, rounding each result once)", function()
  local a, w = randn({ 6, 5 }):to("bfloat16"), (flow.arange(0, 15):float():view({ 5, 3 }) / 10):to("bfloat16")
  local expect = flow.matmul(a, w)
  it("S(0) x B gives the 1-rank rows, bit for bit", function()
    local y = flow.matmul(global(a, P, S(0)), global(w, P, B))
    assert.equal("bfloat16", y.dtype)
    assert_close(expect:float(), whole(y):float(), 0)
  end)
  it("S(1) x S(0) gives P, summed across ranks in bfloat16", function()
    local y = flow.matmul(global(a, P, S(1)), global(w, P, S(0)))
    assert.equal("P", tostring(y.sbp))
    -- each rank's partial product and each sum of two is rounded to bfloat16 (8 bits)
    assert_close(expect:float(), whole(y):float(), 2 ^ -6)
  end)
  it("a sum over the split axis and its gradient", function()
    local x = global(a, P, S(0)):detach():requires_grad_(true)
    local s = (x * x):sum(0)
    assert_close((a:float() * a:float()):to("bfloat16"):float():sum(0), whole(s):float(), 2 ^ -6)
    s:sum():backward()
    assert.equal("bfloat16", x.grad.dtype)
    assert_close((a:float() * 2):to("bfloat16"):float(), whole(x.grad):float(), 0)
  end)
end)

describe("linear SBP", function()
  local F = flow.nn.functional
  -- y = x W^T + b: 5 rows, 3 in and 6 out features, so splits are uneven at 2 and 4 ranks
  local x0, w0, b0 = randn({ 5, 3 }), flow.arange(0, 18):float():view({ 6, 3 }) / 10 - 0.8, flow.arange(0, 6):float() / 4
  local r = flow.arange(0, 30):float():view({ 5, 6 }) / 30 - 0.5
  local function reference()
    local x, w, b = x0:detach():requires_grad_(true), w0:detach():requires_grad_(true), b0:detach():requires_grad_(true)
    local y = flow.matmul(x, w, { transpose_b = true }) + b
    flow.sum(y * r):backward()
    return y, { x.grad, w.grad, b.grad }
  end
  local expect, grads = reference()
  for _, c in ipairs({
    { "S(0), B, B gives S(0): rows split", { S(0), B, B }, "S(0)" },
    { "B, S(0), S(0) gives S(1): out features split", { B, S(0), S(0) }, "S(1)" },
    { "S(1), S(1), B gives P: in features split, the broadcast bias counted once", { S(1), S(1), B }, "P" },
    { "S(1), S(1), P gives P", { S(1), S(1), PS }, "P" },
    { "P, B, P gives P", { PS, B, PS }, "P" },
    { "B, P, P gives P", { B, PS, PS }, "P" },
  }) do
    it(c[1] .. ", values and gradients equal the 1-rank ones", function()
      local ins = {}
      for i, t in ipairs({ x0, w0, b0 }) do ins[i] = global(t, P, c[2][i]):detach():requires_grad_(true) end
      local y = F.linear(ins[1], ins[2], ins[3])
      if ws > 1 then assert.equal(c[3], tostring(y.sbp)) end -- one rank: every signature is free
      assert_close(expect, whole(y), 1e-5)
      flow.sum(y * global(r, P, B)):backward()
      for i = 1, 3 do
        assert.equal(tostring(c[2][i]), tostring(ins[i].grad.sbp))
        assert_close(grads[i], whole(ins[i].grad), 1e-5)
      end
    end)
  end
  it("a 3-d input is folded into rows and keeps its batch split", function()
    local x3 = randn({ 4, 3, 3 })
    local y = F.linear(global(x3, P, S(0)), global(w0, P, B), global(b0, P, B))
    assert.same({ 4, 3, 6 }, y:shape())
    assert_close(flow.matmul(x3, w0, { transpose_b = true }) + b0, whole(y), 1e-5)
  end)
  it("runs the linear op under its own rule", function()
    local text = flow.explain(function()
      return F.linear(global(x0, P, S(1)), global(w0, P, S(1)), global(b0, P, B))
    end)
    assert.matches("signature [linear]", text, 1, true)
    assert.not_matches("matmul(", text, 1, true)
  end)
end)

describe("reductions and normalisations", function()
  local x = randn({ 6, 4 })
  it("sum over the split axis gives P", function()
    local y = flow.sum(global(x, P, S(0)), 0)
    assert.equal("P", tostring(y.sbp))
    assert_close(flow.sum(x, 0), whole(y), 1e-4)
  end)
  it("sum over a kept axis stays split", function()
    local y = flow.sum(global(x, P, S(0)), 1)
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(flow.sum(x, 1), whole(y), 1e-4)
  end)
  it("sum of everything of a split tensor", function()
    local y = flow.sum(global(x, P, S(1)))
    assert_close(flow.sum(x), whole(y), 1e-4)
  end)
  it("softmax over the last axis keeps S(0)", function()
    local y = flow.softmax(global(x, P, S(0)), -1)
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(flow.softmax(x, -1), whole(y))
  end)
  it("softmax over the split axis boxes it away", function()
    local y = flow.softmax(global(x, P, S(0)), 0)
    assert.not_equal("S(0)", tostring(y.sbp))
    assert_close(flow.softmax(x, 0), whole(y))
  end)
  it("layer_norm splits rows, weight broadcast", function()
    local wt, bs = flow.arange(1, 5):float(), flow.arange(0, 4):float()
    local y = flow.layer_norm(global(x, P, S(0)), global(wt, P, B), global(bs, P, B))
    assert.equal("S(0)", tostring(y.sbp))
    assert_close(flow.layer_norm(x, wt, bs), whole(y), 1e-4)
  end)
end)

describe("cross-entropy SBP", function()
  local logits0 = randn({ 6, 5 })
  local target0 = flow.tensor({ 0, 4, -100, 2, 1, -100 })
  for _, red in ipairs({ "mean", "sum", "none" }) do
    it(("rows split, reduction %s, with ignored targets, forward and backward"):format(red), function()
      local x = global(logits0, P, S(0)):detach():requires_grad_(true)
      local loss = flow.cross_entropy(x, global(target0, P, S(0)), { reduction = red })
      local xl = logits0:detach():requires_grad_(true)
      local ll = flow.cross_entropy(xl, target0, { reduction = red })
      assert_close(ll, whole(loss), 1e-5)
      if red == "none" then assert.equal("S(0)", tostring(loss.sbp)) end
      flow.sum(loss):backward()
      flow.sum(ll):backward()
      assert.equal("S(0)", tostring(x.grad.sbp))
      assert_close(xl.grad, whole(x.grad), 1e-5)
    end)
  end
end)

describe("cross-entropy mean over global rows", function()
  -- [2, 5, 4] logits split on axis 1 (uneven at 2 and 4 ranks); ignore_index 3 leaves the last
  -- rows of the second sample without a target, so some shards count fewer targets than others.
  -- The loss takes them as PyTorch does, classes at axis 1: [2, 4, 5] (a transposed view).
  local logits0 = randn({ 2, 5, 4 })
  local target0 = flow.tensor({ { 0, 3, 2, 1, 3 }, { 1, 2, 0, 3, 3 } })
  for _, sbp in ipairs({ S(0), S(1) }) do
    it(("divides the sum by the global count of targets not ignored (rows %s)"):format(tostring(sbp)), function()
      local x = global(logits0, P, sbp):detach():requires_grad_(true)
      local loss = flow.cross_entropy(x:transpose(1, 2), global(target0, P, sbp), { ignore_index = 3 })
      local xl = logits0:detach():requires_grad_(true)
      local ll = flow.cross_entropy(xl:transpose(1, 2), target0, { ignore_index = 3 })
      assert_close(ll, whole(loss), 1e-5)
      loss:backward()
      ll:backward()
      assert_close(xl.grad, whole(x.grad), 1e-5)
    end)
  end
  it("keeps the logits split: the loss op runs on shards", function()
    local x, t = global(logits0, P, S(0)), global(target0, P, S(0))
    local text = flow.explain(function() return flow.cross_entropy(x:transpose(1, 2), t, { ignore_index = 3 }) end)
    if ws > 1 then assert.matches("signature [cross_entropy]: S(0), S(0) ->", text, 1, true) end
  end)
  it("takes a whole tensor through the fused mean when called with its flags (no split signature)", function()
    local CE_MEAN = (1 << 16) | (1 << 17)
    local sigs = flow._signatures("cross_entropy", { flags = CE_MEAN }, logits0, target0)
    assert.equal(1, #sigs)
  end)
end)

describe("global autograd", function()
  it("a broadcast weight gets the all-reduced gradient (data parallel)", function()
    local x, w0 = randn({ 8, 5 }), flow.arange(0, 15):float():view({ 5, 3 }) / 10
    local w = global(w0, P, B):detach():requires_grad_(true)
    local loss = flow.sum(flow.matmul(global(x, P, S(0)), w))
    loss:backward()
    assert.equal("B", tostring(w.grad.sbp))
    local wl = w0:detach():requires_grad_(true)
    flow.sum(flow.matmul(x, wl)):backward()
    assert_close(wl.grad, w.grad:to_local(), 1e-4)
  end)

  it("gradients flow back through to_global to the local source", function()
    local x = randn({ 4, 3 }):requires_grad_(true)
    local g = x:to_global(P, B):to_global(P, S(0))
    flow.sum(g * g):backward()
    assert_close(x * 2, x.grad, 1e-5)
  end)

  it("a split leaf gets a split gradient", function()
    local x0 = randn({ 6, 2 })
    local x = global(x0, P, S(0)):detach():requires_grad_(true)
    flow.sum(flow.softmax(x, -1) * global(x0, P, B)):backward()
    local xl = x0:detach():requires_grad_(true)
    flow.sum(flow.softmax(xl, -1) * x0):backward()
    assert.equal("S(0)", tostring(x.grad.sbp))
    assert_close(xl.grad, whole(x.grad), 1e-4)
  end)
end)

describe("reading global values", function()
  it("item and totable give the logical value whatever the SBP", function()
    local x = randn({ 4, 3 })
    assert.near(flow.sum(x):item(), flow.sum(global(x, P, S(0))):item(), 1e-4)
    assert.equal("P", tostring(flow.sum(global(x, P, S(0))).sbp))
    assert_close(x, flow.tensor(global(x, P, S(1)):totable()))
    assert_close(x, flow.tensor(global(x, P, PS):totable()))
  end)
end)

describe("creation like a global tensor", function()
  it("zeros_like keeps placement and SBP; ones_like of a partial tensor is broadcast", function()
    local x = global(randn({ 5, 2 }), P, S(0))
    local z = flow.zeros_like(x)
    assert.equal("S(0)", tostring(z.sbp))
    assert.same({ 5, 2 }, z:shape())
    assert.same(x:to_local():shape(), z:to_local():shape())
    local o = flow.ones_like(global(randn({ 3 }), P, PS))
    assert.equal("B", tostring(o.sbp))
    assert.same({ 1, 1, 1 }, whole(o):totable())
    assert.same({ { 3, 3 }, { 3, 3 } }, whole(flow.full_like(global(randn({ 2, 2 }), P, S(1)), 3)):totable())
  end)
  it("adamw_ on split parameters updates the split moments in place", function()
    local p0, g0 = randn({ 6 }), flow.arange(0, 6):float() / 6
    local pg = global(p0, P, S(0))
    local m, v = flow.zeros_like(pg), flow.zeros_like(pg)
    flow.adamw_(pg, global(g0, P, B), m, v, { lr = 0.1, step = 1 })
    local pl, ml, vl = p0:clone(), flow.zeros({ 6 }), flow.zeros({ 6 })
    flow.adamw_(pl, g0, ml, vl, { lr = 0.1, step = 1 })
    assert_close(pl, whole(pg))
    assert_close(ml, whole(m))
    assert_close(vl, whole(v))
  end)

  it("an in-place update of a split tensor writes its own shard", function()
    local x = global(flow.zeros({ 6 }), P, S(0))
    x:add_(global(flow.arange(0, 6):float(), P, S(0)))
    assert.same({ 0, 1, 2, 3, 4, 5 }, whole(x):totable())
  end)
end)

describe("global errors", function()
  it("ranks calling different ops get an error on every rank", function()
    if ws == 1 then return end
    local x = global(randn({ 4 }), P, S(0))
    local ok, err = pcall(function() if me == 0 then return x + x else return x * x end end)
    assert.is_false(ok)
    assert.matches("%[rank %d+%] %a+: ranks disagree", err)
  end)

  it("ranks asking for different boxings get an error on every rank", function()
    if ws == 1 then return end
    local x = global(randn({ 4 }), P, S(0))
    local ok, err = pcall(function() return x:to_global(P, me == 0 and B or PS) end)
    assert.is_false(ok)
    assert.matches("to_global: ranks disagree", err)
  end)

  it("inputs on different placements are refused", function()
    local P0 = flow.placement("cpu", { 0 })
    if ws == 1 then return end
    local ok, err = pcall(function() return global(randn({ 2 }), P, B) + global(randn({ 2 }), P0, B) end)
    if me == 0 then
      assert.is_false(ok)
      assert.matches("different placements", err)
    end
  end)

  it("shape errors name the rank and the op with logical shapes", function()
    local ok, err = pcall(flow.matmul, global(randn({ 4, 3 }), P, S(0)), global(randn({ 4, 3 }), P, B))
    assert.is_false(ok)
    assert.matches("%[rank %d+%] matmul: .*{4,3}", err)
  end)
end)

describe("explain for ops", function()
  it("shows the signature and the boxing each op ran", function()
    local a, w = global(randn({ 4, 6 }), P, S(1)), global(randn({ 6, 2 }), P, B)
    local text, y = flow.explain(function() return flow.matmul(a, w) end)
    assert.matches("matmul%(", text)
    assert.matches("signature %[matmul%]", text)
    assert.same({ 4, 2 }, y:shape())
  end)
end)

describe("2-D mesh ops", function()
  if ws ~= 4 then return end
  local P2 = flow.placement("cpu", { { 0, 1 }, { 2, 3 } })
  it("(S(0), B) x (B, S(1)) gives (S(0), S(1))", function()
    local a, w = randn({ 6, 5 }), flow.arange(0, 20):float():view({ 5, 4 }) / 10
    local y = flow.matmul(global(a, P2, { S(0), B }), global(w, P2, { B, S(1) }))
    assert.equal("S(0)", tostring(y.sbp[1]))
    assert.equal("S(1)", tostring(y.sbp[2]))
    assert_close(flow.matmul(a, w), whole(y), 1e-4)
  end)
  it("data x tensor parallel gradient of a (B, S(1)) weight", function()
    local a, w0 = randn({ 4, 5 }), flow.arange(0, 20):float():view({ 5, 4 }) / 10
    local w = global(w0, P2, { B, S(1) }):detach():requires_grad_(true)
    flow.sum(flow.matmul(global(a, P2, { S(0), B }), w)):backward()
    local wl = w0:detach():requires_grad_(true)
    flow.sum(flow.matmul(a, wl)):backward()
    assert.equal("B", tostring(w.grad.sbp[1]))
    assert_close(wl.grad, whole(w.grad), 1e-4)
  end)
end)

describe("between placements", function()
  if ws < 2 then return end
  local P0, P1 = flow.placement("cpu", { 0 }), flow.placement("cpu", { 1 })
  it("a tensor moves from stage 0 to stage 1 and its gradient comes back", function()
    local full = randn({ 5, 3 })
    local x = global(full, P, B):to_global(P0, B):detach():requires_grad_(true)
    assert.same(me == 0 and { 5, 3 } or { 0, 0 }, x:to_local():shape())
    local y = x:to_global(P1, S(0))
    assert.same({ 5, 3 }, y:shape())
    assert.equal(me == 1 and 5 or 0, y:to_local():shape()[1])
    local loss = flow.sum(y * y)
    loss:backward()
    assert_close(full * 2, whole(x.grad:to_global(P, B)), 1e-5)
  end)
  it("ops on a placement without this rank only carry metadata", function()
    local y = global(randn({ 4, 2 }), P, B):to_global(P1, S(0))
    local h = flow.matmul(y, flow.ones({ 2, 3 }, { placement = P1, sbp = B }))
    assert.same({ 4, 3 }, h:shape())
    assert.equal("S(0)", tostring(h.sbp))
    assert_close(flow.matmul(randn({ 4, 2 }), flow.ones({ 2, 3 })), whole(h:to_global(P, B)), 1e-5)
  end)
  it("explain names the transfer", function()
    local x = global(randn({ 2 }), P, B):to_global(P0, B)
    assert.matches("between placements cpu{0} %-> cpu{1}", flow.explain(x, P1, B))
  end)
end)

describe("data parallel training", function()
  it("five AdamW steps on batch-split data match the 1-rank run", function()
    local nn, optim, F = flow.nn, flow.optim, flow.nn.functional
    local function train(global_)
      flow.manual_seed(0)
      local model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
      if global_ then model:to_global(P, B) end
      local opt = optim.AdamW(model:parameters(), { lr = 1e-2, weight_decay = 0.1 })
      flow.manual_seed(1)
      local x, t = flow.randn({ 8, 8 }), flow.randint(0, 4, { 8 })
      if global_ then x, t = global(x, P, S(0)), global(t, P, S(0)) end
      local loss
      for _ = 1, 5 do
        loss = F.cross_entropy(model(x), t)
        loss:backward()
        opt:step()
        opt:zero_grad()
      end
      return global_ and whole(loss):item() or loss:item()
    end
    assert.near(train(false), train(true), 1e-5)
  end)

  it("a small GPT trained on batch-split tokens matches the 1-rank run", function()
    local gpt = require "flow.gpt"
    local function train(global_)
      flow.manual_seed(0)
      local model = gpt.GPT({ vocab_size = 32, block_size = 8, n_layer = 1, n_head = 2, n_embd = 16 })
      if global_ then model:to_global(P, B) end
      local opt = flow.optim.AdamW(model:parameters(), { lr = 1e-2 })
      flow.manual_seed(1)
      local idx, tgt = flow.randint(0, 32, { 4, 8 }), flow.randint(0, 32, { 4, 8 })
      if global_ then idx, tgt = global(idx, P, S(0)), global(tgt, P, S(0)) end
      local loss
      for _ = 1, 2 do
        local _, l = model(idx, tgt)
        l:backward()
        opt:step()
        opt:zero_grad()
        loss = l:item()
      end
      return loss
    end
    assert.near(train(false), train(true), 1e-5)
  end)
end)

describe("tensor parallel MLP", function()
  it("column- then row-split weights give a partial output and split gradients", function()
    local x0, w10, w20 = randn({ 4, 6 }), flow.arange(0, 48):float():view({ 6, 8 }) / 50, flow.arange(0, 40):float():view({ 8, 5 }) / 40
    local w1 = global(w10, P, S(1)):detach():requires_grad_(true)
    local w2 = global(w20, P, S(0)):detach():requires_grad_(true)
    local y = flow.matmul(flow.gelu(flow.matmul(global(x0, P, B), w1)), w2)
    if ws > 1 then assert.equal("P", tostring(y.sbp)) end
    flow.sum(y * y):backward()
    local l1, l2 = w10:detach():requires_grad_(true), w20:detach():requires_grad_(true)
    local yl = flow.matmul(flow.gelu(flow.matmul(x0, l1)), l2)
    flow.sum(yl * yl):backward()
    assert_close(yl, whole(y), 1e-4)
    assert.equal("S(1)", tostring(w1.grad.sbp))
    assert.equal("S(0)", tostring(w2.grad.sbp))
    assert_close(l1.grad, whole(w1.grad), 1e-4)
    assert_close(l2.grad, whole(w2.grad), 1e-4)
  end)
end)
