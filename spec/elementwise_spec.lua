-- Elementwise ops: binary arithmetic and comparisons with broadcasting, Lua numbers on either
-- side, where/masked_fill, the unary math ops, casts and in-place updates; values against plain
-- Lua, gradients against central finite differences, and the error messages.
local flow = require "flow"
local G = require "support.gradcheck"

local randt, gradcheck, flat = G.randt, G.gradcheck, G.flat

local err_of = G.err_of

-- every element of the tensor t close to the flat list want (relative tolerance tol)
local function assert_close(want, t, tol)
  tol = tol or 1e-12
  local got = flat(t:totable())
  assert.are.equal(#want, #got)
  for k = 1, #want do
    local w, g = want[k], got[k]
    if w ~= w then
      assert(g ~= g, ("element %d: want nan, got %s"):format(k, tostring(g)))
    elseif w == math.huge or w == -math.huge then
      assert.are.equal(w, g)
    else
      assert(math.abs(g - w) <= tol * math.max(1, math.abs(w)),
        ("element %d: want %.10g, got %.10g"):format(k, w, g))
    end
  end
end

-- out[i] = f(a[i], b[i]) over the broadcast of two row-major flat lists of shapes sa, sb (2-d)
local function broadcast2(a, sa, b, sb, f)
  local rows, cols = math.max(sa[1], sb[1]), math.max(sa[2], sb[2])
  local out = {}
  for i = 0, rows - 1 do
    for j = 0, cols - 1 do
      local x = a[(sa[1] == 1 and 0 or i) * sa[2] + (sa[2] == 1 and 0 or j) + 1]
      local y = b[(sb[1] == 1 and 0 or i) * sb[2] + (sb[2] == 1 and 0 or j) + 1]
      out[#out + 1] = f(x, y)
    end
  end
  return out
end

local function map(list, f)
  local out = {}
  for k, v in ipairs(list) do out[k] = f(v) end
  return out
end

local function gelu(x) return 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ^ 3))) end
local function sigmoid(x) return 1 / (1 + math.exp(-x)) end

