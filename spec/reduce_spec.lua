-- Reductions: sum, mean, var over any axes (keepdim, negative axes, strided inputs), max/min with
-- indices, argmax/argmin, amax/amin; values against plain Lua loops, float32 accuracy, gradients against
-- central finite differences, and the error messages.
local flow = require "flow"
local G = require "support.gradcheck"

local randt, gradcheck, flat = G.randt, G.gradcheck, G.flat

local err_of = G.err_of

local function assert_close(want, t, tol)
  tol = tol or 1e-12
  local got = type(t) == "number" and {t} or flat(t:totable())
  assert.are.equal(#want, #got)
  for k = 1, #want do
    assert(math.abs(got[k] - want[k]) <= tol * math.max(1, math.abs(want[k])),
      ("element %d: want %.12g, got %.12g"):format(k, want[k], got[k]))
  end
end

-- Reduce a nested 3-d table v of shape {A, B, C} over the axes marked in `over` ({true,false,true})
-- with f(list) -> number; the result is flat, in row-major order of the kept axes.
local function lua_reduce(v, shape, over, f)
  local groups, order = {}, {}
  for i = 1, shape[1] do
    for j = 1, shape[2] do
      for k = 1, shape[3] do
        local key = table.concat({over[1] and 0 or i, over[2] and 0 or j, over[3] and 0 or k}, ",")
        if not groups[key] then groups[key] = {}; order[#order + 1] = key end
        table.insert(groups[key], v[i][j][k])
      end
    end
  end
  local out = {}
  for n, key in ipairs(order) do out[n] = f(groups[key]) end
  return out
end

local function lsum(l) local s = 0; for _, x in ipairs(l) do s = s + x end; return s end
local function lmean(l) return lsum(l) / #l end
local function lvar(unbiased)
  return function(l)
    local m, s = lmean(l), 0
    for _, x in ipairs(l) do s = s + (x - m) ^ 2 end
    return s / (#l - (unbiased and 1 or 0))
  end
end

local AXES = {
  {axes = nil, over = {true, true, true}},
  {axes = 1, over = {false, true, false}},
  {axes = -1, over = {false, false, true}},
  {axes = {0, 2}, over = {true, false, true}},
  {axes = {-3, 1}, over = {true, true, false}},
}

describe("sum, mean and var", function()
  before_each(function() math.randomseed(11) end)

  it("reduce any axes, with and without keepdim, in float64", function()
    local t = randt({2, 3, 4})
    local v = t:totable()
    for _, c in ipairs(AXES) do
      assert_close(lua_reduce(v, {2, 3, 4}, c.over, lsum), t:sum(c.axes))
      assert_close(lua_reduce(v, {2, 3, 4}, c.over, lmean), flow.mean(t, c.axes))
      assert_close(lua_reduce(v, {2, 3, 4}, c.over, lvar(true)), t:var(c.axes))
      assert_close(lua_reduce(v, {2, 3, 4}, c.over, lvar(false)), t:var(c.axes, false, false))
      local keep = t:mean(c.axes, true):shape()
      for d = 1, 3 do assert.are.equal(c.over[d] and 1 or ({2, 3, 4})[d], keep[d]) end
    end
    assert.are.same({}, t:sum():shape())
    assert.are.same({2, 4}, t:var(1):shape())
  end)

  it("read strided inputs: a transposed view and an expand", function()
    local t = randt({3, 4})
    local tt = t:transpose(0, 1) -- {4, 3}
    local v = t:totable()
    local want = {}
    for j = 1, 4 do want[j] = v[1][j] + v[2][j] + v[3][j] end
    assert_close(want, tt:sum(1))
    local e = flow.expand(flow.tensor({{1}, {2}}, {dtype = "float64"}), {2, 5})
    assert_close({5, 10}, e:sum(1))
    assert_close({1.5, 1.5, 1.5, 1.5, 1.5}, e:mean(0))
    assert_close({0.25 * 10 / 9}, e:var())
  end)

  it("sum integers and bools into int64", function()
    local i = flow.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.equal("int64", i:sum().dtype)
    assert.are.equal(21, i:sum():item())
    assert.are.same({5, 7, 9}, i:sum(0):totable())
    assert.are.same({6, 15}, i:int():sum(1):totable())
    assert.are.equal("int64", i:int():sum().dtype)
    local b = flow.tensor({true, false, true, true})
    assert.are.equal(3, b:sum():item())
  end)

  it("accumulate float32 accurately", function()
    local n = 1000000
    local x = flow.full({n}, 0.1, {dtype = "float32"})
    local f = x:totable()[1] -- 0.1 rounded to float32
    -- one float32 rounding of the exact result (a float32 running sum would be off by ~1%)
    assert_close({n * f}, x:sum(), 1e-7)
    assert_close({f}, x:mean(), 1e-7)
    local cols = flow.full({100000, 2}, 0.1, {dtype = "float32"})
    assert_close({100000 * f, 100000 * f}, cols:sum(0), 1e-7)
    local shifted = flow.tensor({10000.5, 10001.5, 10002.5, 10003.5}, {dtype = "float32"})
    assert_close({5 / 3}, shifted:var(), 1e-7)
  end)

  it("sum leading axes of large inputs (rows in blocks) as the last axis of the transpose sums", function()
    flow.manual_seed(12)
    -- rows not a multiple of the block, two leading axes (a bias gradient of [B, T, C]), integers
    local cases = { flow.randn({300, 40}), flow.randn({4, 130, 257}), flow.randn({300, 40}, {dtype = "float64"}) }
    for _, x in ipairs(cases) do
      local C = x:shape()[x:dim()]
      local rows = x:reshape({-1, C})
      local want = rows:transpose(0, 1):contiguous():sum(1)
      local axes = x:dim() == 3 and {0, 1} or 0
      assert_close(want:totable(), x:sum(axes), 1e-6)
      assert_close((want / rows:shape()[1]):totable(), x:mean(axes), 1e-6)
    end
    local i = flow.randint(-1000, 1000, {300, 64})
    assert.are.same(i:transpose(0, 1):contiguous():sum(1):totable(), i:sum(0):totable())
  end)

  it("var of one element is nan when unbiased, 0 when biased; of none, nan", function()
    local one = flow.tensor({3}, {dtype = "float64"})
    local v = one:var():item()
    assert.is_true(v ~= v)
    assert.are.equal(0, one:var(nil, false, false):item())
    local none = flow.zeros({0}, {dtype = "float64"}):var():item()
    assert.is_true(none ~= none)
  end)
end)

describe("max, min, argmax, argmin", function()
  local t = flow.tensor({{3, 7, 7}, {9, -1, 2}}, {dtype = "float32"})

  it("without an axis give the extreme element (0-d)", function()
    assert.are.equal(9, t:max():item())
    assert.are.equal(-1, flow.min(t):item())
    assert.are.same({}, t:max():shape())
    assert.are.equal(3, t:argmax():item()) -- flat index
    assert.are.equal(4, t:argmin():item())
  end)

  it("along an axis give values and int64 indices; ties pick the first", function()
    local v, i = t:max(1)
    assert.are.same({7, 9}, v:totable())
    assert.are.same({1, 0}, i:totable())
    assert.are.equal("int64", i.dtype)
    v, i = t:min(0, true)
    assert.are.same({{3, -1, 2}}, v:totable())
    assert.are.same({{0, 1, 1}}, i:totable())
    assert.are.same({1, 0}, t:argmax(-1):totable())
    assert.are.same({{0}, {1}}, t:argmin(1, true):totable())
  end)

  it("read strided inputs and integer dtypes", function()
    local tt = t:transpose(0, 1) -- {{3, 9}, {7, -1}, {7, 2}}
    local v, i = tt:max(1)
    assert.are.same({9, 7, 7}, v:totable())
    assert.are.same({1, 0, 0}, i:totable())
    local a = flow.tensor({{5, 1}, {2, 8}})
    v, i = a:min(0)
    assert.are.equal("int64", v.dtype)
    assert.are.same({2, 1}, v:totable())
    assert.are.same({1, 0}, i:totable())
    assert.are.equal(8, a:int():max():item())
  end)

  it("with two tensors are maximum and minimum", function()
    local u = flow.tensor({{4, 4, 4}}, {dtype = "float32"})
    assert.are.same({{4, 7, 7}, {9, 4, 4}}, t:max(u):totable())
    assert.are.same({{3, 4, 4}, {4, -1, 2}}, flow.min(t, u):totable())
  end)

  it("treat NaN as the extreme", function()
    local n = flow.tensor({1, 0 / 0, 3}, {dtype = "float64"})
    local m = n:max():item()
    assert.is_true(m ~= m)
    assert.are.equal(1, n:argmin():item())
  end)

  it("agree with a Lua loop on a larger random tensor", function()
    math.randomseed(5)
    local r = randt({4, 5, 6})
    local v = r:totable()
    local vals, idx = r:max(1)
    vals, idx = vals:totable(), idx:totable()
    for a = 1, 4 do
      for c = 1, 6 do
        local best, bi = -math.huge, nil
        for b = 1, 5 do if v[a][b][c] > best then best, bi = v[a][b][c], b - 1 end end
        assert.are.equal(best, vals[a][c])
        assert.are.equal(bi, idx[a][c])
      end
    end
  end)
end)

describe("reduction gradients (float64, central differences)", function()
  before_each(function() math.randomseed(13) end)
  local TOL = 1e-6

  it("of sum, mean and var over various axes", function()
    for _, c in ipairs(AXES) do
      assert(gradcheck(function(x) return x:sum(c.axes) end, {randt({2, 3, 2})}) < TOL)
      assert(gradcheck(function(x) return x:mean(c.axes, true) end, {randt({2, 3, 2})}) < TOL)
      assert(gradcheck(function(x) return x:var(c.axes) end, {randt({2, 3, 2})}) < TOL)
      assert(gradcheck(function(x) return x:var(c.axes, true, false) end, {randt({2, 3, 2})}) < TOL)
    end
    assert(gradcheck(function(x) return x:transpose(0, 1):mean(1) end, {randt({3, 4})}) < TOL)
  end)

  it("of max and min: to the selected element", function()
    assert(gradcheck(function(x) return (x:max(1)) end, {randt({3, 4})}) < TOL)
    assert(gradcheck(function(x) return (x:min(0, true)) end, {randt({3, 4})}) < TOL)
    assert(gradcheck(function(x) return x:max() end, {randt({2, 3})}) < TOL)
    assert(gradcheck(function(x) return (x:transpose(0, 1):min(-1)) end, {randt({3, 4})}) < TOL)
    local x = flow.tensor({{1, 5, 5}}, {dtype = "float64", requires_grad = true})
    x:max():backward() -- over everything the ties share the gradient, as torch
    assert.are.same({{0, 0.5, 0.5}}, x.grad:totable())
    local y = flow.tensor({{1, 5, 5}}, {dtype = "float64", requires_grad = true})
    flow.sum((y:max(1))):backward() -- along an axis it goes to the index returned
    assert.are.same({{0, 1, 0}}, y.grad:totable())
  end)
end)

describe("reduction errors", function()
  local t = flow.ones({2, 3})
  it("name the op and what was given", function()
    assert.matches("sum: axis 2 out of range for a tensor of 2 dimensions %(expected %-2..1%)",
      err_of(function() return t:sum(2) end))
    assert.matches("mean: axis %-1 given twice", err_of(function() return t:mean({1, -1}) end))
    assert.matches("var: axis %-3 out of range", err_of(function() return t:var({0, -3}) end))
    assert.matches("max: axis 5 out of range", err_of(function() return t:max(5) end))
    assert.matches("argmin: axis must be an integer or nil %(got table%)", err_of(function() return t:argmin({0}) end))
    assert.matches("mean: expected a floating%-point tensor %(got int64",
      err_of(function() return flow.tensor({1, 2}):mean() end))
    assert.matches("max: cannot reduce an empty axis", err_of(function() return flow.zeros({2, 0}):max(1) end))
    assert.matches("sum: argument 1 must be a tensor %(got number%)", err_of(function() return flow.sum(3) end))
    assert.matches("sum: axes must be an integer or a list %(got string%)", err_of(function() return t:sum("x") end))
  end)

  it("sort and topk name themselves, the axis, k and unknown options", function()
    assert.matches("sort: axis 2 out of range", err_of(function() return t:sort(2) end))
    assert.matches("sort: unknown option 'desc' %(expected descending, stable%)", err_of(function() return t:sort(0, {desc = true}) end))
    assert.matches("argsort: unknown option 'reverse'", err_of(function() return flow.argsort(t, 0, {reverse = true}) end))
    assert.matches("topk: k = 4 is out of range for axis %-1 of size 3 %(expected 0 <= k <= 3%)", err_of(function() return t:topk(4) end))
    assert.matches("topk: k = %-1 is out of range", err_of(function() return t:topk(-1, 0) end))
    assert.matches("topk: unknown option 'dim'", err_of(function() return t:topk(1, 0, {dim = 1}) end))
    assert.matches("topk: sorted must be a boolean %(got string%)", err_of(function() return t:topk(1, 0, true, "yes") end))
  end)

  it("amax and amin name themselves, the axis and unknown options", function()
    assert.matches("amax: axis 2 out of range", err_of(function() return t:amax(2) end))
    assert.matches("amin: axis %-1 given twice", err_of(function() return t:amin({1, -1}) end))
    assert.matches("amax: unknown option 'dim' %(expected keepdim%)", err_of(function() return t:amax(0, {dim = 1}) end))
    assert.matches("amin: options must be a table %(got number%)", err_of(function() return t:amin(0, 1) end))
    assert.matches("amax: cannot reduce axis 1 of size 0 %(shape {2,0}%)", err_of(function() return flow.zeros({2, 0}):amax() end))
    assert.matches("amax: argument 1 must be a tensor %(got nil%)", err_of(function() return flow.amax(nil) end))
  end)
end)

describe("amax and amin", function()
  it("reduce several axes at once, keeping the input's dtype", function()
    local x = flow.tensor({{{1, 7}, {3, -4}}, {{9, 2}, {0, 5}}}, {dtype = "int32"})
    assert.same({9, 5}, x:amax({0, 2}):totable())
    assert.same({{{1}, {-4}}}, flow.amin(x, {0, -1}, true):totable())
    assert.are.equal("int32", x:amax().dtype)
  end)

  it("split the gradient evenly among ties; a NaN slice gets NaN", function()
    local x = flow.tensor({{2.0, 2.0, 1.0}, {0 / 0, 1.0, 3.0}}, {dtype = "float64", requires_grad = true})
    flow.sum(x:amax(1)):backward()
    local g = x.grad:totable()
    assert.same({0.5, 0.5, 0.0}, g[1])
    for _, v in ipairs(g[2]) do assert(v ~= v) end
  end)

  it("have gradients matching finite differences", function()
    gradcheck(function(x) return flow.amax(x, {0, 2}) end, {randt({2, 3, 2})})
    gradcheck(function(x) return x:amin(-1, true) end, {randt({3, 4})})
  end)
end)
