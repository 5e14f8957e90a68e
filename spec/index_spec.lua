local flow = require "flow"
local G = require "support.gradcheck"

local randt, gradcheck = G.randt, G.gradcheck

local function long(v) return flow.tensor(v, {dtype = "int64"}) end

local err_of = G.err_of

describe("embedding", function()
  before_each(function() math.randomseed(11) end)

  it("looks up rows for ids of any shape", function()
    local w = randt({4, 3})
    local wv = w:totable()
    local ids = long({{3, 0}, {1, 3}})
    local out = flow.embedding(ids, w)
    assert.are.same({2, 2, 3}, out:shape())
    assert.are.same({{wv[4], wv[1]}, {wv[2], wv[4]}}, out:totable())
    assert.are.same({wv[3]}, long({2}):embedding(w):totable())
    assert.are.same(wv[2], flow.embedding(long(1), w):totable())
    -- a strided weight
    local wt = randt({3, 4}):transpose(0, 1)
    assert.are.same(wt:totable()[3], flow.embedding(long({2}), wt):totable()[1])
  end)

  it("scatter-adds the gradient into the rows used, repeated ids adding up", function()
    local ids = long({{1, 3, 1}, {0, 1, 1}})
    assert.is_true(gradcheck(function(w) return flow.embedding(ids, w) end, {randt({5, 2})}) < 1e-8)
    local w = flow.zeros({4, 2}, {dtype = "float64"})
    w:requires_grad_(true)
    flow.embedding(long({1, 1, 2}), w):backward(flow.ones({3, 2}, {dtype = "float64"}))
    assert.are.same({{0, 0}, {2, 2}, {1, 1}, {0, 0}}, w.grad:totable())
    -- float32 rows of 37 (a vector loop and a tail): row r of the gradient is r + col / 64, so the
    -- sums are exact in float32
    local w32 = flow.zeros({3, 37}, {requires_grad = true})
    local g = flow.arange(0, 4, 1):reshape({4, 1}) + flow.arange(0, 37, 1):reshape({1, 37}) / 64
    flow.embedding(long({2, 0, 2, 2}), w32):backward(g)
    local got = w32.grad:totable()
    for c = 1, 37 do
      assert.are.equal(1 + (c - 1) / 64, got[1][c])             -- id 0: row 1
      assert.are.equal(0, got[2][c])                            -- id 1: unused
      assert.are.equal(0 + 2 + 3 + 3 * (c - 1) / 64, got[3][c]) -- id 2: rows 0, 2, 3
    end
  end)

  it("checks ids", function()
    local w = flow.zeros({4, 3})
    assert.matches("embedding: index 4 out of range %[0, 4%)", err_of(flow.embedding, long({0, 4}), w))
    assert.matches("embedding: index %-1 out of range %[0, 4%)", err_of(flow.embedding, long({-1}), w))
    assert.matches("embedding: ids must be an int64 tensor %(got float32%)", err_of(flow.embedding, flow.zeros({2}), w))
    assert.matches("embedding: weight must be 2%-D", err_of(flow.embedding, long({0}), flow.zeros({4})))
  end)
end)

describe("index_select", function()
  before_each(function() math.randomseed(12) end)

  it("picks entries along an axis, repeats allowed", function()
    local t = randt({3, 4})
    local v = t:totable()
    assert.are.same({v[3], v[1], v[3]}, flow.index_select(t, 0, long({2, 0, 2})):totable())
    local cols = t:index_select(-1, long({1, 1}))
    assert.are.same({3, 2}, cols:shape())
    for i = 1, 3 do assert.are.same({v[i][2], v[i][2]}, cols:totable()[i]) end
  end)

  it("adds the gradient back at the picked positions", function()
    local idx = long({2, 0, 2, 3})
    assert.is_true(gradcheck(function(x) return x:index_select(1, idx) end, {randt({2, 4, 3})}) < 1e-8)
  end)

  it("checks the index", function()
    local t = flow.zeros({3, 4})
    assert.matches("index_select: index 4 out of range %[0, 4%) on axis 1", err_of(flow.index_select, t, 1, long({0, 4})))
    assert.matches("index_select: index must be 1%-D", err_of(flow.index_select, t, 0, long({{0}})))
    assert.matches("index_select: axis 2 out of range", err_of(flow.index_select, t, 2, long({0})))
  end)
end)

