local flow = require "flow"
local G = require "support.gradcheck"

local randt, gradcheck, flat = G.randt, G.gradcheck, G.flat

local err_of = G.err_of

describe("transpose and permute", function()
  before_each(function() math.randomseed(1) end)

  it("transpose swaps two axes without copying", function()
    local t = randt({2, 3, 4})
    local a, b = t:totable(), t:transpose(0, -1)
    assert.are.same({4, 3, 2}, b:shape())
    assert.are.same({1, 4, 12}, b:stride())
    assert.is_false(b:is_contiguous())
    local bv = b:totable()
    for i = 1, 2 do for j = 1, 3 do for k = 1, 4 do assert.are.equal(a[i][j][k], bv[k][j][i]) end end end
  end)

  it("permute reorders axes and their strides", function()
    local t = randt({2, 3, 4})
    local p = flow.permute(t, {2, 0, 1})
    assert.are.same({4, 2, 3}, p:shape())
    assert.are.same({1, 12, 4}, p:stride())
    local a, pv = t:totable(), p:totable()
    for i = 1, 2 do for j = 1, 3 do for k = 1, 4 do assert.are.equal(a[i][j][k], pv[k][i][j]) end end end
    assert.are.same({4, 2, 3}, t:permute({-1, 0, 1}):shape())
  end)

  it("shares storage with its base", function()
    local t = flow.zeros({2, 3})
    t:transpose(0, 1):narrow(0, 2, 1):copy_(flow.tensor({{7, 8}}))
    assert.are.same({{0, 0, 7}, {0, 0, 8}}, t:totable())
  end)

  it("rejects bad axes and permutations", function()
    local t = flow.zeros({2, 3})
    assert.matches("transpose: axis 2 out of range", err_of(flow.transpose, t, 0, 2))
    assert.matches("permute: dims {0,0} are not a permutation of the 2 axes of a tensor of shape {2,3}",
                   err_of(flow.permute, t, {0, 0}))
    assert.matches("permute: dims {1,0,2} are not a permutation", err_of(flow.permute, t, {1, 0, 2}))
  end)

  it("has the inverse permutation as gradient", function()
    assert.is_true(gradcheck(function(x) return x:permute({1, 2, 0}) end, {randt({2, 3, 4})}) < 1e-8)
    assert.is_true(gradcheck(function(x) return x:transpose(0, 1) * 1 end, {randt({3, 2})}) < 1e-8)
  end)
end)

describe("narrow and select", function()
  before_each(function() math.randomseed(2) end)

  it("narrow is a window sharing storage", function()
    local t = randt({3, 5})
    local n = t:narrow(1, 1, 3)
    assert.are.same({3, 3}, n:shape())
    assert.are.same({5, 1}, n:stride())
    assert.are.equal(1, n:storage_offset())
    local a, nv = t:totable(), n:totable()
    for i = 1, 3 do for j = 1, 3 do assert.are.equal(a[i][j + 1], nv[i][j]) end end
    assert.are.same(t:narrow(1, -2, 2):totable(), t:narrow(1, 3, 2):totable())
    n:copy_(flow.zeros({3, 3}, {dtype = "float64"}))
    assert.are.same({a[2][1], 0, 0, 0, a[2][5]}, t:totable()[2])
  end)

  it("select drops the axis; negative indices count from the end", function()
    local t = randt({3, 4})
    local a = t:totable()
    assert.are.same(a[2], t:select(0, 1):totable())
    local col = flow.select(t, 1, -1)
    assert.are.same({3}, col:shape())
    assert.are.same({a[1][4], a[2][4], a[3][4]}, col:totable())
    assert.are.equal(a[3][2], t:select(0, 2):select(0, 1):item())
  end)

  it("rejects windows past the end", function()
    local t = flow.zeros({2, 5})
    assert.matches("narrow: start 3 %+ length 3 goes past the end of axis 1 %(size 5", err_of(flow.narrow, t, 1, 3, 3))
    assert.matches("narrow: start 6 out of range", err_of(flow.narrow, t, 1, 6, 0))
    assert.matches("narrow: axis 2 out of range", err_of(flow.narrow, t, 2, 0, 1))
    assert.matches("narrow: negative length %-1", err_of(flow.narrow, t, 0, 0, -1))
    assert.matches("select: index 2 out of range for axis 0 of size 2", err_of(flow.select, t, 0, 2))
    assert.matches("select: index %-6 out of range", err_of(flow.select, t, 1, -6))
  end)

  it("scatters the gradient into zeros of the input's shape", function()
    assert.is_true(gradcheck(function(x) return x:narrow(1, 1, 2) end, {randt({3, 4})}) < 1e-8)
    assert.is_true(gradcheck(function(x) return x:select(0, -1) end, {randt({3, 4})}) < 1e-8)
    -- two overlapping windows of one input: gradients add
    assert.is_true(gradcheck(function(x) return x:narrow(0, 0, 2) + x:narrow(0, 1, 2) end, {randt({3, 2})}) < 1e-8)
  end)
end)

