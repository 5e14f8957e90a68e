-- The CPU's float32 GEMM runs on oneDNN: checked against a plain C loop (flow._bench.matmul_reference)
-- over odd sizes, transposes, strided views and broadcast batches; primitives are cached by shape.
local flow = require "flow"
local F = flow.nn.functional

-- max |a - b| / (1 + max |b|)
local function rel_err(a, b)
  local d = (a:double() - b:double()):abs():max():item()
  return d / (1 + b:double():abs():max():item())
end

-- op(a) @ op(b) by the reference loop, into a tensor shaped like flow.matmul's result
local function reference(a, b, ta, tb)
  local y = flow.matmul(a, b, { transpose_a = ta, transpose_b = tb })
  local out = flow.zeros(y:shape(), { dtype = y.dtype })
  flow._bench.matmul_reference(out, a, b, ta, tb)
  return y, out
end

describe("matmul on oneDNN", function()
  it("matches the reference loop for odd sizes and every transpose", function()
    flow.manual_seed(1)
    for _, mnk in ipairs { { 1, 1, 1 }, { 17, 9, 33 }, { 5, 64, 3 }, { 1, 31, 7 }, { 29, 1, 13 } } do
      local M, N, K = mnk[1], mnk[2], mnk[3]
      for _, t in ipairs { { false, false }, { true, false }, { false, true }, { true, true } } do
        local a = flow.randn(t[1] and { K, M } or { M, K })
        local b = flow.randn(t[2] and { N, K } or { K, N })
        local y, r = reference(a, b, t[1], t[2])
        assert.is_true(rel_err(y, r) < 1e-5, ("M N K %d %d %d, transposes %s %s"):format(M, N, K, t[1], t[2]))
      end
    end
  end)

  it("reads strided views: transposed, narrowed, every other column", function()
    flow.manual_seed(2)
    local big = flow.randn({ 40, 50 })
    local a = big:narrow(0, 3, 11):narrow(1, 5, 13)        -- [11, 13], leading dimension 50
    local b = flow.randn({ 9, 13 }):transpose(0, 1)         -- [13, 9], column-major
    local y, r = reference(a, b, false, false)
    assert.is_true(rel_err(y, r) < 1e-5)
    local c = flow.randn({ 13, 18 })
    local every_other = c:view({ 13, 9, 2 }):narrow(2, 0, 1):view({ 13, 9 })
    y, r = reference(a, every_other, false, false)
    assert.is_true(rel_err(y, r) < 1e-5)
  end)

  it("batches and broadcasts batch axes", function()
    flow.manual_seed(3)
    local cases = {
      { { 3, 5, 7 }, { 3, 7, 6 } },
      { { 2, 1, 5, 7 }, { 4, 7, 6 } },
      { { 4, 5, 7 }, { 7, 6 } },
      { { 5, 7 }, { 2, 3, 7, 6 } },
    }
    for _, c in ipairs(cases) do
      local y, r = reference(flow.randn(c[1]), flow.randn(c[2]), false, false)
      assert.is_true(rel_err(y, r) < 1e-5)
    end
    -- transposed batched operands, as the attention and matmul gradients use them
    local a, b = flow.randn({ 2, 3, 7, 5 }), flow.randn({ 2, 3, 6, 7 })
    local y, r = reference(a, b, true, true)
    assert.is_true(rel_err(y, r) < 1e-5)
  end)

  it("fuses linear's bias and matches x w^T + b", function()
    flow.manual_seed(4)
    local x, w, b = flow.randn({ 7, 19 }), flow.randn({ 11, 19 }), flow.randn({ 11 })
    local y = F.linear(x, w, b)
    local _, r = reference(x, w, false, true)
    assert.is_true(rel_err(y, r + b) < 1e-5)
  end)

  it("gives zeros for an empty contraction", function()
    local y = flow.matmul(flow.zeros({ 3, 0 }), flow.zeros({ 0, 4 }))
    assert.are.same({ 3, 4 }, y:shape())
    assert.are.equal(0, y:abs():sum():item())
  end)

  it("builds no primitive in a training step after the first", function()
    flow.manual_seed(5)
    local model = flow.nn.Sequential(flow.nn.Linear(13, 32), flow.nn.GELU(), flow.nn.Linear(32, 5))
    local x, t = flow.randn({ 6, 13 }), flow.randint(0, 5, { 6 })
    local function step()
      local loss = flow.cross_entropy(model(x), t)
      loss:backward()
      model:zero_grad()
    end
    step()
    local before = flow._bench.onednn().primitives
    step()
    step()
    assert.are.equal(before, flow._bench.onednn().primitives)
  end)

  -- oneDNN fixes a primitive's thread count when it builds it: one built on 1 thread would go on
  -- running on 1 after the count is raised
  it("builds a GEMM's primitive again for another thread count, and finds each after", function()
    flow.manual_seed(6)
    local a, b = flow.randn({ 37, 23 }), flow.randn({ 37, 9 })
    local function grad_w() return flow.matmul(a, b, { transpose_a = true }) end
    local was = flow._bench.set_threads(1)
    local ok, err = pcall(function()
      local y1 = grad_w()
      local built = flow._bench.onednn().primitives
      flow._bench.set_threads(2)
      local y2 = grad_w()
      assert.are.equal(built + 1, flow._bench.onednn().primitives)
      flow._bench.set_threads(1)
      grad_w()
      flow._bench.set_threads(2)
      grad_w()
      assert.are.equal(built + 1, flow._bench.onednn().primitives)
      local _, r = reference(a, b, true, false)
      assert.is_true(rel_err(y1, r) < 1e-5 and rel_err(y2, r) < 1e-5)
    end)
    flow._bench.set_threads(was)
    assert(ok, err)
  end)
end)