describe("binary ops", function()
  before_each(function() math.randomseed(7) end)

  local arith = {
    add = function(x, y) return x + y end, sub = function(x, y) return x - y end,
    mul = function(x, y) return x * y end, div = function(x, y) return x / y end,
    pow = function(x, y) return x ^ y end,
    maximum = math.max, minimum = math.min,
  }

  it("compute with broadcasting ({2,1} with {1,3}) in float64", function()
    for name, f in pairs(arith) do
      local a = randt({2, 1}):abs() + 0.5
      local b = randt({1, 3})
      local want = broadcast2(flat(a:totable()), {2, 1}, flat(b:totable()), {1, 3}, f)
      assert_close(want, flow[name](a, b))
      assert_close(want, a[name](a, b))
    end
  end)

  it("compute in float32 against float64", function()
    for name, _ in pairs(arith) do
      local a, b = randt({4, 9}):abs() + 0.5, randt({4, 9})
      assert_close(flat(flow[name](a, b):totable()), flow[name](a:float(), b:float()), 1e-5)
    end
  end)

  it("read non-contiguous inputs: an expand and a transposed view", function()
    local a = randt({3, 1})
    local e = flow.expand(a, {3, 4})
    local b = randt({4, 3})
    local bt = b:transpose(0, 1)
    assert.is_false(bt:is_contiguous())
    local av, bv = flat(a:totable()), b:totable()
    local want = {}
    for i = 1, 3 do for j = 1, 4 do want[#want + 1] = av[i] * bv[j][i] end end
    assert_close(want, e * bt)
  end)

  it("take Lua numbers on either side, in the tensor's dtype", function()
    local t = flow.tensor({1, 2, 4}, {dtype = "float64"})
    assert_close({0, 1, 3}, t - 1)
    assert_close({0, -1, -3}, 1 - t)
    assert_close({2, 4, 8}, 2 * t)
    assert_close({2, 1, 0.5}, 2 / t)
    assert_close({0.5, 1, 2}, t / 2)
    assert_close({2, 4, 16}, 2 ^ t)
    assert_close({1, 4, 16}, t ^ 2)
    assert_close({1, 8, 64}, t ^ 3)
    assert_close({-1, -2, -4}, -t)
    assert_close({3, 3, 4}, flow.maximum(t, 3))
    assert_close({1, 2, 3}, flow.minimum(3, t))
    local i = flow.tensor({1, 2, 3})
    assert.are.equal("int64", (i * 2).dtype)
    assert.are.same({3, 6, 9}, (i * 3):totable())
    assert.are.same({1, 8, 27}, (i ^ 3):totable())
    assert.are.same({0.5, 1, 1.5}, (i / 2):totable()) -- true division to float32, as torch
    assert.are.equal("float32", (i / 2).dtype)
  end)

  it("compare into bool tensors", function()
    local a = flow.tensor({1, 2, 3}, {dtype = "float64"})
    local b = flow.tensor({{3}, {2}})
    local ops = {eq = {{false, false, true}, {false, true, false}}, ne = {{true, true, false}, {true, false, true}},
                 lt = {{true, true, false}, {true, false, false}}, le = {{true, true, true}, {true, true, false}},
                 gt = {{false, false, false}, {false, false, true}}, ge = {{false, false, true}, {false, true, true}}}
    for name, want in pairs(ops) do
      local r = a[name](a, b:double())
      assert.are.equal("bool", r.dtype)
      assert.are.same(want, r:totable())
      assert.are.same(want, flow[name](a:long(), b):totable())
    end
    assert.are.same({false, true, true}, a:gt(1):totable())
    assert.are.same({true, true, false}, flow.lt(a, 3):totable())
  end)

  it("maximum and minimum propagate NaN", function()
    local a = flow.tensor({0 / 0, 1}, {dtype = "float32"})
    local b = flow.tensor({1, 0 / 0}, {dtype = "float32"})
    assert_close({0 / 0, 0 / 0}, flow.maximum(a, b))
    assert_close({0 / 0, 0 / 0}, flow.minimum(a, b))
  end)
end)

describe("where and masked_fill", function()
  it("where picks from a or b, broadcasting all three", function()
    local cond = flow.tensor({true, false, true})
    local a = flow.tensor({{1}, {2}}, {dtype = "float64"})
    local b = flow.tensor({10, 20, 30}, {dtype = "float64"})
    assert.are.same({{1, 20, 1}, {2, 20, 2}}, flow.where(cond, a, b):totable())
    assert.are.same({{1, 0, 1}, {2, 0, 2}}, flow.where(cond, a, 0):totable())
    assert.are.same({{-1, 1, -1}, {-1, 2, -1}}, flow.where(cond, -1, a):totable())
    local i = flow.tensor({5, 6, 7})
    assert.are.same({5, 0, 7}, flow.where(i:ne(6), i, 0):totable())
  end)

  it("masked_fill writes the value where the mask is true", function()
    local t = flow.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "float32"})
    local mask = flow.tensor({false, true, false})
    assert.are.same({{1, -1, 3}, {4, -1, 6}}, t:masked_fill(mask, -1):totable())
    local causal = flow.tensor({{false, true, true}, {false, false, true}})
    local m = t:masked_fill(causal, -math.huge):totable()
    assert.are.same({1, -math.huge, -math.huge}, m[1])
    assert.are.same({4, 5, -math.huge}, m[2])
  end)
end)