describe("squeeze, unsqueeze, flatten, contiguous", function()
  before_each(function() math.randomseed(3) end)

  it("squeeze drops size-1 axes: all, or the one asked for", function()
    local t = flow.zeros({1, 3, 1, 2})
    assert.are.same({3, 2}, t:squeeze():shape())
    assert.are.same({1, 3, 2}, t:squeeze(2):shape())
    assert.are.same({1, 3, 1, 2}, t:squeeze(1):shape())
    assert.matches("squeeze: axis 4 out of range", err_of(flow.squeeze, t, 4))
  end)

  it("unsqueeze inserts an axis, counting negatives over the new rank", function()
    local t = randt({2, 3})
    assert.are.same({1, 2, 3}, t:unsqueeze(0):shape())
    assert.are.same({2, 3, 1}, t:unsqueeze(-1):shape())
    assert.are.same({2, 1, 3}, flow.unsqueeze(t, 1):shape())
    assert.are.same(t:totable(), t:unsqueeze(1):squeeze(1):totable())
    assert.matches("unsqueeze: axis 3 out of range", err_of(flow.unsqueeze, t, 3))
  end)

  it("flatten merges a run of axes, viewing when it can and copying when it must", function()
    local t = randt({2, 3, 4})
    local f = t:flatten()
    assert.are.same({24}, f:shape())
    assert.are.same(flat(t:totable()), f:totable())
    assert.are.same({2, 12}, t:flatten(1):shape())
    assert.are.same({6, 4}, t:flatten(0, 1):shape())
    f:narrow(0, 0, 1):copy_(flow.tensor({5}, {dtype = "float64"}))
    assert.are.equal(5, t:totable()[1][1][1])
    local tt = t:transpose(0, 2)         -- [4,3,2], not viewable as [24]
    local g = tt:flatten()
    assert.are.same(flat(tt:totable()), g:totable())
    assert.matches("flatten: start axis 2 comes after end axis 1", err_of(flow.flatten, t, 2, 1))
  end)

  it("contiguous copies a strided tensor into row-major order", function()
    local tt = randt({2, 3}):transpose(0, 1)
    local c = flow.contiguous(tt)
    assert.is_true(c:is_contiguous())
    assert.are.same({2, 1}, c:stride())
    assert.are.same(tt:totable(), c:totable())
  end)

  it("carries gradients through", function()
    assert.is_true(gradcheck(function(x) return x:transpose(0, 1):flatten() end, {randt({2, 3})}) < 1e-8)
    assert.is_true(gradcheck(function(x) return x:unsqueeze(1):squeeze() end, {randt({2, 3})}) < 1e-8)
  end)
end)

describe("cat and stack", function()
  before_each(function() math.randomseed(4) end)

  it("cat lays tensors end to end along an axis", function()
    local a, b = flow.tensor({{1, 2}, {3, 4}}), flow.tensor({{5}, {6}})
    assert.are.same({{1, 2, 5}, {3, 4, 6}}, flow.cat({a, b}, 1):totable())
    assert.are.same({{1, 2}, {3, 4}, {1, 2}, {3, 4}}, flow.cat({a, a}):totable())
    assert.are.same({{1, 2}, {3, 4}}, flow.cat({a, flow.zeros({0, 2}, {dtype = "int64"})}):totable())
    -- strided inputs
    assert.are.same({{1, 3}, {2, 4}, {5, 6}}, flow.cat({a:transpose(0, 1), b:transpose(0, 1)}, 0):totable())
  end)

  it("stack adds a new axis", function()
    local a, b = flow.tensor({1, 2, 3}), flow.tensor({4, 5, 6})
    assert.are.same({{1, 2, 3}, {4, 5, 6}}, flow.stack({a, b}):totable())
    assert.are.same({{1, 4}, {2, 5}, {3, 6}}, flow.stack({a, b}, -1):totable())
  end)

  it("rejects mismatched shapes; promotes mixed dtypes, as torch", function()
    local a = flow.zeros({2, 3})
    assert.matches("cat: shapes {2,3} %(input 1%) and {2,4} %(input 2%) differ outside the concatenation axis 0",
                   err_of(flow.cat, {a, flow.zeros({2, 4})}, 0))
    assert.are.equal("float64", flow.cat({a, flow.zeros({2, 3}, {dtype = "float64"})}).dtype)
    assert.matches("cat: dtype mismatch: input 1 is float32, input 2 is float64",
                   err_of(flow._call, "cat", {axis = 0}, a, flow.zeros({2, 3}, {dtype = "float64"})))
    assert.matches("cat: axis 2 out of range", err_of(flow.cat, {a, a}, 2))
    assert.matches("cat: element 2 of the list must be a tensor", err_of(flow.cat, {a, 3}))
    assert.matches("cat: needs at least one tensor", err_of(flow.cat, {}))
    assert.matches("stack: all tensors must have the same shape: {2,3} %(input 1%) and {3,2}",
                   err_of(flow.stack, {a, flow.zeros({3, 2})}))
  end)

  it("hands each input its window of the gradient", function()
    assert.is_true(gradcheck(function(x, y) return flow.cat({x, y, x}, 1) end, {randt({2, 3}), randt({2, 1})}) < 1e-8)
    assert.is_true(gradcheck(function(x, y) return flow.stack({x, y}, 1) end, {randt({2, 3}), randt({2, 3})}) < 1e-8)
  end)
end)

