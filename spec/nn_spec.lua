local flow = require "flow"
local nn = flow.nn
local F = nn.functional

local function close(a, b, tol)
  tol = tol or 1e-5
  if type(a) == "table" then
    assert.are.equal(#a, #b)
    for i = 1, #a do close(a[i], b[i], tol) end
    return
  end
  assert(math.abs(a - b) <= tol * (1 + math.abs(b)), ("%.9g vs %.9g"):format(a, b))
end

-- y[i][o] = sum_k x[i][k] W[o][k] + b[o], in plain Lua.
local function linear_by_hand(x, W, b)
  local y = {}
  for i = 1, #x do
    y[i] = {}
    for o = 1, #W do
      local s = b and b[o] or 0
      for k = 1, #x[i] do s = s + x[i][k] * W[o][k] end
      y[i][o] = s
    end
  end
  return y
end

describe("nn.Linear", function()
  it("computes x W^T + b with W stored [out, in]", function()
    local lin = nn.Linear(3, 2)
    assert.are.same({ 2, 3 }, lin.weight:shape())
    assert.are.same({ 2 }, lin.bias:shape())
    local x = { { 1, 2, 3 }, { -1, 0.5, 4 } }
    local y = lin(flow.tensor(x))
    close(y:totable(), linear_by_hand(x, lin.weight:totable(), lin.bias:totable()))
  end)

  it("applies to the last axis of a batched input and without bias", function()
    local lin = nn.Linear(4, 3, false)
    assert.is_nil(lin.bias)
    local x = flow.randn({ 2, 5, 4 })
    local y = lin(x)
    assert.are.same({ 2, 5, 3 }, y:shape())
    local xt = x:totable()
    close(y:totable()[2], linear_by_hand(xt[2], lin.weight:totable()))
  end)

  it("initialises uniformly within 1/sqrt(in)", function()
    local lin = nn.Linear(16, 8)
    for _, row in ipairs(lin.weight:totable()) do
      for _, w in ipairs(row) do assert(math.abs(w) <= 0.25) end
    end
  end)

  it("gets gradients for weight and bias through backward", function()
    local lin = nn.Linear(2, 1)
    local x = flow.tensor({ { 1.0, 2.0 }, { 3.0, 4.0 } })
    flow.sum(lin(x)):backward()
    close(lin.weight.grad:totable(), { { 4, 6 } })
    close(lin.bias.grad:totable(), { 2 })
    lin:zero_grad()
    assert.is_nil(lin.weight.grad)
  end)
end)

describe("nn.Module", function()
  local function net()
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))
  end

  it("lists named parameters in a stable, dotted order", function()
    local names = {}
    for i, nt in ipairs(net():named_parameters()) do names[i] = nt[1] end
    assert.are.same({ "0.weight", "0.bias", "2.weight", "2.bias" }, names)
    assert.are.equal(4, #net():parameters())
  end)

  it("names nested modules and ModuleList entries from 0", function()
    local M = nn.class("M", nn.Module)
    function M:__init()
      self.blocks = nn.ModuleList({ nn.LayerNorm(3), nn.LayerNorm(3) })
      self.head = nn.Linear(3, 1)
    end
    local names = {}
    for i, nt in ipairs(M():named_parameters()) do names[i] = nt[1] end
    assert.are.same({ "blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias", "head.weight", "head.bias" }, names)
  end)

  it("round-trips state_dict into a fresh model", function()
    local a, b = net(), net()
    b:load_state_dict(a:state_dict())
    local x = flow.randn({ 3, 4 })
    assert.are.same(a(x):totable(), b(x):totable())
    -- the copy is by value: changing a afterwards does not change b
    flow.no_grad(function() a[1].weight:fill_(0) end)
    assert.are_not.same(a(x):totable(), b(x):totable())
  end)

  it("round-trips state_dict through flow.save / flow.load", function()
    local a, b = net(), net()
    local p = os.tmpname()
    flow.save(a:state_dict(), p)
    b:load_state_dict(flow.load(p))
    os.remove(p)
    for i, nt in ipairs(a:named_parameters()) do
      assert.are.same(nt[2]:totable(), b:named_parameters()[i][2]:totable())
    end
  end)

  it("load_state_dict names the missing, unexpected or mismatched key", function()
    local m = net()
    local sd = m:state_dict()
    sd["0.bias"] = nil
    assert.has_error(function() m:load_state_dict(sd) end, "load_state_dict: missing key '0.bias'")
    sd = m:state_dict()
    sd["3.weight"] = flow.zeros({ 1 })
    assert.has_error(function() m:load_state_dict(sd) end, "load_state_dict: unexpected key '3.weight'")
    sd = m:state_dict()
    sd["2.weight"] = flow.zeros({ 8, 2 })
    assert.has_error(function() m:load_state_dict(sd) end,
      "load_state_dict: key '2.weight' has shape {8,2} but the parameter has shape {2,8}")
  end)

  it("switches train/eval on every submodule and applies functions depth first", function()
    local m = nn.Sequential(nn.Dropout(0.5), nn.Sequential(nn.ReLU()))
    m:eval()
    assert.is_false(m[1].training)
    assert.is_false(m[2][1].training)
    m:train()
    assert.is_true(m[2][1].training)
    local seen = {}
    m:apply(function(x) seen[#seen + 1] = getmetatable(x).__name end)
    assert.are.same({ "Dropout", "ReLU", "Sequential", "Sequential" }, seen)
  end)

  it("Dropout is the identity in eval mode", function()
    local d = nn.Dropout(0.9)
    d:eval()
    local x = flow.ones({ 10 })
    assert.are.same(x:totable(), d(x):totable())
  end)

  it("to(device) moves parameters as leaves and keeps tied ones tied", function()
    local m = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    rawset(m[2], "weight", m[1].weight)
    local dev = flow.cuda.is_available() and "cuda" or "cpu"
    m:to(dev)
    assert.are.equal(rawget(m[1], "weight"), rawget(m[2], "weight"))
    assert.are.equal(3, #m:parameters())
    for _, p in ipairs(m:parameters()) do
      assert.matches("^" .. dev, p.device)
      assert.is_true(p.is_leaf and p.requires_grad)
    end
    flow.sum(m(flow.ones({ 2, 3 }):to(dev))):backward()
    assert.is_not_nil(m[1].weight.grad)
  end)

  it("to_global turns parameters into global leaves that still train", function()
    flow.manual_seed(0)
    local m = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    local P = flow.placement("cpu", { 0 })
    m:to_global(P, flow.sbp.broadcast)
    for _, p in ipairs(m:parameters()) do
      assert.are.equal("B", tostring(p.sbp))
      assert.is_true(p.is_leaf)
      assert.is_true(p.requires_grad)
    end
    local before = m[1].weight:to_local():totable()
    local x = flow.randn({ 5, 4 }, { placement = P, sbp = flow.sbp.split(0) })
    flow.sum(m(x)):backward()
    flow.optim.SGD(m:parameters(), { lr = 0.1 }):step()
    assert.are_not.same(before, m[1].weight:to_local():totable())
  end)
end)

describe("nn layers", function()
  it("ReLU and GELU match their formulas", function()
    local xs = { -2, -0.5, 0, 0.5, 2 }
    local x = flow.tensor(xs)
    local r, g = nn.ReLU()(x):totable(), nn.GELU("tanh")(x):totable()
    for i, v in ipairs(xs) do
      close(r[i], math.max(v, 0))
      close(g[i], 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ^ 3))), 1e-5)
    end
  end)

  it("LayerNorm normalises the last axis", function()
    local ln = nn.LayerNorm(4)
    local y = ln(flow.tensor({ { 1.0, 2.0, 3.0, 4.0 } })):totable()[1]
    local sd = math.sqrt(1.25 + 1e-5)
    close(y, { -1.5 / sd, -0.5 / sd, 0.5 / sd, 1.5 / sd }, 1e-4)
  end)

  it("Embedding looks up rows", function()
    local e = nn.Embedding(5, 3)
    local y = e(flow.tensor({ { 4, 0 } }, { dtype = "int64" }))
    assert.are.same({ 1, 2, 3 }, y:shape())
    local w = e.weight:totable()
    assert.are.same({ w[5], w[1] }, y:totable()[1])
  end)

  it("CausalSelfAttention: output t depends only on inputs up to t", function()
    local attn = nn.CausalSelfAttention(8, 2)
    local x = flow.randn({ 1, 5, 8 })
    local y1 = attn(x):totable()[1]
    -- change the last position only: earlier outputs stay the same
    local xt = x:totable()
    for c = 1, 8 do xt[1][5][c] = xt[1][5][c] + 1 end
    local y2 = attn(flow.tensor(xt)):totable()[1]
    for t = 1, 4 do close(y1[t], y2[t], 1e-5) end
    assert(math.abs(y1[5][1] - y2[5][1]) > 1e-6)
  end)

  it("the \"math\" attention backend (matmuls + softmax) equals the fused op, values and gradients", function()
    local F = flow.nn.functional
    local q0, k0, v0 = flow.randn({ 2, 3, 6, 8 }), flow.randn({ 2, 3, 6, 8 }), flow.randn({ 2, 3, 6, 5 })
    local function run(causal, Tk, backend)
      local q = q0:detach():requires_grad_()
      local k = k0:narrow(2, 0, Tk):detach():requires_grad_()
      local v = v0:narrow(2, 0, Tk):detach():requires_grad_()
      flow.backends.attention = backend
      local ok, y = pcall(F.scaled_dot_product_attention, q, k, v, { causal = causal, scale = 0.3 })
      flow.backends.attention = nil
      assert(ok, y)
      flow.sum(y * y):backward()
      return y, q.grad, k.grad, v.grad
    end
    local ok, err = pcall(run, false, 6, "flash")
    assert.is_false(ok)
    assert.matches('flow.backends.attention is "flash"; expected "fused" or "math"', err, 1, true)
    for _, c in ipairs({ { false, 6 }, { true, 6 }, { false, 4 } }) do
      local a, b = { run(c[1], c[2], "fused") }, { run(c[1], c[2], "math") }
      for i = 1, 4 do
        local d = (a[i] - b[i]):abs():max():item()
        assert(d < 1e-5, ("causal=%s Tk=%d output %d differs by %g"):format(tostring(c[1]), c[2], i, d))
      end
    end
  end)

  it("CausalSelfAttention matches softmax(QK^T/sqrt(D)) V computed by hand", function()
    local attn = nn.CausalSelfAttention(4, 1)
    local x = flow.randn({ 1, 3, 4 })
    local qkv = attn.c_attn(x):totable()[1]
    local ctx = {}
    for t = 1, 3 do
      local scores, m = {}, -math.huge
      for s = 1, t do
        local d = 0
        for c = 1, 4 do d = d + qkv[t][c] * qkv[s][4 + c] end
        scores[s] = d / 2
        m = math.max(m, scores[s])
      end
      local z = 0
      for s = 1, t do scores[s] = math.exp(scores[s] - m); z = z + scores[s] end
      ctx[t] = {}
      for c = 1, 4 do
        local v = 0
        for s = 1, t do v = v + scores[s] / z * qkv[s][8 + c] end
        ctx[t][c] = v
      end
    end
    local want = linear_by_hand(ctx, attn.c_proj.weight:totable(), attn.c_proj.bias:totable())
    close(attn(x):totable()[1], want, 1e-4)
  end)

  it("functional cross_entropy equals -log softmax at the target", function()
    local logits = flow.tensor({ { 1, 2, 3 }, { 0, 0, 0 } }, { dtype = "float32" })
    local loss = F.cross_entropy(logits, flow.tensor({ 2, 0 }, { dtype = "int64" })):item()
    local l1 = -(3 - math.log(math.exp(1) + math.exp(2) + math.exp(3)))
    close(loss, (l1 + math.log(3)) / 2)
  end)
end)