-- y and the gradients of sum(y * r) for the inputs, with conv/pool/batch-norm on the reference
-- kernels (ref true) or on oneDNN
local function run_both(make_inputs, f)
  local results = {}
  for _, ref in ipairs { true, false } do
    local prev = flow._bench.conv_reference(ref)
    flow.manual_seed(7)
    local inputs = make_inputs()
    local y = f(table.unpack(inputs))
    local r = flow.randn(y:shape())
    ;(y * r):sum():backward()
    local out = { y:detach() }
    for _, t in ipairs(inputs) do out[#out + 1] = t.grad end
    results[ref and "ref" or "dnnl"] = out
    flow._bench.conv_reference(prev)
  end
  return results.ref, results.dnnl
end

local function leaf(shape) return flow.randn(shape):requires_grad_(true) end

describe("conv2d, pooling and batch norm on oneDNN", function()
  it("conv2d matches the reference forward and backward: odd sizes, stride, padding, dilation, groups", function()
    local cases = {
      { { 2, 3, 7, 9 }, { 5, 3, 3, 3 }, {} },
      { { 1, 4, 10, 7 }, { 6, 2, 3, 2 }, { stride = { 2, 1 }, padding = { 1, 0 }, groups = 2 } },
      { { 2, 2, 9, 9 }, { 3, 2, 3, 3 }, { dilation = 2, padding = 2 } },
      { { 1, 3, 8, 8 }, { 4, 3, 2, 2 }, { stride = 3 } },     -- the last window leaves a row unread
      { { 3, 5, 6, 5 }, { 7, 5, 1, 1 }, {} },
    }
    for i, c in ipairs(cases) do
      for _, bias in ipairs { true, false } do
        local ref, got = run_both(function()
          return { leaf(c[1]), leaf(c[2]), bias and leaf({ c[2][1] }) or nil }
        end, function(x, w, b) return flow.conv2d(x, w, b, c[3]) end)
        for k = 1, #ref do
          assert.is_true(rel_err(got[k], ref[k]) < 1e-5, ("case %d, bias %s, output %d"):format(i, bias, k))
        end
      end
    end
  end)

  it("max and avg pooling match the reference forward and backward", function()
    local cases = {
      { { 2, 3, 4, 6 }, { kernel = 2 } },
      { { 1, 2, 5, 4 }, { kernel = 3, stride = 1, padding = 1 } },
      { { 1, 2, 7, 5 }, { kernel = { 3, 2 }, stride = { 2, 1 }, padding = { 1, 0 } } },
    }
    for i, c in ipairs(cases) do
      for _, pool in ipairs { flow.max_pool2d, flow.avg_pool2d } do
        local ref, got = run_both(function() return { leaf(c[1]) } end, function(x) return pool(x, c[2]) end)
        for k = 1, #ref do assert.is_true(rel_err(got[k], ref[k]) < 1e-5, ("case %d, output %d"):format(i, k)) end
      end
    end
  end)

  it("batch norm matches the reference in training and eval, running statistics included", function()
    for _, training in ipairs { true, false } do
      for _, shape in ipairs { { 4, 3, 5, 7 }, { 6, 5 }, { 2, 3, 9 } } do
        local C = shape[2]
        local stats = {}
        local ref, got = run_both(function()
          local rm, rv = flow.randn({ C }), flow.rand({ C }) + 0.5
          stats[#stats + 1] = { rm, rv }
          return { leaf(shape), leaf({ C }), leaf({ C }), rm, rv }
        end, function(x, w, b, rm, rv)
          return flow.batch_norm(x, w, b, rm, rv, { training = training, momentum = 0.3, eps = 1e-4 })
        end)
        for k = 1, 4 do
          assert.is_true(rel_err(got[k], ref[k]) < 1e-4, ("training %s, output %d"):format(training, k))
        end
        assert.is_true(rel_err(stats[2][1], stats[1][1]) < 1e-5)
        assert.is_true(rel_err(stats[2][2], stats[1][2]) < 1e-5)
      end
    end
  end)
end)

describe("bf16 autocast on the CPU", function()
  local native = flow._bench.onednn().bf16

  it("runs matmul, linear and conv2d in bf16 with float32 outputs close to float32", function()
    flow.manual_seed(8)
    local a, b = flow.randn({ 3, 37, 70 }), flow.randn({ 70, 29 })
    local x, w, bias = flow.randn({ 9, 70 }), flow.randn({ 13, 70 }), flow.randn({ 13 })
    local img, k = flow.randn({ 2, 3, 9, 9 }), flow.randn({ 4, 3, 3, 3 })
    local f32 = { flow.matmul(a, b), F.linear(x, w, bias), flow.conv2d(img, k, nil, { padding = 1 }) }
    local half = flow.autocast("bfloat16", function()
      return { flow.matmul(a, b), F.linear(x, w, bias), flow.conv2d(img, k, nil, { padding = 1 }) }
    end)
    for i = 1, 3 do
      assert.are.equal("float32", half[i].dtype)
      local e = rel_err(half[i], f32[i])
      assert.is_true(e < 2e-2, ("output %d: %g"):format(i, e))
      -- bf16 keeps 8 bits of mantissa: the products really are rounded when the CPU runs bf16
      if native then assert.is_true(e > 1e-6, ("output %d ran in float32"):format(i)) end
    end
  end)

  it("keeps the gradients float32 and close", function()
    flow.manual_seed(9)
    local function grads(ac)
      local x, w = flow.randn({ 8, 16 }):requires_grad_(true), flow.randn({ 16, 16 }):requires_grad_(true)
      flow.manual_seed(9)
      local function f() flow.matmul(x, w):tanh():sum():backward() end
      if ac then flow.autocast("bfloat16", f) else f() end
      return x.grad, w.grad
    end
    local gx, gw = grads(false)
    local hx, hw = grads(true)
    assert.are.equal("float32", hw.dtype)
    assert.is_true(rel_err(hx, gx) < 3e-2 and rel_err(hw, gw) < 3e-2)
  end)

  -- Output of a fresh flowlua running autocast(dtype) matmuls and a conv, then printing whether
  -- bf16 is native and the largest difference from float32 (stderr included).
  local function run_autocast(env, dtype)
    local bin = os.getenv("FLOW_BIN")
    if not bin then return nil end
    local script = os.tmpname()
    local f = assert(io.open(script, "w"))
    f:write(([[
local flow = require "flow"
flow.manual_seed(1)
local a, b = flow.randn({ 33, 47 }), flow.randn({ 47, 21 })
local img, k = flow.randn({ 2, 3, 9, 9 }), flow.randn({ 4, 3, 3, 3 })
local y, c = flow.matmul(a, b), flow.conv2d(img, k)
local h, hc = flow.autocast("%s", function() flow.matmul(a, b); return flow.matmul(a, b), flow.conv2d(img, k) end)
print(flow._bench.onednn().bf16, h.dtype, math.max((y - h):abs():max():item(), (c - hc):abs():max():item()))
]]):format(dtype))
    f:close()
    local p = io.popen(env .. bin .. " " .. script .. " 2>&1")
    local out = p:read("a")
    p:close()
    os.remove(script)
    return out
  end

  it("falls back to float32 with one message when FLOW_NO_BF16 is set", function()
    local out = run_autocast("FLOW_NO_BF16=1 ", "bfloat16")
    if not out then return pending("FLOW_BIN is not set") end
    assert.matches("bf16 autocast on cpu runs in float32 here %(FLOW_NO_BF16 is set%)", out)
    local _, count = out:gsub("bf16 autocast on cpu", "")
    assert.are.equal(1, count)
    assert.matches("false\tfloat32\t0%.0", out)
  end)

  it("runs float16 autocast in float32, saying so once (oneDNN has no float16 on the CPU)", function()
    local out = run_autocast("", "float16")
    if not out then return pending("FLOW_BIN is not set") end
    assert.matches("float16 autocast on cpu runs in float32 %(oneDNN has no float16 GEMM or convolution on the CPU; use bfloat16%)", out)
    local _, count = out:gsub("float16 autocast on cpu", "")
    assert.are.equal(1, count)
    assert.matches("\tfloat32\t0%.0", out)
  end)
end)