describe("split and chunk", function()
  before_each(function() math.randomseed(5) end)

  local function shapes(list)
    local s = {}
    for i, t in ipairs(list) do s[i] = t:shape() end
    return s
  end

  it("split by a size or a list of sizes", function()
    local t = randt({5, 2})
    assert.are.same({{2, 2}, {2, 2}, {1, 2}}, shapes(t:split(2)))
    assert.are.same({{5, 1}, {5, 1}}, shapes(flow.split(t, 1, 1)))
    local p = t:split({1, 4})
    assert.are.same({{1, 2}, {4, 2}}, shapes(p))
    assert.are.same(t:totable()[5], p[2]:totable()[4])
    assert.matches("split: sizes sum to 4 but axis 0 has size 5", err_of(flow.split, t, {1, 3}))
  end)

  it("chunk makes at most n pieces of ceil(size / n)", function()
    local t = randt({5})
    assert.are.same({{2}, {2}, {1}}, shapes(t:chunk(3)))
    assert.are.same({{3}, {2}}, shapes(t:chunk(2)))
    assert.are.same({{1}, {1}, {1}, {1}, {1}}, shapes(t:chunk(9)))
  end)

  it("pieces are views of the input", function()
    local t = flow.zeros({4})
    t:chunk(2)[2]:copy_(flow.tensor({1, 2}))
    assert.are.same({0, 0, 1, 2}, t:totable())
  end)

  it("carries gradients through the pieces", function()
    local f = function(x)
      local p = x:split({1, 2}, 1)
      return flow.cat({p[2], p[1]}, 1)
    end
    assert.is_true(gradcheck(f, {randt({2, 3})}) < 1e-8)
  end)
end)

describe("tril and triu", function()
  before_each(function() math.randomseed(6) end)

  local function masked(v, k, upper)
    local out = {}
    for b, m in ipairs(v) do
      out[b] = {}
      for i, row in ipairs(m) do
        out[b][i] = {}
        for j, x in ipairs(row) do
          local keep = upper and (j - i >= k) or (not upper and j - i <= k)
          out[b][i][j] = keep and x or 0
        end
      end
    end
    return out
  end

  it("keep the lower or upper triangle of the last two axes, batched", function()
    local t = randt({2, 3, 4})
    for _, k in ipairs({-2, -1, 0, 1, 3, 100}) do
      assert.are.same(masked(t:totable(), k, false), flow.tril(t, k):totable())
      assert.are.same(masked(t:totable(), k, true), t:triu(k):totable())
    end
    assert.are.same({{1, 0}, {1, 1}}, flow.tril(flow.ones({2, 2}, {dtype = "int64"})):totable())
  end)

  it("work on strided input", function()
    local t = randt({3, 3})
    assert.are.same(masked({t:transpose(0, 1):totable()}, 0, true)[1], t:transpose(0, 1):triu():totable())
  end)

  it("need two dimensions", function()
    assert.matches("tril: needs a tensor of at least 2 dimensions %(got shape {3}%)", err_of(flow.tril, flow.zeros({3})))
  end)

  it("mask the gradient the same way", function()
    assert.is_true(gradcheck(function(x) return x:tril(-1) end, {randt({2, 3, 3})}) < 1e-8)
    assert.is_true(gradcheck(function(x) return x:triu(1) end, {randt({3, 4})}) < 1e-8)
  end)
end)

describe("tril/triu through the registry", function()
  it("the op itself says which triangle is kept", function()
    local x = flow.tensor({{1, 2}, {3, 4}}, {dtype = "float32"})
    assert.are.same({{1, 2}, {0, 4}}, flow._call("triu", {}, x):totable())
    assert.are.same({{1, 0}, {3, 4}}, flow._call("tril", {}, x):totable())
  end)
end)