describe("losses composed in Lua", function()
  local F = flow.nn.functional
  it("name the op in their errors", function()
    local x = flow.randn({2, 3})
    assert.matches("nll_loss: reduction must be", select(2, pcall(F.nll_loss, x, flow.tensor({0, 1}), {reduction = "avg"})))
    assert.matches("nll_loss: target must be an int64 tensor", select(2, pcall(F.nll_loss, x, flow.tensor({0.0, 1.0}))))
    assert.matches("mse_loss: unknown option", select(2, pcall(F.mse_loss, x, x, {size_average = true})))
    assert.matches("one_hot: class values must be in %[0, 3%) %(got %[0, 3%]%)", select(2, pcall(F.one_hot, flow.tensor({0, 3}), 3)))
    assert.matches("one_hot: expected an int64 tensor", select(2, pcall(F.one_hot, flow.tensor({0.0}))))
    local p = flow.tensor({0.5, 1.5})
    assert.matches("binary_cross_entropy: all elements of input should be between 0 and 1",
      select(2, pcall(F.binary_cross_entropy, p, flow.zeros({2}))))
    assert.matches("binary_cross_entropy: target must have the input's shape {2} %(got {3}%)",
      select(2, pcall(F.binary_cross_entropy, p * 0.5, flow.zeros({3}))))
    assert.matches("binary_cross_entropy: unknown option 'pos_weight'",
      select(2, pcall(F.binary_cross_entropy, p * 0.5, flow.zeros({2}), {pos_weight = p})))
  end)
  it("layer_norm takes torch's normalized_shape, and scaled_dot_product_attention any rank", function()
    local x = flow.randn({2, 3, 4})
    assert.same({2, 3, 4}, F.layer_norm(x, {3, 4}, flow.ones({3, 4}), flow.zeros({3, 4})):shape())
    assert.same(F.layer_norm(x, 4):totable(), F.layer_norm(x):totable()) -- the old form: over the last axis
    assert.matches("layer_norm: normalized_shape {2,4} must be the input's trailing axes %(got input of shape {2,3,4}%)",
      select(2, pcall(F.layer_norm, x, {2, 4})))
    assert.matches("layer_norm: bias must have normalized_shape {4} %(got {3}%)",
      select(2, pcall(F.layer_norm, x, 4, nil, flow.zeros({3}))))
    assert.same({2, 5, 3}, F.scaled_dot_product_attention(flow.randn({2, 5, 8}), flow.randn({2, 7, 8}), flow.randn({2, 7, 3})):shape())
    assert.same({5, 8}, F.scaled_dot_product_attention(flow.randn({5, 8}), flow.randn({5, 8}), flow.randn({5, 8}), {causal = true}):shape())
    assert.matches("scaled_dot_product_attention: q, k and v must have the same leading axes",
      select(2, pcall(F.scaled_dot_product_attention, flow.randn({2, 5, 8}), flow.randn({3, 5, 8}), flow.randn({3, 5, 8}))))
  end)
  it("one_hot infers the class count from the largest value", function()
    assert.same({{0, 1, 0}, {0, 0, 1}}, F.one_hot(flow.tensor({1, 2})):totable())
  end)
end)
