-- float16 and bfloat16 on the CPU: an op computes in float32 on the half tensors' values and rounds
-- each half output once (ops/dispatch.c), as PyTorch's CPU kernels do. So every result must equal,
-- bit for bit, the float32 op on the same values cast to the half dtype; in-place ops, views and the
-- optimizer's state write their results back; gradients come out in the half dtype. The values
-- against PyTorch's own bfloat16 kernels are in conformance_spec.lua.
local flow = require "flow"
local F = flow.nn.functional

local function flat(t, out)
  out = out or {}
  if type(t) == "table" then for _, v in ipairs(t) do flat(v, out) end else out[#out + 1] = t end
  return out
end

-- a and b hold the same numbers (NaN equal to NaN), bit for bit as doubles
local function same(a, b, what)
  assert.are.equal(a.dtype, b.dtype, what .. ": dtype")
  assert.are.same(a:shape(), b:shape(), what .. ": shape")
  local x, y = flat(a:totable()), flat(b:totable())
  for i = 1, #y do
    if not (x[i] == y[i] or (x[i] ~= x[i] and y[i] ~= y[i])) then
      error(("%s: element %d is %.9g, float32 rounded gives %.9g"):format(what, i, x[i], y[i]), 2)
    end
  end
end

local function randh(shape, dtype, seed)
  flow.manual_seed(seed or 3)
  return (flow.randn(shape) * 2):to(dtype)
end

for _, dt in ipairs({ "bfloat16", "float16" }) do
  describe(dt .. " on the CPU", function()
    local x, y = randh({ 5, 7 }, dt, 1), randh({ 5, 7 }, dt, 2)
    local w = randh({ 7, 3 }, dt, 4)
    local big = randh({ 300, 512 }, dt, 13)
    local big32 = big:float()
    -- each op on half tensors against the same op on their float32 values, rounded once
    local ops = {
      add = function(a, b) return a + b end,
      -- a number is first rounded to the tensor's dtype, as torch 1.13 does
      ["mul by a number"] = function(a) return a * (a.dtype == "float32" and flow.tensor(0.3):to(dt):item() or 0.3) end,
      div = function(a, b) return a / b end,
      exp = function(a) return flow.exp(a) end,
      ["gelu tanh"] = function(a) return F.gelu(a, { approximate = "tanh" }) end,
      ["where and gt"] = function(a, b) return flow.where(a:gt(b), a, b) end,
      ["sum over axis 1"] = function(a) return a:sum(1) end,
      -- past the sizes where a sum over leading axes goes in row blocks and a total in blocks
      ["sum over the leading axes of [300, 512]"] = function(a) return (a.dtype == "float32" and big32 or big):sum(0) end,
      ["sum of all of [300, 512]"] = function(a) return (a.dtype == "float32" and big32 or big):sum() end,
      mean = function(a) return a:mean() end,
      ["var over axis 0"] = function(a) return a:var(0) end,
      cumsum = function(a) return flow.cumsum(a, 1) end,
      ["sort descending"] = function(a) return (flow.sort(a, 1, true)) end,
      argmax = function(a) return a:argmax(1) end,
      matmul = function(a) return flow.matmul(a, w:to(a.dtype)) end,
      ["softmax of a transposed view"] = function(a) return flow.softmax(a:transpose(0, 1), -1) end,
      layer_norm = function(a) return F.layer_norm(a, { 7 }) end,
      cross_entropy = function(a) return F.cross_entropy(a, flow.tensor({ 0, 6, 3, 3, 1 })) end,
    }
    local names = {}
    for n in pairs(ops) do names[#names + 1] = n end
    table.sort(names)
    for _, n in ipairs(names) do
      it(n .. " equals float32 on the same values, rounded once", function()
        local got = ops[n](x, y)
        local ref = ops[n](x:float(), y:float())
        if ref.dtype == "float32" then ref = ref:to(dt) end
        same(got, ref, n)
      end)
    end

    it("matmul (a long K, a transposed operand, batches) and linear with a bias: within one rounding", function()
      local a, b = randh({ 2, 9, 300 }, dt, 5), randh({ 11, 300 }, dt, 6)
      local bias = randh({ 11 }, dt, 7)
      local cases = {
        { flow.matmul(a, b:transpose(0, 1)), flow.matmul(a:float(), b:float():transpose(0, 1)) },
        { F.linear(a, b, bias), F.linear(a:float(), b:float(), bias:float()) },
      }
      for i, c in ipairs(cases) do
        assert.are.equal(dt, c[1].dtype)
        -- float32 sums in another order can round the other way: one unit of the last place at most
        local got, want = flat(c[1]:float():totable()), flat(c[2]:totable())
        for j = 1, #want do
          local ulp = 2 ^ (math.floor(math.log(math.abs(want[j]), 2)) - (dt == "bfloat16" and 7 or 10))
          assert.is_true(math.abs(got[j] - want[j]) <= ulp,
            ("case %d element %d: %.9g, float32 %.9g"):format(i, j, got[j], want[j]))
        end
      end
    end)

    it("in place on a transposed view writes back into its base", function()
      local base = x:clone()
      local v = base:transpose(0, 1)
      v:mul_(y:transpose(0, 1))
      same(base, (x:float() * y:float()):to(dt), "mul_ through a view")
      base:add_(1)
      same(base, ((x:float() * y:float()):to(dt):float() + 1):to(dt), "add_")
    end)

    it("gradients come out in " .. dt .. ", one rounding per op", function()
      local a = x:clone():requires_grad_(true)
      local l = (flow.exp(a) * a):sum()
      l:backward()
      assert.are.equal(dt, a.grad.dtype)
      -- mul gives exp(a) to a and a to exp(a); exp's gradient is that times its output: each rounded
      local e = flow.exp(x:float()):to(dt):float()
      same(a.grad, (e + (x:float() * e):to(dt):float()):to(dt), "grad of sum(exp(a) * a)")
    end)

    it("AdamW on a " .. dt .. " parameter keeps its moments (written back)", function()
      local p = x:clone():requires_grad_(true)
      local opt = flow.optim.AdamW({ p }, { lr = 0.1, weight_decay = 0 })
      local pf = x:float():requires_grad_(true)
      local optf = flow.optim.AdamW({ pf }, { lr = 0.1, weight_decay = 0 })
      for _ = 1, 3 do
        (p * y):sum():backward()
        opt:step()
        opt:zero_grad();
        (pf * y:float()):sum():backward()
        optf:step()
        optf:zero_grad()
      end
      assert.are.equal(dt, p.dtype)
      -- three steps of lr 0.1 along sign(y): the moments must have carried the gradient (a lost
      -- write-back would leave them 0 and the step NaN or 0)
      local got, want = flat(p:float():totable()), flat(pf:totable())
      for i = 1, #want do
        assert.is_true(math.abs(got[i] - want[i]) <= 0.02 * math.max(1, math.abs(want[i])),
          ("element %d: %s AdamW %.6g, float32 %.6g"):format(i, dt, got[i], want[i]))
      end
    end)
  end)
end

describe("a bfloat16 model on the CPU", function()
  it("Module:to casts the floating-point parameters; nn.Graph gives eager's outputs", function()
    local nn = flow.nn
    flow.manual_seed(1)
    local m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    local w = m[1].weight:detach():clone()
    assert.are.equal(m, m:to("bfloat16"))
    assert.are.equal("bfloat16", m[1].weight.dtype)
    assert.is_true(m[1].weight.requires_grad)
    same(m[1].weight, w:to("bfloat16"), "the cast weight")
    local x = randh({ 6, 8 }, "bfloat16")
    local eager = m(x)
    local G = nn.Graph { model = m, build = function(self, v) return self.model(v) end }
    same(G(x), eager, "the graph's output")
    m:to({ dtype = "float32" })
    assert.are.equal("float32", m[3].bias.dtype)
    local ok, err = pcall(m.to, m, { dtype = "float32", devcie = "cpu" })
    assert.is_false(ok)
    assert.matches("Module:to: unknown option 'devcie'", err)
    ok, err = pcall(m.to, m, "bfloat61")
    assert.is_false(ok)
    assert.matches("Module:to: unknown dtype 'bfloat61' %(expected float32,", err)
    ok, err = pcall(m.to, m, "int64")
    assert.is_false(ok)
    assert.matches("Module:to: expected a floating%-point dtype, as torch's Module.to %(got int64%)", err)
    assert.are.equal("float32", m[1].weight.dtype)
  end)
end)

describe("float32 <-> half conversions", function()
  -- ties (1 + half a unit: to even), float16's subnormals and overflow, bfloat16's 2^-133, -0, inf:
  -- 35 values, so the 8- and 32-wide vector loops and their tails all run
  local v = { 1 + 2 ^ -8, 1 + 3 * 2 ^ -8, 1 + 2 ^ -11, 1 + 3 * 2 ^ -11, 2 ^ -20, 3 * 2 ^ -25, 2 ^ -25, 65519, 65520,
              70000, -65504, 2 ^ -133, 3 * 2 ^ -134, -0.0, math.huge, -math.huge, 0.1, -0.3, 1e-30, 3.4e38 }
  for i = #v + 1, 35 do v[i] = (i - 20) * 0.7391 end
  for _, dt in ipairs({ "bfloat16", "float16" }) do
    it("to " .. dt .. " and back: the vector loops round as one element at a time", function()
      local x = flow.tensor(v)
      local one = {}   -- flow.tensor stores each number on its own (flow_dtype_store)
      for i, n in ipairs(v) do one[i] = flow.tensor({ n }, { dtype = dt }):float():item() end
      local got = flat(x:to(dt):float():totable())
      for i = 1, #v do
        assert.is_true(got[i] == one[i] and (got[i] ~= 0 or 1 / got[i] == 1 / one[i]),
          ("%s of %.9g: %.9g, one at a time %.9g"):format(dt, v[i], got[i], one[i]))
      end
      -- and a strided view (the element-at-a-time loops) matches the dense one
      local y = flow.tensor({ v, v }):transpose(0, 1):to(dt)
      same(y:transpose(0, 1):contiguous():narrow(0, 0, 1):reshape({ #v }), x:to(dt), "strided " .. dt)
    end)
  end
end)

describe("bfloat16 GEMMs on the CPU", function()
  it("a float32 matmul under autocast and a bfloat16 one of the same shapes each get their own primitive", function()
    local a, b = randh({ 16, 24 }, "bfloat16", 8), randh({ 24, 8 }, "bfloat16", 9)
    local want = flow.matmul(a:float(), b:float())   -- bf16 values: exact products, float32 sums
    local f32 = flow.autocast("bfloat16", function() return flow.matmul(a:float(), b:float()) end)
    local h = flow.matmul(a, b)
    assert.are.equal("float32", f32.dtype)
    assert.are.equal("bfloat16", h.dtype)
    local x, y, z = flat(want:totable()), flat(f32:totable()), flat(h:float():totable())
    for i = 1, #x do
      assert.is_true(math.abs(y[i] - x[i]) <= 1e-5 * math.max(1, math.abs(x[i])), "autocast element " .. i)
      assert.is_true(math.abs(z[i] - x[i]) <= 2 ^ -7 * math.max(1, math.abs(x[i])), "bfloat16 element " .. i)
    end
  end)
end)

describe("attention on half tensors", function()
  -- q, k, v as a GPT makes them: strided views of one [B, T, 3, H, D] projection
  local function check(dt, causal, tol)
    local qkv = randh({ 2, 70, 3, 4, 16 }, dt, 11)
    local x, f = {}, {}
    for i = 1, 3 do
      local view = qkv:select(2, i - 1):transpose(1, 2)
      x[i] = view:detach():requires_grad_(true)
      f[i] = view:float():detach():requires_grad_(true)
    end
    local o = F.scaled_dot_product_attention(x[1], x[2], x[3], { causal = causal })
    local of = F.scaled_dot_product_attention(f[1], f[2], f[3], { causal = causal })
    local g = randh(o:shape(), dt, 12)
    o:backward(g)
    of:backward(g:float())
    assert.are.equal(dt, o.dtype)
    -- within tol of each tensor's scale: bf16 rounds P before P V, as under autocast, and each
    -- output once; float16 runs on float32 copies and rounds once
    local function near(a, b, what)
      assert.are.equal(dt, a.dtype, what)
      local u, w = flat(a:float():totable()), flat(b:totable())
      local scale = 0
      for i = 1, #w do scale = math.max(scale, math.abs(w[i])) end
      for i = 1, #w do
        assert.is_true(math.abs(u[i] - w[i]) <= tol * scale,
          ("%s element %d: %.6g, float32 %.6g (scale %.3g)"):format(what, i, u[i], w[i], scale))
      end
    end
    near(o, of, "o")
    for i, n in ipairs({ "dq", "dk", "dv" }) do near(x[i].grad, f[i].grad, n) end
  end
  it("bfloat16 inside autocast (twins from the bf16 cache) gives the same bits, and sees an in-place write", function()
    local qkv = randh({ 2, 70, 3, 4, 16 }, "bfloat16", 14)
    local function head(t, i) return t:select(2, i):transpose(1, 2) end
    local function views(t) return head(t, 0), head(t, 1), head(t, 2) end
    local q, k, v = views(qkv)
    local plain = F.scaled_dot_product_attention(q, k, v, { causal = true })
    local cached, after = flow.autocast("bfloat16", function()
      local first = F.scaled_dot_product_attention(q, k, v, { causal = true })
      qkv:mul_(2)   -- a new version of the storage: its cached twin must not serve again
      return first, F.scaled_dot_product_attention(q, k, v, { causal = true })
    end)
    same(cached, plain, "attention inside autocast")
    local q2, k2, v2 = views(qkv)
    same(after, F.scaled_dot_product_attention(q2, k2, v2, { causal = true }), "after the in-place write")
  end)
  for _, causal in ipairs({ true, false }) do
    local c = causal and "causal" or "not causal"
    it("bfloat16, " .. c .. ": the operands are their own GEMM twins", function() check("bfloat16", causal, 2 ^ -6) end)
    it("float16, " .. c .. ": on float32 copies", function() check("float16", causal, 2 ^ -9) end)
  end
end)

describe("bfloat16 on a CPU without AVX512-BF16 (FLOW_NO_BF16=1)", function()
  it("matmul, linear and attention run on float32 copies: float32's values, rounded once", function()
    local bin = os.getenv("FLOW_BIN")
    if not bin then return pending("FLOW_BIN is not set") end
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write([[
local flow = require "flow"
local F = flow.nn.functional
flow.manual_seed(5)
local a, b = flow.randn({ 3, 40, 33 }):to("bfloat16"), flow.randn({ 33, 17 }):to("bfloat16")
local c, q = flow.randn({ 17 }):to("bfloat16"), flow.randn({ 2, 3, 20, 8 }):to("bfloat16")
local function same(x, y)
  return x.dtype == "bfloat16" and (x:float() - y:float()):abs():max():item() == 0 and "same" or "differ"
end
print(same(flow.matmul(a, b), flow.matmul(a:float(), b:float()):to("bfloat16")),
      same(F.linear(a, b:transpose(0, 1), c), F.linear(a:float(), b:float():transpose(0, 1), c:float()):to("bfloat16")),
      same(F.scaled_dot_product_attention(q, q, q, { causal = true }),
           F.scaled_dot_product_attention(q:float(), q:float(), q:float(), { causal = true }):to("bfloat16")))
]])
    f:close()
    local p = io.popen("FLOW_NO_BF16=1 " .. bin .. " " .. script .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(script)
    assert.matches("same\tsame\tsame", out)
  end)
end)

describe("half tensors on the CPU keep their errors", function()
  it("dropout and conv2d still ask for float32 or float64 (their CUDA kernels pass other dtypes to the CPU's)", function()
    local ok, err = pcall(F.dropout, randh({ 4 }, "bfloat16"), 0.5, true)
    assert.is_false(ok)
    assert.matches("dropout: input must be float32 or float64 %(got bfloat16%)", err)
    ok, err = pcall(flow.conv2d, randh({ 1, 1, 3, 3 }, "bfloat16"), randh({ 1, 1, 2, 2 }, "bfloat16"))
    assert.is_false(ok)
    assert.matches("conv2d: input must be float32 or float64 %(got bfloat16%)", err)
  end)
end)
