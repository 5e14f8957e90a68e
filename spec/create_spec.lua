local flow = require "flow"

local function flat(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for _, x in ipairs(v) do walk(x) end else out[#out + 1] = v end
  end
  walk(t:totable())
  return out
end

local function mean_std(xs)
  local s, s2 = 0, 0
  for _, v in ipairs(xs) do s = s + v; s2 = s2 + v * v end
  local m = s / #xs
  return m, math.sqrt(s2 / #xs - m * m)
end

describe("arange", function()
  it("counts from 0 as int64 when given integers", function()
    local t = flow.arange(5)
    assert.equal("int64", t.dtype)
    assert.same({0, 1, 2, 3, 4}, t:totable())
    assert.same({5, 3, 1}, flow.arange(5, 0, -2):totable())
    assert.same({}, flow.arange(0):totable())
  end)

  it("is float32 with a fractional bound, and opts.dtype overrides", function()
    local t = flow.arange(1, 2, 0.25)
    assert.equal("float32", t.dtype)
    assert.same({1, 1.25, 1.5, 1.75}, t:totable())
    local d = flow.arange(0, 3, 1, {dtype = "float64"})
    assert.equal("float64", d.dtype)
    assert.same({0, 1, 2}, d:totable())
    assert.equal("float32", flow.arange(3, {dtype = flow.float32}).dtype)
  end)

  it("rejects a zero step or a step pointing away from stop", function()
    assert.has_error(function() flow.arange(0, 5, 0) end)
    local ok, err = pcall(flow.arange, 0, 5, -1)
    assert.is_false(ok)
    assert.matches("arange: step %-1 goes away from stop", err)
  end)
end)

describe("linspace", function()
  it("hits both ends exactly with even spacing", function()
    assert.same({0, 0.25, 0.5, 0.75, 1}, flow.linspace(0, 1, 5):totable())
    local v = flow.linspace(-3, 7, 11, {dtype = "float64"}):totable()
    for i = 1, 11 do assert.equal(-3 + (i - 1), v[i]) end
    assert.same({-1}, flow.linspace(-1, 1, 1):totable())
  end)
end)

describe("eye", function()
  it("puts ones on the diagonal of a square or rectangular matrix", function()
    assert.same({{1, 0, 0}, {0, 1, 0}, {0, 0, 1}}, flow.eye(3):totable())
    assert.same({{1, 0, 0}, {0, 1, 0}}, flow.eye(2, 3):totable())
    local i = flow.eye(2, {dtype = "int64"})
    assert.equal("int64", i.dtype)
    assert.same({{1, 0}, {0, 1}}, i:totable())
  end)
end)

describe("the Philox generator", function()
  it("matches the Random123 known answer for key 0, counter 0", function()
    -- philox4x32-10({0,0,0,0}, {0,0}) = {0x6627e8d5, ...}; rand keeps the top 24 bits
    flow.manual_seed(0)
    assert.equal(0x6627e8 / 16777216, flow.rand({1}):item())
  end)

  it("rand is uniform in [0, 1) with mean 1/2 and variance 1/12", function()
    flow.manual_seed(1)
    local xs = flat(flow.rand({10000}))
    for _, v in ipairs(xs) do assert.is_true(v >= 0 and v < 1) end
    local m, s = mean_std(xs)
    assert.is_true(math.abs(m - 0.5) < 0.02, "mean " .. m)
    assert.is_true(math.abs(s - math.sqrt(1 / 12)) < 0.02, "std " .. s)
    local d = flat(flow.rand({1000}, {dtype = "float64"}))
    for _, v in ipairs(d) do assert.is_true(v >= 0 and v < 1) end
  end)

  it("randn has mean 0 and standard deviation 1", function()
    flow.manual_seed(2)
    for _, dt in ipairs({"float32", "float64"}) do
      local m, s = mean_std(flat(flow.randn({100, 100}, {dtype = dt})))
      assert.is_true(math.abs(m) < 0.05, dt .. " mean " .. m)
      assert.is_true(math.abs(s - 1) < 0.05, dt .. " std " .. s)
    end
  end)

  it("gives the same numbers for the same seed and fresh ones for each call", function()
    flow.manual_seed(42)
    local a, b = flat(flow.randn({8})), flat(flow.randn({8}))
    flow.manual_seed(42)
    assert.same(a, flat(flow.randn({8})))
    assert.not_same(a, b)
    flow.manual_seed(43)
    assert.not_same(a, flat(flow.randn({8})))
  end)

  it("draws element i from (seed, offset + i): two draws equal one of their total size", function()
    flow.manual_seed(7)
    local whole = flat(flow.rand({6}))
    flow.manual_seed(7)
    local first, rest = flat(flow.rand({2})), flat(flow.rand({4}))
    assert.same(whole, {first[1], first[2], rest[1], rest[2], rest[3], rest[4]})
  end)

  it("replays from a saved state", function()
    flow.manual_seed(5)
    flow.rand({3})
    local state = flow.get_rng_state()
    assert.same({seed = 5, offset = 3}, state)
    local a = flat(flow.randn({4}))
    flow.set_rng_state(state)
    assert.same(a, flat(flow.randn({4})))
  end)

  it("randint covers [low, high) as int64", function()
    flow.manual_seed(3)
    local t = flow.randint(-2, 3, {2000})
    assert.equal("int64", t.dtype)
    local seen = {}
    for _, v in ipairs(flat(t)) do
      assert.is_true(math.type(v) == "integer" and v >= -2 and v < 3)
      seen[v] = (seen[v] or 0) + 1
    end
    for v = -2, 2 do assert.is_true((seen[v] or 0) > 300, "value " .. v) end
    local ok, err = pcall(flow.randint, 3, 3, {2})
    assert.is_false(ok)
    assert.matches("randint: high %(3%) must be greater than low %(3%)", err)
  end)

  it("rejects integer dtypes and shapes that are not lists", function()
    local ok, err = pcall(flow.rand, {2}, {dtype = "int64"})
    assert.is_false(ok)
    assert.matches("rand: dtype must be a floating%-point type", err)
    ok, err = pcall(flow.randn, "2")
    assert.is_false(ok)
    assert.matches("randn: the shape must be a list or integers %(got string%)", err)
  end)
end)

describe("shards of a logical tensor", function()
  -- the box [start, start + size) of a {5, 7} tensor, as a global tensor's shard draws it
  local function check_box(op, value, opts)
    local whole = flow._create_shard(op, {5, 7}, value, {0, 0}, {5, 7}, opts):totable()
    local part = flow._create_shard(op, {5, 7}, value, {2, 3}, {2, 4}, opts):totable()
    for i = 1, 2 do
      for j = 1, 4 do assert.equal(whole[2 + i][3 + j], part[i][j], op .. " at " .. i .. "," .. j) end
    end
    return whole
  end

  it("draw exactly the slice of the whole tensor", function()
    flow.manual_seed(11)
    local st = flow.get_rng_state()
    local full = flow.randn({5, 7}):totable()
    assert.same(full, check_box("randn", {seed = st.seed, offset = st.offset}))
    check_box("rand", {seed = 9, offset = 100}, {dtype = "float64"})
    check_box("randint", {seed = 9, offset = 0, low = 0, high = 1000})
    check_box("eye", {})
    check_box("full", 2.5)
  end)

  it("fill 1-d ranges by logical index", function()
    local part = flow._create_shard("arange", {10}, {start = 3, step = 2, dtype = "int64"}, {4}, {3}):totable()
    assert.same({11, 13, 15}, part)
    part = flow._create_shard("linspace", {5}, {start = 0, stop = 1}, {3}, {2}):totable()
    assert.same({0.75, 1}, part)
  end)

  it("reject a box outside the logical shape", function()
    local ok, err = pcall(flow._create_shard, "rand", {4}, {seed = 0, offset = 0}, {3}, {2})
    assert.is_false(ok)
    assert.matches("rand: the box starting at 3 of size 2 on axis 0 lies outside the logical shape {4}", err)
  end)
end)

describe("dropout", function()
  it("returns its input when p = 0 or not training", function()
    local x = flow.ones({3})
    assert.equal(x, flow.dropout(x, 0))
    assert.equal(x, x:dropout(0.5, false))
  end)

  it("zeroes about p of the elements and scales the rest by 1 / (1 - p)", function()
    flow.manual_seed(4)
    local y = flat(flow.dropout(flow.ones({10000}), 0.25))
    local zeros = 0
    for _, v in ipairs(y) do
      if v == 0 then zeros = zeros + 1 else assert.is_true(math.abs(v - 1 / 0.75) < 1e-6) end
    end
    assert.is_true(math.abs(zeros / 10000 - 0.25) < 0.03, "dropped " .. zeros)
    assert.same({0, 0}, flow.dropout(flow.ones({2}), 1):totable())
  end)

  it("passes the gradient through the same mask with the same scale", function()
    flow.manual_seed(8)
    local x = flow.arange(1, 41, 1, {dtype = "float64"})
    x:requires_grad_()
    local y = flow.dropout(x, 0.5)
    local g = flow.linspace(1, 2, 40, {dtype = "float64"})
    y:backward(g)
    local yv, gv, xg, xv = flat(y), flat(g), flat(x.grad), flat(x)
    local kept = 0
    for i = 1, 40 do
      if yv[i] == 0 then assert.equal(0, xg[i])
      else
        kept = kept + 1
        assert.equal(2 * xv[i], yv[i])
        assert.equal(2 * gv[i], xg[i])
      end
    end
    assert.is_true(kept > 5 and kept < 35)
  end)

  it("rejects p outside [0, 1] and integer tensors", function()
    local ok, err = pcall(flow.dropout, flow.ones({2}), 1.5)
    assert.is_false(ok)
    assert.matches("dropout: p must be in %[0, 1%]", err)
    ok, err = pcall(flow.dropout, flow.arange(3), 0.5)
    assert.is_false(ok)
    assert.matches("dropout: input must be float32 or float64 %(got int64%)", err)
  end)
end)

describe("now", function()
  it("is monotonic seconds", function()
    local t0 = flow.now()
    local x = 0
    for i = 1, 200000 do x = x + i end
    local t1 = flow.now()
    assert.is_true(type(t0) == "number" and t1 > t0 and t1 - t0 < 5)
  end)
end)