describe("unary ops", function()
  -- f(x) and the gradient of sum(f(x)) at x, both as float64
  local function value_and_grad(f, x)
    local a = x:detach():requires_grad_(true)
    local y = f(a)
    y:sum():backward()
    return y:double(), a.grad:double()
  end

  local xs = {}
  for k = 1, 77 do xs[k] = (k - 39) / 9 end -- 77: a dense vector part and a tail
  local pos = map(xs, function(x) return math.abs(x) + 0.01 end)

  local cases = {
    {"neg", function(x) return -x end, xs}, {"abs", math.abs, xs}, {"exp", math.exp, xs},
    {"log", math.log, pos}, {"sqrt", math.sqrt, pos}, {"rsqrt", function(x) return 1 / math.sqrt(x) end, pos},
    {"tanh", math.tanh, xs}, {"sigmoid", sigmoid, xs}, {"relu", function(x) return math.max(x, 0) end, xs},
    {"gelu", gelu, xs, {approximate = "tanh"}},
  }

  it("match Lua's math in float64 and float32", function()
    for _, c in ipairs(cases) do
      local name, f, input, opts = c[1], c[2], c[3], c[4]
      local want = map(input, f)
      local t = flow.tensor(input, {dtype = "float64"})
      assert_close(want, flow[name](t, opts), 1e-12)
      assert_close(want, t:float()[name](t:float(), opts), 2e-6)
    end
  end)

  it("read strided inputs", function()
    local t = flow.tensor({{-1, 2}, {3, -4}}, {dtype = "float32"}):transpose(0, 1)
    assert_close({math.exp(-1), math.exp(3), math.exp(2), math.exp(-4)}, t:exp(), 1e-6)
    assert_close({0, 3, 2, 0}, t:relu())
  end)

  it("float32 exp/log/tanh/sigmoid/gelu handle the extremes", function()
    local t = flow.tensor({-200, -100, -88, 88, 100, 1 / 0, -1 / 0, 0 / 0}, {dtype = "float32"})
    assert_close({0, 0, math.exp(-88), math.exp(88), 1 / 0, 1 / 0, 0, 0 / 0}, t:exp(), 1e-6)
    assert_close({-1, -1, -1, 1, 1, 1, -1, 0 / 0}, t:tanh(), 1e-7)
    assert_close({0, 0, sigmoid(-88), 1, 1, 1, 0, 0 / 0}, t:sigmoid(), 1e-6)
    local g = flat(t:gelu():totable())
    assert.are.equal(0, g[2])
    assert.are.equal(100, g[5])
    local l = flow.tensor({0, -1, 1 / 0, 0 / 0, 1, 1e-40, 3e38}, {dtype = "float32"})
    local sub = flat(l:totable())[6] -- a float32 subnormal
    assert_close({-1 / 0, 0 / 0, 1 / 0, 0 / 0, 0, math.log(sub), math.log(flat(l:totable())[7])}, l:log(), 1e-6)
    local tiny = flow.tensor({1e-5, -3e-4}, {dtype = "float32"})
    assert_close({math.tanh(1e-5), math.tanh(-3e-4)}, tiny:tanh(), 1e-6)
  end)

  -- float32 silu and its gradient run on the vectorised exp of kernels/cpu/unary.c, not libm's expf
  it("float32 silu and its gradient: float64 on every 1e-3 of [-20, 20], torch's far out and at inf and nan", function()
    local x32 = (flow.arange(-20000, 20001, {dtype = "float64"}) / 1000):float()
    local function silu(x) return value_and_grad(flow.nn.functional.silu, x) end
    local y, g = silu(x32)
    local yd, gd = silu(x32:double())
    assert.is_true(((y - yd):abs() - yd:abs() * 2.5e-7):max():item() <= 1e-7)
    assert.is_true((g - gd):abs():max():item() < 2.5e-7)
    -- torch 1.13, float32: silu -0 -0 -5.328e-37 -4.1223e-08 20 100 inf nan nan,
    -- gradient -0 -0 -5.2675e-37 -3.9162e-08 1 1 nan nan nan
    local t = flow.tensor({-200, -100, -88, -20, 20, 100, 1 / 0, -1 / 0, 0 / 0}, {dtype = "float32"})
    local v, d = silu(t)
    v, d = flat(v:totable()), flat(d:totable())
    for i, want in ipairs({0, 0, -5.328049755387946e-37, -4.1223074731533416e-08, 20, 100, 1 / 0}) do
      assert.is_true(v[i] == want or math.abs(v[i] - want) <= 1e-5 * math.abs(want), ("silu at point %d: %g"):format(i, v[i]))
    end
    for i, want in ipairs({0, 0, -5.2675033481724166e-37, -3.916192170549948e-08, 1, 1}) do
      assert.is_true(d[i] == want or math.abs(d[i] - want) <= 1e-5 * math.abs(want), ("gradient at point %d: %g"):format(i, d[i]))
    end
    assert.is_true(v[8] ~= v[8] and v[9] ~= v[9], "silu(-inf) and silu(nan) are nan")
    assert.is_true(d[7] ~= d[7] and d[8] ~= d[8] and d[9] ~= d[9], "the gradient at inf, -inf and nan is nan")
  end)

  -- float32 erf and softplus, and their gradients, are vectorised (kernels/cpu/unary.c), not libm's
  it("float32 erf and softplus and their gradients: float64 on every 1e-3 of [-30, 30], torch's far out and at inf and nan", function()
    local x32 = (flow.arange(-30000, 30001, {dtype = "float64"}) / 1000):float()
    local run = value_and_grad
    local softplus = flow.nn.functional.softplus
    local y, g = run(flow.erf, x32)
    local yd, gd = run(flow.erf, x32:double())
    assert.is_true((y - yd):abs():max():item() < 2e-7 and (g - gd):abs():max():item() < 2e-7)
    y, g = run(softplus, x32)
    yd, gd = run(softplus, x32:double())
    assert.is_true(((y - yd):abs() - yd:abs() * 3e-7):max():item() <= 0)
    assert.is_true((g - gd):abs():max():item() < 2e-7)
    -- torch 1.13, float32 (its subnormal softplus below -87, 6e-39 at -88, is 0 here)
    local t = flow.tensor({-200, -30, -1e-30, 0, 1e-30, 20, 20.5, 100, 1 / 0, -1 / 0, 0 / 0}, {dtype = "float32"})
    local e, de = run(flow.erf, t)
    local s, ds = run(softplus, t)
    e, de, s, ds = flat(e:totable()), flat(de:totable()), flat(s:totable()), flat(ds:totable())
    local c = 2 / math.sqrt(math.pi)
    local want = {
      erf = {-1, -1, -c * 1e-30, 0, c * 1e-30, 1, 1, 1, 1, -1},
      ["erf'"] = {0, 0, c, c, c, 0, 0, 0, 0, 0},
      softplus = {0, 9.357623e-14, math.log(2), math.log(2), math.log(2), 20, 20.5, 100, 1 / 0, 0},
      ["softplus'"] = {0, 9.357624e-14, 0.5, 0.5, 0.5, 1, 1, 1, 1, 0},
    }
    for name, got in pairs({erf = e, ["erf'"] = de, softplus = s, ["softplus'"] = ds}) do
      for i, w in ipairs(want[name]) do
        assert.is_true(got[i] == w or math.abs(got[i] - w) <= 1e-6 * math.abs(w), ("%s at point %d: %.9g, expected %.9g"):format(name, i, got[i], w))
      end
      assert.is_true(got[11] ~= got[11], name .. "(nan) is nan")
    end
  end)

  it("float32 log1p and expm1 (vectorised, Kahan's corrections) keep 3e-7 relative accuracy, tiny arguments too", function()
    local grid = (flow.arange(-20000, 20001, {dtype = "float64"}) / 1000):float()
    local tiny = flow.pow(10, (flow.arange(-300, 1, {dtype = "float64"}) / 10)):float() -- 1e-30 .. 1
    for _, c in ipairs({{"log1p", grid:abs() * 3 - 0.999}, {"expm1", grid}}) do
      local f = flow[c[1]]
      for _, x in ipairs({c[2], tiny, -tiny * 0.99}) do
        local want = f(x:double())
        local err = ((f(x):double() - want):abs() / (want:abs() + 1e-38)):max():item()
        assert.is_true(err < 3e-7, ("%s: relative error %.3g"):format(c[1], err))
      end
    end
    local t = flow.tensor({-1, 0, 100, 1 / 0, -1 / 0, 0 / 0, -2}, {dtype = "float32"})
    local l, e = flat(flow.log1p(t):totable()), flat(flow.expm1(t):totable())
    assert.are.same({-1 / 0, 0, flow.tensor(math.log(101), {dtype = "float32"}):item(), 1 / 0}, {l[1], l[2], l[3], l[4]})
    assert.is_true(l[5] ~= l[5] and l[6] ~= l[6] and l[7] ~= l[7], "log1p of -inf, nan and -2 is nan")
    assert.are.same({0, 1 / 0, 1 / 0, -1}, {e[2], e[3], e[4], e[5]})
    assert.is_true(e[6] ~= e[6], "expm1(nan) is nan")
  end)

  it("float32 sin and cos (Cephes' reduction, libm beyond 8192) and their gradients: float64 within 1.5e-7", function()
    local run = value_and_grad
    for _, r in ipairs({100, 8192, 1e6}) do -- the last past the reduction's range: libm's part
      local x = (flow.arange(-50000, 50001, {dtype = "float64"}) / 50000 * r):float()
      for _, name in ipairs({"sin", "cos"}) do
        local y, g = run(flow[name], x)
        local yd, gd = run(flow[name], x:double())
        local e, eg = (y - yd):abs():max():item(), (g - gd):abs():max():item()
        assert.is_true(e < 1.5e-7 and eg < 1.5e-7, ("%s on [-%g, %g]: %.3g, gradient %.3g"):format(name, r, r, e, eg))
      end
    end
    -- a strided input (each element on its own), with some past 8192: the dense run's values
    local m = (flow.randn({64, 48}) * 3000):float()
    for _, name in ipairs({"sin", "cos"}) do
      local mt = m:transpose(0, 1)
      assert.are.equal(0, (flow[name](mt) - flow[name](mt:contiguous())):abs():max():item(), name)
    end
    local t = flow.tensor({-0.0, 0, 1 / 0, -1 / 0, 0 / 0}, {dtype = "float32"})
    local sn, cs = flat(flow.sin(t):totable()), flat(flow.cos(t):totable())
    assert.are.equal(-1 / 0, 1 / sn[1], "sin(-0) is -0")
    assert.are.same({0, 1, 1}, {sn[2], cs[1], cs[2]})
    for i = 3, 5 do assert.is_true(sn[i] ~= sn[i] and cs[i] ~= cs[i], "sin and cos of inf, -inf and nan are nan") end
  end)

  it("clamp takes either bound as nil", function()
    local t = flow.tensor({-3, -1, 0, 2, 5}, {dtype = "float64"})
    assert_close({-1, -1, 0, 2, 3}, t:clamp(-1, 3))
    assert_close({-1, -1, 0, 2, 5}, t:clamp(-1))
    assert_close({-3, -1, 0, 2, 3}, flow.clamp(t, nil, 3))
    assert.are.same({0, 0, 0, 2, 4}, flow.tensor({-3, -1, 0, 2, 5}):clamp(0, 4):totable())
  end)

  it("neg, abs, relu work on integers", function()
    local i = flow.tensor({-2, 0, 3})
    assert.are.same({2, 0, -3}, (-i):totable())
    assert.are.same({2, 0, 3}, i:abs():totable())
    assert.are.same({0, 0, 3}, i:relu():totable())
    local i32 = i:int():abs()
    assert.are.equal("int32", i32.dtype)
    assert.are.same({2, 0, 3}, i32:totable())
    assert.are.same({-2, 0, 3}, i:clamp(-5, 5):totable())
  end)
end)

