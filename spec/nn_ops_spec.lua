-- The fused neural-network ops (softmax, log_softmax, layer_norm, cross_entropy,
-- scaled_dot_product_attention, adamw_) against naive plain-Lua implementations, their gradients
-- against central finite differences in float64, and their error messages.
local flow = require "flow"
local gc = require "support.gradcheck"

local flat, nest, randt = gc.flat, gc.nest, gc.randt

local function assert_close(expected, actual, tol, what)
  expected, actual = flat(expected), flat(actual)
  assert.are.equal(#expected, #actual, (what or "values") .. ": element count")
  for i = 1, #expected do
    local e, a = expected[i], actual[i]
    if not (math.abs(e - a) <= tol * (1 + math.abs(e))) then
      error(("%s: element %d: expected %.10g, got %.10g"):format(what or "values", i, e, a), 2)
    end
  end
end

-- plain-Lua softmax of a list
local function lua_softmax(row)
  local m = -math.huge
  for _, x in ipairs(row) do m = math.max(m, x) end
  local s, out = 0, {}
  for i, x in ipairs(row) do out[i] = math.exp(x - m); s = s + out[i] end
  for i = 1, #out do out[i] = out[i] / s end
  return out
end

-- Analytic gradients of sum(f(inputs) * W) for float64 inputs against central differences at a
-- few elements of each input (for inputs too large to check every element). Returns the worst error.
local function spot_gradcheck(f, inputs, picks, eps)
  eps = eps or 1e-6
  local vals = {}
  for i, x in ipairs(inputs) do vals[i] = flat(x:totable()) end
  local function leaves(grad)
    local xs = {}
    for i, x in ipairs(inputs) do
      xs[i] = flow.tensor(nest(vals[i], x:shape()), {dtype = "float64"})
      if grad then xs[i]:requires_grad_(true) end
    end
    return xs
  end
  local xs = leaves(true)
  local out = f(table.unpack(xs))
  local w = gc.randlist(gc.numel(out:shape()))
  out:backward(flow.tensor(nest(w, out:shape()), {dtype = "float64"}))
  local function loss()
    local o = flat(f(table.unpack(leaves(false))):totable())
    local s = 0
    for k = 1, #o do s = s + o[k] * w[k] end
    return s
  end
  local worst = 0
  for i = 1, #inputs do
    local g = flat(xs[i].grad:totable())
    for _ = 1, picks do
      local k = math.random(#vals[i])
      local v = vals[i][k]
      vals[i][k] = v + eps
      local up = loss()
      vals[i][k] = v - eps
      local down = loss()
      vals[i][k] = v
      worst = math.max(worst, math.abs((up - down) / (2 * eps) - g[k]))
    end
  end
  return worst
end

describe("softmax", function()
  before_each(function() math.randomseed(7) end)

  it("rows sum to 1 and match exp(x) / sum exp(x)", function()
    local x = randt({3, 5})
    local y = flow.softmax(x):totable()
    for r, row in ipairs(x:totable()) do
      local s = 0
      for _, v in ipairs(y[r]) do s = s + v end
      assert.is_true(math.abs(s - 1) < 1e-12)
      assert_close(lua_softmax(row), y[r], 1e-12, "row " .. r)
    end
  end)

  it("normalises any axis, also of a 3-d tensor", function()
    local x = randt({2, 3, 4})
    local xt, y = x:totable(), flow.softmax(x, 1):totable()
    for a = 1, 2 do
      for c = 1, 4 do
        local col = {}
        for b = 1, 3 do col[b] = xt[a][b][c] end
        local want = lua_softmax(col)
        for b = 1, 3 do assert.is_true(math.abs(want[b] - y[a][b][c]) < 1e-12) end
      end
    end
    local y0 = flow.softmax(x, -3):totable()
    local e = lua_softmax({xt[1][2][3], xt[2][2][3]})
    assert.is_true(math.abs(e[2] - y0[2][2][3]) < 1e-12)
  end)

  it("is stable for large inputs, in float32 too", function()
    local y = flow.softmax(flow.tensor({{1000, 1001, 1002}}, {dtype = "float32"})):totable()[1]
    assert_close(lua_softmax({0, 1, 2}), y, 1e-6, "shifted row")
    local l = flow.log_softmax(flow.tensor({{-1000, 0}}, {dtype = "float64"})):totable()[1]
    assert_close({-1000, 0}, l, 1e-12, "log_softmax far apart")
  end)

  it("agrees in float32 and float64 over whole vector blocks of 8, with -inf and underflow", function()
    local x = randt({3, 37}) * 30
    local x32 = x:cast("float32")
    assert_close(flow.softmax(x32:cast("float64")):totable(), flow.softmax(x32):totable(), 1e-6, "softmax")
    assert_close(flow.log_softmax(x32:cast("float64")):totable(), flow.log_softmax(x32):totable(), 1e-5, "log")
    local row = {-math.huge, 0, -200, 1, -math.huge, 2, -90, 3, 0.5, -1}
    local y = flow.softmax(flow.tensor({row}, {dtype = "float32"})):totable()[1]
    local want = lua_softmax(row)
    assert_close(want, y, 1e-6, "masked row")
    assert.are.equal(0, y[1])
    assert.are.equal(0, y[3])
  end)

  it("gives 0 to -inf entries (masked positions)", function()
    local y = flow.softmax(flow.tensor({{-math.huge, 0, 0}, {1, -math.huge, 1}}, {dtype = "float32"})):totable()
    assert.are.same({{0, 0.5, 0.5}, {0.5, 0, 0.5}}, y)
  end)

  it("log_softmax is log of softmax", function()
    local x = randt({4, 6})
    local y = flow.log_softmax(x):totable()
    for r, row in ipairs(x:totable()) do
      local p = lua_softmax(row)
      for i = 1, #p do p[i] = math.log(p[i]) end
      assert_close(p, y[r], 1e-12, "row " .. r)
    end
  end)

  it("reads non-contiguous inputs", function()
    local x = randt({5, 3})
    local y = flow.softmax(flow.transpose(x, 0, 1)):totable()
    local col = {}
    for i, row in ipairs(flow.softmax(x, 0):totable()) do col[i] = row[1] end
    assert_close(col, y[1], 1e-12, "first column")
  end)

  it("has gradients matching finite differences", function()
    for _, axis in ipairs({-1, 0}) do
      assert.is_true(gc.gradcheck(function(x) return flow.softmax(x, axis) end, {randt({3, 4})}) < 1e-7)
      assert.is_true(gc.gradcheck(function(x) return flow.log_softmax(x, axis) end, {randt({3, 4})}) < 1e-7)
    end
    assert.is_true(gc.gradcheck(function(x) return flow.softmax(x) end, {randt({2, 19})}) < 1e-7)
    assert.is_true(gc.gradcheck(function(x) return flow.softmax(x, 1) end, {randt({2, 3, 2})}) < 1e-7)
  end)

  it("rejects integer tensors and bad axes", function()
    local ok, err = pcall(flow.softmax, flow.tensor({1, 2, 3}))
    assert.is_false(ok)
    assert.matches("softmax: input must be a floating%-point tensor %(got int64%)", err)
    ok, err = pcall(flow.log_softmax, randt({2, 3}), 2)
    assert.is_false(ok)
    assert.matches("log_softmax: axis 2 out of range", err)
  end)
end)

describe("layer_norm", function()
  before_each(function() math.randomseed(11) end)

  it("normalises each row to mean 0 and variance 1", function()
    local x = randt({3, 8}) * 4 + 2
    for _, row in ipairs(flow.layer_norm(x, nil, nil, 0):totable()) do
      local m, v = 0, 0
      for _, y in ipairs(row) do m = m + y end
      m = m / #row
      for _, y in ipairs(row) do v = v + (y - m) ^ 2 end
      assert.is_true(math.abs(m) < 1e-12)
      assert.is_true(math.abs(v / #row - 1) < 1e-10)
    end
  end)

  it("applies eps, weight and bias like the formula", function()
    local x, w, b = randt({2, 3, 13}), randt({13}), randt({13})
    local y = flow.layer_norm(x, w, b, 1e-3):totable()
    local wt, bt = w:totable(), b:totable()
    for i, mat in ipairs(x:totable()) do
      for j, row in ipairs(mat) do
        local m, v = 0, 0
        for _, e in ipairs(row) do m = m + e / #row end
        for _, e in ipairs(row) do v = v + (e - m) ^ 2 / #row end
        local want = {}
        for c, e in ipairs(row) do want[c] = (e - m) / math.sqrt(v + 1e-3) * wt[c] + bt[c] end
        assert_close(want, y[i][j], 1e-12, "row")
      end
    end
    -- bias alone
    local yb = flow.layer_norm(x, nil, b):totable()
    local y0 = flow.layer_norm(x):totable()
    assert.is_true(math.abs(yb[2][3][4] - (y0[2][3][4] + bt[4])) < 1e-12)
  end)

  it("gives the same result in float32", function()
    local x, w, b = randt({4, 16}), randt({16}), randt({16})
    local y32 = flow.layer_norm(x:cast("float32"), w:cast("float32"), b:cast("float32")):totable()
    assert_close(flow.layer_norm(x, w, b):totable(), y32, 1e-5, "float32")
  end)

  it("has gradients for x, weight and bias matching finite differences", function()
    local f = function(x, w, b) return flow.layer_norm(x, w, b) end
    assert.is_true(gc.gradcheck(f, {randt({2, 11}), randt({11}), randt({11})}) < 1e-7)
    assert.is_true(gc.gradcheck(function(x) return flow.layer_norm(x) end, {randt({2, 2, 4})}) < 1e-7)
    assert.is_true(gc.gradcheck(function(x, b) return flow.layer_norm(x, nil, b) end,
      {randt({3, 4}), randt({4})}) < 1e-7)
  end)

  it("names the expected weight shape", function()
    local ok, err = pcall(flow.layer_norm, randt({2, 4}), randt({3}))
    assert.is_false(ok)
    assert.matches("layer_norm: weight must have shape {4} %(the last axis of the input {2,4}%), got {3}", err)
    ok, err = pcall(flow.layer_norm, randt({2, 4}), nil, randt({4}):cast("float32"))
    assert.is_false(ok)
    assert.matches("layer_norm: bias is float32 but the input is float64", err)
  end)
end)

describe("cross_entropy", function()
  before_each(function() math.randomseed(3) end)

  local function lua_losses(logits, target, ignore)
    local out = {}
    for r, row in ipairs(logits) do
      local t = target[r]
      out[r] = t == ignore and 0 or -math.log(lua_softmax(row)[t + 1])
    end
    return out
  end

  it("is -log softmax[target], averaged over non-ignored targets", function()
    local x = randt({5, 4}) * 3
    local target = {0, 3, -100, 1, 2}
    local t = flow.tensor(target)
    local each = lua_losses(x:totable(), target, -100)
    local sum = 0
    for _, l in ipairs(each) do sum = sum + l end
    assert.is_true(math.abs(flow.cross_entropy(x, t):item() - sum / 4) < 1e-12)
    assert.is_true(math.abs(flow.cross_entropy(x, t, {reduction = "sum"}):item() - sum) < 1e-12)
    assert_close(each, flow.cross_entropy(x, t, {reduction = "none"}):totable(), 1e-12, "none")
  end)

  it("takes N-D logits [N, C, d1] with the class axis at 1, as PyTorch, and a custom ignore_index", function()
    local x = randt({2, 4, 3})
    local target = {{1, 0, 3}, {2, 2, 0}}
    local l = flow.cross_entropy(x, flow.tensor(target), {ignore_index = 0, reduction = "none"}):totable()
    local xt = x:transpose(1, 2):totable()
    for i = 1, 2 do
      assert_close(lua_losses(xt[i], target[i], 0), l[i], 1e-12, "batch " .. i)
    end
  end)

  it("reads non-contiguous logits", function()
    local x, t = randt({4, 3}), flow.tensor({0, 2, 1})
    local want = flow.cross_entropy(x:transpose(0, 1):contiguous(), t, {reduction = "none"}):totable()
    assert_close(want, flow.cross_entropy(x:transpose(0, 1), t, {reduction = "none"}):totable(), 1e-12, "view")
  end)

  it("has gradients matching finite differences", function()
    local t = flow.tensor({2, -100, 0})
    for _, red in ipairs({"mean", "sum", "none"}) do
      local f = function(x) return flow.cross_entropy(x, t, {reduction = red}) end
      assert.is_true(gc.gradcheck(f, {randt({3, 4})}) < 1e-7, red)
    end
    local t3 = flow.tensor({{2, -100}, {0, 1}})
    for _, red in ipairs({"mean", "sum", "none"}) do
      local f = function(x) return flow.cross_entropy(x, t3, {reduction = red}) end
      assert.is_true(gc.gradcheck(f, {randt({2, 3, 2})}) < 1e-7, "[N, C, d1] " .. red)
    end
  end)

  it("rejects N-D logits whose target is not [N, d1, ...]", function()
    local ok, err = pcall(flow.cross_entropy, randt({2, 4, 3}), flow.tensor({{0, 1, 2, 3}, {0, 1, 2, 3}}))
    assert.is_false(ok)
    assert.matches("cross_entropy: logits {2,4,3} are [N, C, d1, ...] and need target [N, d1, ...] (got {2,4})", err, 1, true)
  end)

  it("gives the same loss in float32", function()
    local x, t = randt({6, 10}) * 5, flow.tensor({0, 9, 3, 3, 7, 1})
    assert.is_true(math.abs(flow.cross_entropy(x, t):item() - flow.cross_entropy(x:cast("float32"), t):item()) < 1e-5)
  end)

  it("reports a target out of range with the value and the class count", function()
    local ok, err = pcall(flow.cross_entropy, randt({2, 3}), flow.tensor({1, 3}))
    assert.is_false(ok)
    assert.matches("cross_entropy: target 3 is out of range for 3 classes", err)
    ok, err = pcall(flow.cross_entropy, randt({2, 3}), flow.tensor({-1, 0}))
    assert.is_false(ok)
    assert.matches("cross_entropy: target %-1 is out of range", err)
  end)

  it("rejects a float target, mismatched shapes and unknown reductions", function()
    local ok, err = pcall(flow.cross_entropy, randt({2, 3}), flow.tensor({1.0, 2.0}))
    assert.is_false(ok)
    assert.matches("cross_entropy: target must be an int64 tensor", err)
    ok, err = pcall(flow.cross_entropy, randt({2, 3}), flow.tensor({1, 2, 0}))
    assert.is_false(ok)
    assert.matches("cross_entropy: logits {2,3} need a class axis last and target {3}", err)
    ok, err = pcall(flow.cross_entropy, randt({2, 3}), flow.tensor({1, 2}), {reduction = "avg"})
    assert.is_false(ok)
    assert.matches("cross_entropy: reduction must be", err)
  end)
end)

describe("scaled_dot_product_attention", function()
  before_each(function() math.randomseed(5) end)

  -- softmax(q k^T * scale + causal mask) v, per (b, h), in plain Lua
  local function lua_attention(q, k, v, causal, scale)
    local out = {}
    for b = 1, #q do
      out[b] = {}
      for h = 1, #q[b] do
        local Q, K, V = q[b][h], k[b][h], v[b][h]
        out[b][h] = {}
        for i = 1, #Q do
          local s = {}
          for j = 1, #K do
            local d = 0
            for c = 1, #Q[i] do d = d + Q[i][c] * K[j][c] end
            s[j] = (causal and j > i) and -math.huge or d * scale
          end
          local p = lua_softmax(s)
          local row = {}
          for c = 1, #V[1] do
            row[c] = 0
            for j = 1, #K do row[c] = row[c] + p[j] * V[j][c] end
          end
          out[b][h][i] = row
        end
      end
    end
    return out
  end

  local function check(shape_q, shape_k, shape_v, opts, tol)
    local q, k, v = randt(shape_q), randt(shape_k), randt(shape_v)
    local scale = opts.scale or 1 / math.sqrt(shape_q[4])
    local want = lua_attention(q:totable(), k:totable(), v:totable(), opts.causal, scale)
    assert_close(want, flow.scaled_dot_product_attention(q, k, v, opts):totable(), 1e-12, "float64")
    local got32 = flow.scaled_dot_product_attention(q:cast("float32"), k:cast("float32"), v:cast("float32"), opts):totable()
    assert_close(want, got32, tol or 1e-5, "float32")
  end

  it("matches softmax(q k^T / sqrt(D)) v", function()
    check({2, 2, 5, 4}, {2, 2, 5, 4}, {2, 2, 5, 4}, {})
  end)

  it("applies the causal mask and a given scale", function()
    check({1, 3, 6, 4}, {1, 3, 6, 4}, {1, 3, 6, 4}, {causal = true})
    check({2, 1, 4, 3}, {2, 1, 4, 3}, {2, 1, 4, 5}, {causal = true, scale = 0.3})
  end)

  it("allows more keys than queries and a different value size", function()
    check({1, 2, 3, 4}, {1, 2, 7, 4}, {1, 2, 7, 2}, {})
  end)

  it("handles sequences longer than one block of query rows", function()
    check({1, 1, 70, 4}, {1, 1, 70, 4}, {1, 1, 70, 4}, {causal = true})
  end)

  it("reads q, k, v as transposed views of [B, T, H, D]", function()
    local q, k, v = randt({2, 5, 3, 4}), randt({2, 5, 3, 4}), randt({2, 5, 3, 4})
    local qt, kt, vt = q:transpose(1, 2), k:transpose(1, 2), v:transpose(1, 2)
    local got = flow.scaled_dot_product_attention(qt, kt, vt, {causal = true}):totable()
    local want = lua_attention(qt:contiguous():totable(), kt:contiguous():totable(), vt:contiguous():totable(),
      true, 0.5)
    assert_close(want, got, 1e-12, "views")
  end)

  it("has dq, dk, dv matching finite differences, causal and not", function()
    for _, causal in ipairs({false, true}) do
      local f = function(q, k, v) return flow.scaled_dot_product_attention(q, k, v, {causal = causal}) end
      assert.is_true(gc.gradcheck(f, {randt({1, 2, 3, 2}), randt({1, 2, 3, 2}), randt({1, 2, 3, 2})}) < 1e-7)
    end
    local f = function(q, k, v) return flow.scaled_dot_product_attention(q, k, v, {scale = 0.7}) end
    assert.is_true(gc.gradcheck(f, {randt({2, 1, 2, 3}), randt({2, 1, 4, 3}), randt({2, 1, 4, 2})}) < 1e-7)
  end)

  it("computes float32 outputs and gradients like float64 over many heads, blocks and views", function()
    -- [B, T, H, D] views as the model makes them: every (batch, head) pair in one batched product
    for _, causal in ipairs({false, true}) do
      local q, k, v = randt({3, 70, 4, 5}), randt({3, 70, 4, 5}), randt({3, 70, 4, 3})
      local w = randt({3, 4, 70, 3})
      local function run(dtype)
        local xs = {}
        for i, t in ipairs({q, k, v}) do xs[i] = flow.tensor(t, {dtype = dtype}):requires_grad_(true) end
        local o = flow.scaled_dot_product_attention(xs[1]:transpose(1, 2), xs[2]:transpose(1, 2),
          xs[3]:transpose(1, 2), {causal = causal})
        ;(o * w:cast(dtype)):sum():backward()
        return {o:totable(), xs[1].grad:totable(), xs[2].grad:totable(), xs[3].grad:totable()}
      end
      local want, got = run("float64"), run("float32")
      for i = 1, 4 do assert_close(want[i], got[i], 2e-5, ("causal %s, output %d"):format(causal, i)) end
    end
  end)

  it("has correct gradients across query blocks", function()
    local f = function(q, k, v) return flow.scaled_dot_product_attention(q, k, v, {causal = true}) end
    local err = spot_gradcheck(f, {randt({1, 1, 67, 2}), randt({1, 1, 67, 2}), randt({1, 1, 67, 2})}, 6)
    assert.is_true(err < 1e-7)
  end)

  it("names the mismatch and the shapes", function()
    local ok, err = pcall(flow.scaled_dot_product_attention, randt({1, 2, 3, 4}), randt({1, 2, 3, 5}),
      randt({1, 2, 3, 4}))
    assert.is_false(ok)
    assert.matches("scaled_dot_product_attention: q and k must have the same head size D %(axis 3%); got q "
      .. "{1,2,3,4}, k {1,2,3,5}, v {1,2,3,4}", err)
    ok, err = pcall(flow.scaled_dot_product_attention, randt({1, 2, 3}), randt({1, 2, 3}), randt({1, 2, 3}))
    assert.is_false(ok)
    assert.matches("scaled_dot_product_attention: q, k and v must be 4%-d", err)
    ok, err = pcall(flow.scaled_dot_product_attention, randt({1, 1, 2, 4}), randt({1, 1, 3, 4}),
      randt({1, 1, 3, 4}), {causal = true})
    assert.is_false(ok)
    assert.matches("causal attention needs as many queries as keys", err)
    ok, err = pcall(flow.scaled_dot_product_attention, randt({1, 1, 2, 4}), randt({1, 1, 2, 4}):cast("float32"),
      randt({1, 1, 2, 4}))
    assert.is_false(ok)
    assert.matches("scaled_dot_product_attention: k is float32 but the input is float64", err)
  end)
end)

describe("adamw_", function()
  before_each(function() math.randomseed(9) end)

  -- torch.optim.AdamW, one step, in plain Lua
  local function lua_adamw(p, g, m, v, o)
    local bc1, bc2 = 1 - o.beta1 ^ o.step, 1 - o.beta2 ^ o.step
    for i = 1, #p do
      p[i] = p[i] * (1 - o.lr * o.weight_decay)
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i]
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i]
      p[i] = p[i] - o.lr / bc1 * m[i] / (math.sqrt(v[i]) / math.sqrt(bc2) + o.eps)
    end
  end

  it("matches PyTorch's AdamW over several steps, updating m and v in place", function()
    for _, dtype in ipairs({"float64", "float32"}) do
      local p, m, v = randt({3, 4}, dtype), flow.zeros({3, 4}, {dtype = dtype}), flow.zeros({3, 4}, {dtype = dtype})
      local lp, lm, lv = flat(p:totable()), flat(m:totable()), flat(v:totable())
      local o = {lr = 0.01, beta1 = 0.8, beta2 = 0.95, eps = 1e-6, weight_decay = 0.1}
      for step = 1, 3 do
        local g = randt({3, 4}, dtype)
        o.step = step
        local r = flow.adamw_(p, g, m, v, o)
        assert.are.equal(p, r)
        lua_adamw(lp, flat(g:totable()), lm, lv, o)
      end
      local tol = dtype == "float64" and 1e-12 or 1e-5
      assert_close(lp, p:totable(), tol, dtype .. " param")
      assert_close(lm, m:totable(), tol, dtype .. " m")
      assert_close(lv, v:totable(), tol, dtype .. " v")
    end
  end)

  it("uses the documented defaults", function()
    local p, g = randt({5}), randt({5})
    local m, v = flow.zeros({5}, {dtype = "float64"}), flow.zeros({5}, {dtype = "float64"})
    local lp = flat(p:totable())
    flow.adamw_(p, g, m, v, {step = 1})
    lua_adamw(lp, flat(g:totable()), {0, 0, 0, 0, 0}, {0, 0, 0, 0, 0},
      {lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01, step = 1})
    assert_close(lp, p:totable(), 1e-12, "param")
  end)

  it("marks m and v as modified for autograd", function()
    local p, g = randt({4}), randt({4})
    local m, v = flow.zeros({4}, {dtype = "float64"}), flow.zeros({4}, {dtype = "float64"})
    local a = randt({4}):requires_grad_(true)
    local y = (a * m):sum()
    flow.adamw_(p, g, m, v, {lr = 0.1, step = 1})
    local ok, err = pcall(function() y:backward() end)
    assert.is_false(ok)
    assert.matches("modified by an in%-place operation", err)
  end)

  it("rejects mismatched shapes and dtypes, a missing step, and params that require grad", function()
    local z = function(n, dt) return flow.zeros({n}, {dtype = dt or "float64"}) end
    local ok, err = pcall(flow.adamw_, z(4), z(3), z(4), z(4), {step = 1})
    assert.is_false(ok)
    assert.matches("adamw_: grad has shape {3} but param has shape {4}", err)
    ok, err = pcall(flow.adamw_, z(4), z(4), z(4, "float32"), z(4), {step = 1})
    assert.is_false(ok)
    assert.matches("adamw_: m is float32 but the input is float64", err)
    ok, err = pcall(flow.adamw_, z(4), z(4), z(4), z(4), {lr = 0.1})
    assert.is_false(ok)
    assert.matches("adamw_: options.step", err)
    ok, err = pcall(flow.adamw_, z(4), z(4), z(4), z(4), {step = 0})
    assert.is_false(ok)
    assert.matches("adamw_: step must be >= 1", err)
    ok, err = pcall(flow.adamw_, z(4):requires_grad_(true), z(4), z(4), z(4), {step = 1})
    assert.is_false(ok)
    assert.matches("adamw_: in%-place operation on a tensor that requires grad", err)
    flow.no_grad(function() flow.adamw_(z(4):requires_grad_(true), z(4), z(4), z(4), {step = 1}) end)
  end)
end)

describe("F.hardtanh and F.relu6 (composed of clamp and where)", function()
  local F = flow.nn.functional
  local function err_of(f) local ok, e = pcall(f) assert.is_false(ok) return e end

  it("clamp, with a zero gradient at and beyond the bounds and at NaN", function()
    local x = flow.tensor({-2.0, -1.0, 0.5, 1.0, 3.0, 0 / 0}, {dtype = "float64", requires_grad = true})
    local y = F.hardtanh(x)
    assert_close({-1, -1, 0.5, 1, 1}, {table.unpack(y:totable(), 1, 5)}, 0)
    assert(y:totable()[6] ~= y:totable()[6])
    flow.sum(y):backward()
    assert.same({0, 0, 1, 0, 0, 0}, x.grad:totable())
    assert.same({0, 3, 6}, F.relu6(flow.tensor({-1, 3, 9})):totable())
  end)

  it("come as modules too", function()
    assert.same({-0.5, 0.25, 0.5}, flow.nn.Hardtanh(-0.5, 0.5)(flow.tensor({-2.0, 0.25, 2.0}, {dtype = "float64"})):totable())
    assert.same({0, 6}, flow.nn.ReLU6()(flow.tensor({-2.0, 7.0})):totable())
  end)

  it("name themselves, bad bounds and unknown options", function()
    local x = flow.ones({2})
    assert.matches("hardtanh: unknown option 'min' %(expected min_val, max_val%)", err_of(function() return F.hardtanh(x, {min = 0}) end))
    assert.matches("hardtanh: max_val must be a number %(got string%)", err_of(function() return F.hardtanh(x, 0, "1") end))
    assert.matches("hardtanh: bool inputs are not supported", err_of(function() return F.hardtanh(x:bool()) end))
    assert.matches("relu6: takes only the input", err_of(function() return F.relu6(x, {inplace = true}) end))
    assert.matches("relu6: expected a tensor %(got nil%)", err_of(function() return F.relu6() end))
  end)
end)