describe("gather", function()
  before_each(function() math.randomseed(13) end)

  it("follows torch.gather: out[i][j] = t[i][idx[i][j]] on axis 1", function()
    local t = flow.tensor({{1, 2, 3}, {4, 5, 6}})
    assert.are.same({{3, 1, 1}, {5, 5, 4}}, flow.gather(t, 1, long({{2, 0, 0}, {1, 1, 0}})):totable())
    assert.are.same({{4, 2, 6}}, t:gather(0, long({{1, 0, 1}})):totable())
    -- an index smaller than the input outside the axis
    assert.are.same({{2}}, t:gather(1, long({{1}})):totable())
  end)

  it("matches a Lua loop in 3-D", function()
    local t = randt({2, 3, 4})
    local idx = {}
    for i = 1, 2 do idx[i] = {} for j = 1, 5 do idx[i][j] = {} for k = 1, 4 do idx[i][j][k] = math.random(0, 2) end end end
    local got, tv = t:gather(1, long(idx)):totable(), t:totable()
    for i = 1, 2 do for j = 1, 5 do for k = 1, 4 do
      assert.are.equal(tv[i][idx[i][j][k] + 1][k], got[i][j][k])
    end end end
  end)

  it("scatter-adds its gradient", function()
    local idx = long({{0, 2, 2, 1}, {1, 1, 0, 0}})
    assert.is_true(gradcheck(function(x) return x:gather(1, idx) end, {randt({2, 3})}) < 1e-8)
  end)

  it("checks the index", function()
    local t = flow.zeros({2, 3})
    assert.matches("gather: index 3 out of range %[0, 3%) on axis 1", err_of(flow.gather, t, 1, long({{0}, {3}})))
    assert.matches("gather: index of shape {3,1} does not fit the input of shape {2,3}", err_of(flow.gather, t, 1, long({{0}, {0}, {0}})))
    assert.matches("gather: index must be an int64 tensor", err_of(flow.gather, t, 1, flow.zeros({2, 1})))
  end)
end)

describe("scatter_add", function()
  before_each(function() math.randomseed(14) end)

  it("adds src into a copy of t at the indexed positions", function()
    local t = flow.zeros({2, 3})
    local src = flow.tensor({{1, 2, 3}, {4, 5, 6}}, {dtype = "float32"})
    local idx = long({{0, 2, 0}, {1, 1, 2}})
    assert.are.same({{4, 0, 2}, {0, 9, 6}}, flow.scatter_add(t, 1, idx, src):totable())
    assert.are.same({{0, 0, 0}, {0, 0, 0}}, t:totable()) -- out of place
    assert.are.same({{1, 5, 3}, {4, 2, 6}}, t:scatter_add(0, long({{0, 1, 0}, {1, 0, 1}}), src):totable())
  end)

  it("matches a Lua loop on axis 0", function()
    local t, src = randt({3, 2}), randt({4, 2})
    local idx = {}
    for i = 1, 4 do idx[i] = {math.random(0, 2), math.random(0, 2)} end
    local want, sv = t:totable(), src:totable()
    for i = 1, 4 do for j = 1, 2 do
      local r = idx[i][j] + 1
      want[r][j] = want[r][j] + sv[i][j]
    end end
    local got = flow.scatter_add(t, 0, long(idx), src):totable()
    for i = 1, 3 do for j = 1, 2 do assert.is_true(math.abs(got[i][j] - want[i][j]) < 1e-12) end end
  end)

  it("passes the gradient to t and gathers it for src", function()
    local idx = long({{0, 2, 2}, {1, 0, 0}})
    local f = function(t, src) return flow.scatter_add(t, 1, idx, src) end
    assert.is_true(gradcheck(f, {randt({2, 4}), randt({2, 3})}) < 1e-8)
  end)

  it("checks its inputs", function()
    local t = flow.zeros({2, 3})
    assert.matches("scatter_add: index %-1 out of range %[0, 3%) on axis 1",
                   err_of(flow.scatter_add, t, 1, long({{-1}}), flow.zeros({1, 1})))
    assert.matches("scatter_add: index shape {1,1} and src shape {1,2} must be equal",
                   err_of(flow.scatter_add, t, 1, long({{0}}), flow.zeros({1, 2})))
    assert.matches("scatter_add: dtype mismatch: input is float32, src is float64",
                   err_of(flow.scatter_add, t, 1, long({{0}}), flow.zeros({1, 1}, {dtype = "float64"})))
  end)
end)
