-- Under bf16 autocast the CPU rounds each GEMM operand to bf16 once per autocast region and keeps
-- the copy for the GEMMs after it that read the same values (a weight in forward and backward, an
-- activation again for its weight's gradient). Attention rounds q, k, v per head itself
-- (attention_bf16_spec); its cases here hold it to the same rules. The copy must never outlive
-- the values: an in-place op or an optimizer step bumps the storage's version, and a new autocast
-- region starts afresh. "Uncached" below means the same GEMM on a clone (a new storage, so a
-- fresh rounding) or in a region of its own: the bits must be equal, not just close.
local flow = require "flow"
local F = flow.nn.functional

local native = flow._bench.onednn().bf16

local function bf16(fn) return flow.autocast("bfloat16", fn) end

-- max |a - b|
local function diff(a, b) return (a:double() - b:double()):abs():max():item() end

-- x rounded to bf16 (round to nearest even) and back to float32
local function rounded(x) return x:bfloat16():float() end

-- it(), pending where autocast runs float32 (no AVX512-BF16, or FLOW_NO_BF16 set)
local function it_bf16(name, fn)
  it(name, function()
    if not native then return pending("this CPU has no AVX512-BF16 (or FLOW_NO_BF16 is set): autocast runs float32") end
    fn()
  end)
end

describe("the bf16 cache of GEMM operands", function()
  it_bf16("rounds operands as a bf16 cast does and accumulates in float32", function()
    flow.manual_seed(11)
    local a, b = flow.randn({ 37, 70 }), flow.randn({ 70, 29 })
    local y = bf16(function() return flow.matmul(a, b) end)
    local ref = flow.matmul(rounded(a), rounded(b))
    assert.is_true(diff(y, ref) < 1e-4, diff(y, ref))
    -- and really in bf16: the float32 product differs by far more than the accumulation order does
    assert.is_true(diff(y, flow.matmul(a, b)) > 1e-3)
  end)

  it_bf16("reads a weight through its copy in forward and backward, with the uncached results", function()
    flow.manual_seed(12)
    local x, w, b = flow.randn({ 24, 40 }), flow.randn({ 33, 40 }):requires_grad_(true), flow.randn({ 33 })
    local xr, g = x:clone():requires_grad_(true), flow.randn({ 24, 33 })
    local y
    bf16(function()
      y = F.linear(xr, w, b)
      flow.sum(y * g):backward()   -- the output's gradient is g exactly
    end)
    -- each GEMM alone, in a region of its own, on clones
    local y1 = bf16(function() return F.linear(x:clone(), w:detach():clone(), b) end)
    local dx = bf16(function() return flow.matmul(g:clone(), w:detach():clone()) end)
    local dw = bf16(function() return flow.matmul(g:clone(), x:clone(), { transpose_a = true }) end)
    assert.are.equal(0, diff(y, y1))
    assert.are.equal(0, diff(xr.grad, dx))
    assert.are.equal(0, diff(w.grad, dw))
  end)

  it_bf16("uses a weight's new values after an in-place op in the same region", function()
    flow.manual_seed(13)
    local x, w = flow.randn({ 16, 32 }), flow.randn({ 32, 8 })
    local before, after, fresh = bf16(function()
      local y0 = flow.matmul(x, w)
      w:mul_(3):add_(0.5)
      return y0, flow.matmul(x, w), flow.matmul(x, w:clone())
    end)
    assert.are.equal(0, diff(after, fresh))
    assert.is_true(diff(after, before) > 1)
  end)

  it_bf16("sees a write through another view of the same storage", function()
    flow.manual_seed(14)
    local big = flow.randn({ 64, 32 })
    local w = big:narrow(0, 0, 32)
    local x = flow.randn({ 8, 32 })
    local after, fresh = bf16(function()
      flow.matmul(x, w)
      big:narrow(0, 16, 16):fill_(2)   -- rows 16..31 of w, through another view
      return flow.matmul(x, w), flow.matmul(x, w:clone())
    end)
    assert.are.equal(0, diff(after, fresh))
  end)

  it_bf16("uses the weights an optimizer step wrote, inside one autocast region", function()
    flow.manual_seed(15)
    local model = flow.nn.Linear(20, 12)
    local opt = flow.optim.AdamW(model:parameters(), { lr = 0.1 })
    local x = flow.randn({ 10, 20 })
    local y0, y1 = bf16(function()
      local y = model(x)
      y:sum():backward()
      opt:step()
      return y:detach(), model(x):detach()
    end)
    local fresh = bf16(function() return F.linear(x, model.weight:detach():clone(), model.bias:detach()) end)
    assert.are.equal(0, diff(y1, fresh))
    assert.is_true(diff(y1, y0) > 0.05)
  end)

  it_bf16("gives attention the new q after an in-place op, and the uncached backward", function()
    flow.manual_seed(16)
    local q, k, v = flow.randn({ 2, 3, 70, 16 }), flow.randn({ 2, 3, 70, 16 }), flow.randn({ 2, 3, 70, 8 })
    local after, fresh = bf16(function()
      F.scaled_dot_product_attention(q, k, v, { causal = true })
      q:mul_(-2)
      return F.scaled_dot_product_attention(q, k, v, { causal = true }),
        F.scaled_dot_product_attention(q:clone(), k:clone(), v:clone(), { causal = true })
    end)
    assert.are.equal(0, diff(after, fresh))

    local function grads(share)
      local qq, kk, vv = q:clone():requires_grad_(true), k:clone():requires_grad_(true), v:clone():requires_grad_(true)
      bf16(function()
        local o = F.scaled_dot_product_attention(qq, kk, vv, { causal = true })
        -- share: backward in the forward's region (cached q, k, v); else in a region of its own
        if share then flow.sum(o * o):backward() end
        return o
      end)
      if not share then
        local o = bf16(function() return F.scaled_dot_product_attention(qq, kk, vv, { causal = true }) end)
        bf16(function() flow.sum(o * o):backward() end)
      end
      return qq.grad, kk.grad, vv.grad
    end
    local a, b = { grads(true) }, { grads(false) }
    for i = 1, 3 do assert.are.equal(0, diff(a[i], b[i])) end
  end)

  it_bf16("rounds strided views as their contiguous copies: heads of one qkv, no axis of unit stride", function()
    flow.manual_seed(18)
    local B, T, H, D = 3, 37, 4, 8
    local parts = flow.split(flow.randn({ B, T, 3 * H * D }), H * D, 2)
    local function heads(t) return flow.transpose(flow.reshape(t, { B, T, H, D }), 1, 2) end
    local q, k, v = heads(parts[1]), heads(parts[2]), heads(parts[3])
    local s, s0 = bf16(function()
      return flow.matmul(q, k, { transpose_b = true }), flow.matmul(q:contiguous(), k:contiguous(), { transpose_b = true })
    end)
    assert.are.equal(0, diff(s, s0))
    local o, o0 = bf16(function()
      return F.scaled_dot_product_attention(q, k, v, { causal = true }),
        F.scaled_dot_product_attention(q:contiguous(), k:contiguous(), v:contiguous(), { causal = true })
    end)
    assert.are.equal(0, diff(o, o0))
    -- [K, M, B] read as [B, M, K]: every axis strided
    local a, w = flow.randn({ 19, 13, 3 }):permute({ 2, 1, 0 }), flow.randn({ 3, 19, 11 })
    local y, y0 = bf16(function() return flow.matmul(a, w), flow.matmul(a:contiguous(), w) end)
    assert.are.equal(0, diff(y, y0))
    assert.is_true(diff(y, flow.matmul(rounded(a), rounded(w))) < 1e-4)
  end)

  it_bf16("carries each weight's copy across the optimizer step, with the bits of a fresh rounding", function()
    -- the step rounds each weight its GEMMs rounded into their copy as it writes it; the next
    -- region's GEMMs read that copy. `fresh` bumps each weight's version after the step (add_(0)
    -- changes no value), so the next region rounds them anew.
    local function train(fresh)
      flow.manual_seed(19)
      local model = flow.nn.Sequential(flow.nn.Linear(24, 40), flow.nn.GELU(), flow.nn.Linear(40, 8))
      local opt = flow.optim.AdamW(model:parameters(), { lr = 0.05 })
      local x, losses = flow.randn({ 16, 24 }), {}
      local before = flow._bench.onednn().carried
      for step = 1, 4 do
        losses[step] = bf16(function()
          local l = flow.sum(model(x) ^ 2)
          l:backward()
          return l
        end):item()
        opt:step()
        opt:zero_grad()
        if fresh then
          for _, p in ipairs(model:parameters()) do p:detach():add_(0) end
        end
      end
      return losses, model[3].weight:detach(), flow._bench.onednn().carried - before
    end
    local l0, w0, carried = train(false)
    local l1, w1, none = train(true)
    -- the 2 weights (the biases are no GEMM operand) in steps 2 to 4; none once bumped
    assert.are.equal(6, carried)
    assert.are.equal(0, none)
    for i = 1, 4 do assert.are.equal(l1[i], l0[i]) end
    assert.are.equal(0, diff(w0, w1))
    assert.is_true(l0[4] < l0[1])
  end)

  it_bf16("frees the copies of ended regions: many regions of fresh weights hold no memory", function()
    flow.manual_seed(17)
    local x = flow.randn({ 4, 512 })
    collectgarbage()
    local base = flow._graph.memory()
    for _ = 1, 40 do
      local w = flow.randn({ 512, 1024 })   -- 2 MB of float32, 1 MB rounded
      bf16(function() return flow.matmul(x, w) end)
    end
    collectgarbage()
    bf16(function() return flow.matmul(x, x, { transpose_b = true }) end) -- one more region drops the last
    collectgarbage()
    local grown = flow._graph.memory() - base
    assert.is_true(grown < 4 * 2 ^ 20, ("%d bytes still held"):format(grown))
  end)

  it("names the op when a GEMM operand is refused", function()
    assert.has_error(function() bf16(function() return flow.matmul(flow.randn({ 3, 4 }), flow.randn({ 5, 6 })) end) end,
      "matmul: shapes {3,4} and {5,6} do not match on the contracted axis (4 vs 5)")
  end)
end)