describe("casts", function()
  it("convert between dtypes", function()
    local t = flow.tensor({-2.7, 0, 1.5, 2.7}, {dtype = "float64"})
    assert.are.equal("float32", t:float().dtype)
    assert.are.same({-2, 0, 1, 2}, t:long():totable())
    assert.are.equal("int64", t:long().dtype)
    assert.are.same({-2, 0, 1, 2}, t:int():totable())
    assert.are.same({true, false, true, true}, t:bool():totable())
    assert_close({-2.7, 0, 1.5, 2.7}, t:float():double(), 1e-7)
    assert.are.equal("float16", t:half().dtype)
    assert_close({-2.69921875, 0, 1.5, 2.69921875}, t:half():float())
    assert.are.equal("bfloat16", t:bfloat16().dtype)
    assert_close({-2.703125, 0, 1.5, 2.703125}, t:bfloat16():double())
    assert.are.same({1, 0, 1}, flow.tensor({true, false, true}):long():totable())
    assert.are.equal("float64", t:cast("float64").dtype)
  end)
end)

describe("in-place updates", function()
  it("add_, mul_, fill_, zero_, copy_ write into the tensor and return it", function()
    local t = flow.zeros({2, 3}, {dtype = "float64"})
    assert.are.equal(t, t:fill_(2))
    assert.are.equal(t, t:mul_(flow.tensor({1, 2, 3}, {dtype = "float64"})))
    assert.are.same({{2, 4, 6}, {2, 4, 6}}, t:totable())
    t:add_(1):mul_(0.5)
    assert.are.same({{1.5, 2.5, 3.5}, {1.5, 2.5, 3.5}}, t:totable())
    t:copy_(flow.tensor({{7}, {8}}))
    assert.are.same({{7, 7, 7}, {8, 8, 8}}, t:totable())
    t:zero_()
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, t:totable())
  end)

  it("write through a strided view", function()
    local t = flow.zeros({2, 2}, {dtype = "float32"})
    t:transpose(0, 1):fill_(3)
    assert.are.same({{3, 3}, {3, 3}}, t:totable())
  end)

  it("are refused on a tensor that requires grad, unless under no_grad", function()
    local w = flow.ones({3}, {dtype = "float64", requires_grad = true})
    for _, f in ipairs({function() w:mul_(2) end, function() w:fill_(1) end, function() w:zero_() end,
                        function() w:add_(1) end}) do
      assert.matches("in%-place operation on a tensor that requires grad", err_of(f))
    end
    flow.no_grad(function() w:mul_(3) end)
    assert.are.same({3, 3, 3}, w:totable())
  end)

  it("refuse a result that does not fit", function()
    local t = flow.zeros({3})
    assert.matches("mul_: cannot write a result of shape {2,3} into a tensor of shape {3}",
      err_of(function() t:mul_(flow.ones({2, 3})) end))
  end)
end)

describe("elementwise gradients (float64, central differences)", function()
  before_each(function() math.randomseed(3) end)
  local TOL = 1e-6

  it("of binary ops with broadcasting", function()
    for _, name in ipairs({"add", "sub", "mul", "maximum", "minimum"}) do
      assert(gradcheck(flow[name], {randt({2, 3}), randt({3})}) < TOL, name)
    end
    assert(gradcheck(flow.div, {randt({2, 3}), randt({2, 1}):abs() + 0.5}) < TOL)
    assert(gradcheck(flow.pow, {randt({2, 3}):abs() + 0.5, randt({1, 3})}) < TOL)
  end)

  it("of Lua numbers on either side", function()
    assert(gradcheck(function(x) return x ^ 3 end, {randt({4})}) < TOL)
    assert(gradcheck(function(x) return x ^ 2 end, {randt({4})}) < TOL)
    assert(gradcheck(function(x) return 2 ^ x end, {randt({4})}) < TOL)
    assert(gradcheck(function(x) return 1 - x / 3 end, {randt({4})}) < TOL)
    assert(gradcheck(function(x) return -x end, {randt({4})}) < TOL)
  end)

  it("of maximum at a tie: half to each side", function()
    local a = flow.tensor({1, 2}, {dtype = "float64", requires_grad = true})
    local b = flow.tensor({1, 3}, {dtype = "float64", requires_grad = true})
    flow.maximum(a, b):sum():backward()
    assert.are.same({0.5, 0}, a.grad:totable())
    assert.are.same({0.5, 1}, b.grad:totable())
  end)

  it("of pow at a zero base", function()
    local a = flow.tensor({0, 0}, {dtype = "float64", requires_grad = true})
    local b = flow.tensor({0, 2}, {dtype = "float64", requires_grad = true})
    flow.pow(a, b):sum():backward()
    assert.are.same({0, 0}, a.grad:totable())
    assert.are.same({0, 0}, b.grad:totable())
  end)

  it("of where and masked_fill", function()
    local cond = flow.tensor({{true, false, true}, {false, true, false}})
    assert(gradcheck(function(a, b) return flow.where(cond, a, b) end, {randt({2, 1}), randt({3})}) < TOL)
    assert(gradcheck(function(a) return a:masked_fill(cond, 5) end, {randt({2, 3})}) < TOL)
  end)

  it("of every unary op, also through a non-contiguous view", function()
    for _, name in ipairs({"neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu"}) do
      assert(gradcheck(flow[name], {randt({3, 4})}) < TOL, name)
      assert(gradcheck(function(x) return flow[name](x:transpose(0, 1)) end, {randt({2, 3})}) < TOL, name)
    end
    for _, name in ipairs({"log", "sqrt", "rsqrt"}) do
      assert(gradcheck(flow[name], {randt({3, 4}):abs() + 0.2}) < TOL, name)
    end
    assert(gradcheck(function(x) return x:clamp(-0.5, 0.5) end, {randt({3, 4})}) < TOL)
    assert(gradcheck(function(x) return x:clamp(nil, 0.2) end, {randt({3, 4})}) < TOL)
  end)

  it("of float32 ops, against float64 ones", function()
    local x = randt({5, 7})
    for _, name in ipairs({"exp", "tanh", "sigmoid", "gelu"}) do
      local x64 = x:detach():requires_grad_(true)
      local x32 = x:float():requires_grad_(true)
      flow[name](x64):sum():backward()
      flow[name](x32):sum():backward()
      assert_close(flat(x64.grad:totable()), x32.grad, 2e-6)
    end
  end)
end)

describe("elementwise errors", function()
  it("name the op and what was given", function()
    local f, d = flow.ones({2, 3}), flow.ones({2, 3}, {dtype = "float64"})
    assert.are.equal("float64", (f + d).dtype) -- promoted, as torch
    assert.matches("add: dtype mismatch: input 1 is float32, input 2 is float64",
      err_of(function() return flow._call("add", {}, f, d) end))
    assert.matches("mul: shapes {2,3} and {4} cannot be broadcast", err_of(function() return f * flow.ones({4}) end))
    assert.matches("sub: argument 2 must be a tensor %(got string%)", err_of(function() return f - "x" end))
    assert.matches("pow: argument 1 must be a tensor %(got nil%)", err_of(function() return flow.pow(nil, f) end))
    assert.matches("exp: input must be a floating%-point tensor %(got int64%)",
      err_of(function() return flow.tensor({1}):exp() end))
    assert.matches("clamp: give a min, a max or both", err_of(function() return f:clamp() end))
    assert.matches("clamp: min must be a number or nil %(got string%)", err_of(function() return f:clamp("a") end))
    assert.matches("where: the condition must be a bool tensor %(got float32;",
      err_of(function() return flow.where(f, f, f) end))
    assert.are.equal("float64", flow.where(f:gt(0), f, d).dtype) -- promoted, as torch
    assert.matches("where: dtype mismatch", err_of(function() return flow._call("where", {}, f:gt(0), f, d) end))
    assert.matches("masked_fill: the mask must be a bool tensor %(got int64;",
      err_of(function() return f:masked_fill(flow.tensor({1, 0, 1}), 0) end))
    assert.matches("sub: subtraction, the `%-` operator, with two bool tensors is not supported",
      err_of(function() return f:bool() - f:bool() end))
    assert.matches("pow: not implemented for bool tensors", err_of(function() return f:bool() ^ f:bool() end))
    assert.matches("clamp_min: min must be a number %(got no value%)", err_of(function() return f:clamp_min() end))
    assert.matches("clamp_max: max must be a number %(got string%)", err_of(function() return flow.clamp_max(f, "a") end))
    assert.matches("unknown dtype 'float8'", err_of(function() return f:cast("float8") end))
  end)

  it("integer division by zero raises torch's ZeroDivisionError, naming the op", function()
    local i, z = flow.tensor({7, -7}), flow.tensor({2, 0})
    assert.matches("floor_divide: ZeroDivisionError", err_of(function() return flow.floor_divide(i, z) end))
    assert.matches("remainder: ZeroDivisionError", err_of(function() return i % 0 end))
    assert.matches("fmod: ZeroDivisionError", err_of(function() return flow.fmod(i, z:int()) end))
    assert.matches("floor_divide: ZeroDivisionError", err_of(function() return i // z:expand({3, 2}) end))
    assert.matches("trunc_divide: ZeroDivisionError",
      err_of(function() return flow.div(i, z, {rounding_mode = "trunc"}) end))
    assert.matches("div: unknown option 'rounding'", err_of(function() return flow.div(i, z, {rounding = "floor"}) end))
    assert.matches("remainder: unknown option 'x'", err_of(function() return flow.remainder(i, 2, {x = 1}) end))
    assert.are.same({math.huge, -math.huge}, flow.floor_divide(flow.tensor({1.0, -1.0}), 0):totable()) -- floats: IEEE
  end)
end)
