-- The CUDA backend: every op on cuda against the same op on the CPU (float32 tight, bfloat16 loose),
-- matmul, the caching allocator, moving tensors. Without a GPU each CUDA spec is pending with the
-- reason; the availability spec always runs.
local flow = require "flow"

local gpu = flow.cuda.is_available()
local reason = gpu and "" or ("no GPU: " .. tostring(flow.cuda.unavailable_reason()))
if not gpu then io.stderr:write("cuda_spec: CUDA specs pending (" .. reason .. ")\n") end

-- `it` on a GPU, a pending spec naming the reason elsewhere.
local function git(name, fn)
  if gpu then it(name, fn) else it(name, function() pending(reason) end) end
end

-- Deterministic pseudo-random values in [lo, hi) (a small LCG: no dependency on flow.rand).
local seed = 12345
local function values(n, lo, hi)
  local out = {}
  for i = 1, n do
    seed = (seed * 1103515245 + 12345) % 2147483648
    out[i] = lo + (hi - lo) * seed / 2147483648
  end
  return out
end

local function randt(shape, lo, hi)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return flow.tensor(values(n, lo or -1, hi or 1)):reshape(shape)
end

local function flat(t, out)
  out = out or {}
  if type(t) ~= "table" then out[#out + 1] = t return out end
  for _, v in ipairs(t) do flat(v, out) end
  return out
end

-- a (CPU result) and b (any device) agree elementwise within atol + rtol * |a|.
local function close(a, b, rtol, atol)
  assert.same(a:shape(), b:shape())
  local x = flat(a:to("float64"):totable())
  local y = flat(b:cpu():to("float64"):totable())
  for i = 1, #x do
    local tol = (atol or 1e-5) + (rtol or 1e-5) * math.abs(x[i])
    if not (math.abs(x[i] - y[i]) <= tol) then
      error(string.format("element %d: cpu %.7g vs cuda %.7g (tolerance %.3g)", i, x[i], y[i], tol), 2)
    end
  end
end

-- close with the absolute tolerance rtol * max |a|: for results in half precision, whose rounding
-- error follows the tensor's scale (a gradient that cancels to near 0 keeps the error of its terms).
local function close_scaled(a, b, rtol)
  local m = 0
  for _, v in ipairs(flat(a:to("float64"):totable())) do m = math.max(m, math.abs(v)) end
  close(a, b, rtol, rtol * m)
end

local function cuda(t, dtype) return t:to({ device = "cuda", dtype = dtype }) end

describe("cuda availability", function()
  it("reports the GPU state and errors clearly when creating a cuda tensor without one", function()
    if gpu then
      assert.is_true(flow.cuda.device_count() > 0)
      assert.is_nil(flow.cuda.unavailable_reason())
    else
      assert.is_false(flow.cuda.is_available())
      assert.equals(0, flow.cuda.device_count())
      local ok, err = pcall(flow.zeros, { 2, 3 }, { device = "cuda" })
      assert.is_false(ok)
      assert.matches("cuda is not available %(", err)
      ok, err = pcall(flow.tensor, { 1, 2 }, { device = "cuda" })
      assert.is_false(ok)
      assert.matches("cuda is not available %(", err)
      local t = flow.tensor({ 1, 2 })
      ok, err = pcall(t.cuda, t)
      assert.matches("cuda is not available", err)
      ok, err = pcall(flow.cuda.memory_stats)
      assert.matches("cuda is not available", err)
    end
  end)

  it("every op of the registry has a CUDA kernel in a CUDA build (GPU or not)", function()
    local have, unmatched = flow.cuda._kernels()
    if not have then return pending("this build has no CUDA support") end
    local missing = {}
    for _, op in ipairs(flow._ops()) do
      if not have[op.name] then missing[#missing + 1] = op.name end
    end
    assert.same({}, missing)
    assert.same({}, unmatched) -- kernels attached to names no op has
    assert.is_true(have.matmul and have.linear and have.conv2d and have.adamw_ and have.to_global)
  end)

  it("t:to parses dtypes, devices and option tables on the CPU", function()
    local t = flow.tensor({ 1.5, -2 })
    assert.equals(t, t:to("cpu"))
    assert.equals("float64", t:to("float64").dtype)
    assert.equals("bfloat16", t:to({ dtype = "bfloat16" }).dtype)
    assert.same({ 1.5, -2 }, t:to("float64"):totable())
    local ok, err = pcall(t.to, t, "banana")
    assert.is_false(ok)
    assert.matches("to: 'banana' is neither a dtype nor a device", err)
    local leaf = t:to({ dtype = "float64", requires_grad = true })
    assert.is_true(leaf.requires_grad)
    assert.is_true(leaf.is_leaf)
  end)

  it("flow.backends.allow_tf32 and flow.autocast keep their settings", function()
    local prev = flow.backends.allow_tf32
    flow.backends.allow_tf32 = true
    assert.is_true(flow.backends.allow_tf32)
    flow.backends.allow_tf32 = prev
    local a, b = flow.autocast("bfloat16", function(x, y) return x + y, "done" end, 2, 3)
    assert.equals(5, a)
    assert.equals("done", b)
    local ok, err = pcall(flow.autocast, "int64", function() end)
    assert.matches("autocast: dtype must be bfloat16 or float16", err)
    ok, err = pcall(flow.autocast, "bfloat16", function() error("inner failure") end)
    assert.matches("inner failure", err)
  end)
end)

describe("cuda tensors", function()
  git("round-trip through to/cuda/cpu, item and totable", function()
    local t = flow.tensor({ { 1, 2, 3 }, { 4, 5, 6 } })
    local c = t:cuda()
    assert.equals("cuda:0", c.device)
    assert.same(t:totable(), c:totable())
    assert.same(t:totable(), c:cpu():totable())
    assert.equals(21, c:to("float32"):sum():item())
    local b = cuda(t:to("float32"), "bfloat16")
    assert.equals("bfloat16", b.dtype)
    assert.same({ { 1, 2, 3 }, { 4, 5, 6 } }, b:to({ device = "cpu", dtype = "float32" }):totable())
    assert.same({ { 1, 4 }, { 2, 5 }, { 3, 6 } }, c:transpose(0, 1):contiguous():cpu():totable())
  end)

  git("moves gradients back across devices", function()
    local x = flow.tensor({ 1, 2, 3 }, { requires_grad = true })
    local y = (x:cuda() * x:cuda()):sum()
    y:backward()
    assert.equals("cpu", x.grad.device)
    assert.same({ 2, 4, 6 }, x.grad:totable())
  end)

  git("fills on the device", function()
    assert.same({ { 0, 0 }, { 0, 0 } }, flow.zeros({ 2, 2 }, { device = "cuda" }):totable())
    assert.same({ 2.5, 2.5, 2.5 }, flow.full({ 3 }, 2.5, { device = "cuda" }):totable())
    assert.same({ 1, 1 }, flow.ones({ 2 }, { device = "cuda", dtype = "int64" }):totable())
  end)
end)

describe("cuda elementwise ops match the CPU", function()
  local binary = { "add", "sub", "mul", "div", "maximum", "minimum" }
  for _, op in ipairs(binary) do
    git(op .. " with broadcasting and strides, float32", function()
      local a, b = randt({ 4, 5 }), randt({ 5 }, 0.5, 2)
      close(flow[op](a, b), flow[op](cuda(a), cuda(b)))
      close(flow[op](a:transpose(0, 1), 0.5), flow[op](cuda(a):transpose(0, 1), 0.5))
    end)
    git(op .. " in bfloat16", function()
      local a, b = randt({ 4, 5 }), randt({ 5 }, 0.5, 2)
      close(flow[op](a, b), flow[op](cuda(a, "bfloat16"), cuda(b, "bfloat16")):to("float32"), 3e-2, 3e-2)
    end)
  end

  git("pow", function()
    local a, b = randt({ 3, 4 }, 0.5, 2), randt({ 3, 4 })
    close(flow.pow(a, b), flow.pow(cuda(a), cuda(b)), 1e-5)
  end)

  for _, op in ipairs({ "eq", "ne", "lt", "le", "gt", "ge" }) do
    git(op .. " writes bool", function()
      local a, b = flow.tensor({ 1, 2, 3, 4 }), flow.tensor({ 2, 2, 2, 2 })
      local r = flow[op](cuda(a), cuda(b))
      assert.equals("bool", r.dtype)
      assert.same(flow[op](a, b):totable(), r:totable())
    end)
  end

  local unary = { neg = { -2, 2 }, abs = { -2, 2 }, exp = { -2, 2 }, log = { 0.1, 3 }, sqrt = { 0.1, 3 },
                  rsqrt = { 0.1, 3 }, tanh = { -3, 3 }, sigmoid = { -4, 4 }, relu = { -2, 2 }, gelu = { -3, 3 } }
  for op, range in pairs(unary) do
    git(op .. " in bfloat16", function()
      local a = randt({ 6, 7 }, range[1], range[2])
      close(flow[op](a), flow[op](cuda(a, "bfloat16")):to("float32"), 2e-2, 2e-2)
    end)
    git(op .. " forward and gradient", function()
      local a = randt({ 6, 7 }, range[1], range[2])
      close(flow[op](a), flow[op](cuda(a)), 1e-5, 1e-6)
      local x, xc = a:detach():requires_grad_(), cuda(a):detach():requires_grad_()
      flow[op](x):sum():backward()
      flow[op](xc):sum():backward()
      close(x.grad, xc.grad, 1e-5, 1e-6)
    end)
  end

  git("clamp, where and masked_fill", function()
    local a = randt({ 5, 3 }, -2, 2)
    close(flow.clamp(a, -0.5, 0.7), flow.clamp(cuda(a), -0.5, 0.7))
    local m = flow.gt(a, 0)
    close(flow.where(m, a, 0.25 * a), flow.where(cuda(m), cuda(a), cuda(0.25 * a)))
    close(flow.masked_fill(a, m, -9), flow.masked_fill(cuda(a), cuda(m), -9))
  end)

  git("casts between every dtype pair through the device", function()
    local a = flow.tensor({ -3, 0, 1, 2.5, 7 })
    for _, from in ipairs({ "float32", "float64", "bfloat16", "float16", "int64", "int32" }) do
      for _, to in ipairs({ "float32", "float64", "int64", "int32", "bool" }) do
        local want = a:to(from):to(to):totable()
        assert.same(want, cuda(a):to(from):to(to):totable())
      end
    end
  end)
end)

describe("cuda shape and creation ops match the CPU", function()
  git("cat, narrow's gradient, tril and triu", function()
    local a, b = randt({ 2, 3 }), randt({ 2, 4 })
    close(flow.cat({ a, b }, 1), flow.cat({ cuda(a), cuda(b) }, 1))
    local x, xc, w = a:detach():requires_grad_(), cuda(a):detach():requires_grad_(), randt({ 2, 2 })
    flow.sum(flow.narrow(x, 1, 1, 2) * w):backward()
    flow.sum(flow.narrow(xc, 1, 1, 2) * cuda(w)):backward()
    close(x.grad, xc.grad)
    local m = randt({ 3, 4, 5 })
    close(flow.tril(m, 1), flow.tril(cuda(m), 1))
    close(flow.triu(m, -1), flow.triu(cuda(m), -1))
  end)

  git("random and range ops give the CPU's numbers", function()
    for _, f in ipairs({ "rand", "randn" }) do
      flow.manual_seed(7)
      local r = flow[f]({ 3, 4 })
      flow.manual_seed(7)
      close(r, flow[f]({ 3, 4 }, { device = "cuda" }), 1e-6, 1e-7) -- randn: libm vs CUDA's log/cos
    end
    local x = randt({ 50 })
    flow.manual_seed(3)
    local d = flow.dropout(x, 0.3)
    flow.manual_seed(3)
    close(d, flow.dropout(cuda(x), 0.3), 0, 0)
    assert.same({ 0, 2, 4 }, flow.arange(0, 6, 2, { dtype = "int64", device = "cuda" }):totable())
  end)
end)

describe("cuda reductions match the CPU", function()
  git("sum and mean over axes, keepdim", function()
    local a = randt({ 4, 6, 5 })
    for _, axes in ipairs({ 0, 1, 2, { 0, 2 }, { 1, 2 } }) do
      close(flow.sum(a, axes), flow.sum(cuda(a), axes), 1e-5, 1e-5)
      close(flow.mean(a, axes, true), flow.mean(cuda(a), axes, true), 1e-5, 1e-5)
    end
    close(flow.sum(a), flow.sum(cuda(a)), 1e-5, 1e-4)
  end)

  git("sum in bfloat16", function()
    local a = randt({ 4, 6, 5 })
    close(flow.sum(a, 1), flow.sum(cuda(a, "bfloat16"), 1):to("float32"), 3e-2, 3e-2)
  end)

  git("max and argmax along an axis", function()
    local a = randt({ 5, 7 })
    local v, i = flow.max(a, 1)
    local vc, ic = flow.max(cuda(a), 1)
    close(v, vc)
    assert.same(i:totable(), ic:totable())
    close(flow.max(a), flow.max(cuda(a)))
    assert.same(flow.argmax(a, 0):totable(), flow.argmax(cuda(a), 0):totable())
  end)
end)

describe("cuda matmul", function()
  git("matches the CPU with transposes and broadcast batches", function()
    local a, b = randt({ 3, 17, 33 }), randt({ 33, 9 })
    close(flow.matmul(a, b), flow.matmul(cuda(a), cuda(b)), 1e-4, 1e-4)
    local bt = randt({ 3, 9, 33 })
    close(flow.matmul(a, bt, { transpose_b = true }), flow.matmul(cuda(a), cuda(bt), { transpose_b = true }), 1e-4, 1e-4)
    local at = randt({ 33, 17 })
    close(flow.matmul(at, b, { transpose_a = true }), flow.matmul(cuda(at), cuda(b), { transpose_a = true }), 1e-4, 1e-4)
    close(flow.matmul(a:transpose(1, 2):contiguous():transpose(1, 2), b),
          flow.matmul(cuda(a):transpose(1, 2):contiguous():transpose(1, 2), cuda(b)), 1e-4, 1e-4)
  end)

  git("bfloat16, tf32 and autocast stay close to float32", function()
    local a, b = randt({ 64, 48 }), randt({ 48, 32 })
    local ref = flow.matmul(a, b)
    close(ref, flow.matmul(cuda(a, "bfloat16"), cuda(b, "bfloat16")):to("float32"), 3e-2, 3e-2)
    flow.backends.allow_tf32 = true
    close(ref, flow.matmul(cuda(a), cuda(b)), 5e-3, 5e-3)
    flow.backends.allow_tf32 = false
    local y = flow.autocast("bfloat16", function() return flow.matmul(cuda(a), cuda(b)) end)
    assert.equals("float32", y.dtype)
    close(ref, y, 3e-2, 3e-2)
  end)

  git("gradients match the CPU", function()
    local a, b = randt({ 2, 5, 4 }), randt({ 4, 3 })
    local x, w = a:detach():requires_grad_(), b:detach():requires_grad_()
    local xc, wc = cuda(a):detach():requires_grad_(), cuda(b):detach():requires_grad_()
    flow.matmul(x, w):sum():backward()
    flow.matmul(xc, wc):sum():backward()
    close(x.grad, xc.grad, 1e-4, 1e-5)
    close(w.grad, wc.grad, 1e-4, 1e-5)
  end)
end)

describe("cuda fused nn ops match the CPU", function()
  -- Run f on CPU leaves and CUDA leaves; compare outputs and every input's gradient. With dtype
  -- (bfloat16, float16) the CUDA side computes in it and the CPU in float32 from the same rounded
  -- inputs, so only the kernels' own error counts: within rtol of the tensor's scale.
  local function both(f, inputs, dtype, rtol)
    local function round(t) return dtype and t.dtype == "float32" and t:to(dtype):to("float32") or t end
    local function same(a, b)
      if dtype then close_scaled(a, b, rtol) else close(a, b, 1e-4, 1e-5) end
    end
    local cl, gl = {}, {}
    for i, t in ipairs(inputs) do
      t = round(t)
      cl[i] = t.dtype == "float32" and t:detach():requires_grad_() or t
      gl[i] = t.dtype == "float32" and cuda(t, dtype):detach():requires_grad_() or cuda(t)
    end
    local yc, yg = f(table.unpack(cl)), f(table.unpack(gl))
    assert.equals(dtype or "float32", yg.dtype)
    same(yc, yg)
    local w = round(randt(yc:shape()))
    flow.sum(yc * w):backward()
    flow.sum(yg * cuda(w, dtype)):backward()
    for i = 1, #inputs do
      if cl[i].requires_grad then same(cl[i].grad, gl[i].grad) end
    end
  end

  -- rtol per half dtype: about 4 roundings to its 8 or 11 significant bits (a list: a fixed order
  -- keeps randt's values the same from run to run)
  local halves = { { "bfloat16", 2e-2 }, { "float16", 2e-3 } }

  git("softmax and log_softmax on the last and a middle axis", function()
    both(function(x) return flow.softmax(x, -1) end, { randt({ 3, 4, 37 }, -3, 3) })
    both(function(x) return flow.log_softmax(x, -1) end, { randt({ 3, 4, 37 }, -3, 3) })
    both(function(x) return flow.softmax(x, 1) end, { randt({ 3, 4, 5 }, -3, 3) })
  end)

  git("layer_norm with and without affine", function()
    both(function(x, w, b) return flow.layer_norm(x, w, b, 1e-5) end,
         { randt({ 4, 3, 48 }), randt({ 48 }, 0.5, 1.5), randt({ 48 }) })
    both(function(x) return flow.layer_norm(x, nil, nil, 1e-5) end, { randt({ 5, 33 }) })
  end)

  git("conv2d (stride, padding, dilation, groups), max/avg pool2d through cuDNN", function()
    both(function(x, w, b) return flow.conv2d(x, w, b, { stride = 2, padding = 1 }) end,
         { randt({ 2, 3, 9, 8 }), randt({ 4, 3, 3, 3 }), randt({ 4 }) })
    both(function(x, w) return flow.conv2d(x, w, nil, { dilation = 2, groups = 2, padding = { 1, 2 } }) end,
         { randt({ 1, 4, 7, 7 }), randt({ 6, 2, 3, 2 }) })
    both(function(x) return flow.max_pool2d(x, { kernel = 3, stride = 2, padding = 1 }) end, { randt({ 2, 3, 8, 7 }) })
    both(function(x) return flow.avg_pool2d(x, { kernel = 2, stride = 1 }) end, { randt({ 2, 3, 5, 6 }) })
  end)

  git("batch_norm, training (running stats updated) and eval", function()
    local rm, rv = randt({ 3 }), randt({ 3 }, 0.5, 2)
    local rmc, rvc = cuda(rm), cuda(rv)
    local function bn(training)
      return function(x, w, b)
        local cpu = x.device == "cpu"
        return flow.batch_norm(x, w, b, cpu and rm or rmc, cpu and rv or rvc, { training = training, momentum = 0.2 })
      end
    end
    both(bn(true), { randt({ 4, 3, 5, 5 }), randt({ 3 }, 0.5, 1.5), randt({ 3 }) })
    close(rm, rmc, 1e-4, 1e-5)
    close(rv, rvc, 1e-4, 1e-5)
    both(bn(false), { randt({ 2, 3, 4, 4 }), randt({ 3 }, 0.5, 1.5), randt({ 3 }) })
  end)

  git("cross_entropy with ignore_index and every reduction", function()
    local target = flow.tensor({ 0, 3, -100, 6, 2, 1 })
    for _, red in ipairs({ "mean", "sum", "none" }) do
      both(function(x, t) return flow.cross_entropy(x, t, { reduction = red }) end, { randt({ 6, 7 }, -2, 2), target })
    end
  end)

  git("embedding forward and gradient with repeated ids", function()
    both(function(ids, w) return flow.embedding(ids, w) end, { flow.tensor({ { 1, 3, 1 }, { 0, 4, 3 } }), randt({ 5, 8 }) })
  end)

  git("scaled_dot_product_attention, causal and not", function()
    for _, causal in ipairs({ true, false }) do
      both(function(q, k, v) return flow.scaled_dot_product_attention(q, k, v, { causal = causal }) end,
           { randt({ 2, 3, 19, 16 }), randt({ 2, 3, 19, 16 }), randt({ 2, 3, 19, 16 }) })
    end
  end)

  git("attention under bf16 autocast stays float32 and close", function()
    local q, k, v = randt({ 1, 2, 70, 64 }), randt({ 1, 2, 70, 64 }), randt({ 1, 2, 70, 64 })
    local ref = flow.scaled_dot_product_attention(q, k, v, { causal = true })
    local y = flow.autocast("bfloat16", function()
      return flow.scaled_dot_product_attention(cuda(q), cuda(k), cuda(v), { causal = true })
    end)
    assert.equals("float32", y.dtype)
    close(ref, y, 3e-2, 3e-2)
  end)

  -- Rows of 1000 and 4097 elements: not a multiple of the 256-thread block, and longer than it.
  for _, half in ipairs(halves) do
    local dtype, rtol = half[1], half[2]
    git("softmax and log_softmax forward and gradient in " .. dtype, function()
      for _, op in ipairs({ "softmax", "log_softmax" }) do
        both(function(x) return flow[op](x, -1) end, { randt({ 3, 1000 }, -3, 3) }, dtype, rtol)
        both(function(x) return flow[op](x, -1) end, { randt({ 2, 4097 }, -3, 3) }, dtype, rtol)
        both(function(x) return flow[op](x, 1) end, { randt({ 2, 1000, 3 }, -3, 3) }, dtype, rtol)
      end
    end)

    git("layer_norm forward and gradients in " .. dtype, function()
      for _, C in ipairs({ 1000, 4097 }) do
        both(function(x, w, b) return flow.layer_norm(x, w, b, 1e-5) end,
             { randt({ 3, C }, -2, 3), randt({ C }, 0.5, 1.5), randt({ C }) }, dtype, rtol)
      end
      both(function(x) return flow.layer_norm(x, nil, nil, 1e-5) end, { randt({ 5, 1000 }) }, dtype, rtol)
    end)

    git("cross_entropy forward and gradient in " .. dtype, function()
      for _, C in ipairs({ 1000, 4097 }) do
        local target = flow.tensor({ 0, C - 1, -100, 7, C // 2 })
        for _, red in ipairs({ "mean", "none" }) do
          both(function(x, t) return flow.cross_entropy(x, t, { reduction = red }) end,
               { randt({ 5, C }, -3, 3), target }, dtype, rtol)
        end
      end
    end)

    git("scaled_dot_product_attention forward and gradients in " .. dtype, function()
      both(function(q, k, v) return flow.scaled_dot_product_attention(q, k, v) end,
           { randt({ 1, 2, 37, 64 }), randt({ 1, 2, 1000, 64 }), randt({ 1, 2, 1000, 64 }) }, dtype, rtol)
      both(function(q, k, v) return flow.scaled_dot_product_attention(q, k, v, { causal = true }) end,
           { randt({ 1, 2, 130, 40 }), randt({ 1, 2, 130, 40 }), randt({ 1, 2, 130, 24 }) }, dtype, rtol)
    end)

    git("adamw_ in " .. dtype .. " computes in float32", function()
      local function r(t) return t:to(dtype):to("float32") end
      local p, g = r(randt({ 7, 5 })), r(randt({ 7, 5 }))
      local m, v = r(randt({ 7, 5 }, -0.1, 0.1)), r(randt({ 7, 5 }, 0, 0.1))
      local pc, gc, mc, vc = cuda(p, dtype), cuda(g, dtype), cuda(m, dtype), cuda(v, dtype)
      local opts = { lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, step = 3 }
      flow.adamw_(p, g, m, v, opts)
      flow.adamw_(pc, gc, mc, vc, opts)
      close_scaled(p, pc, rtol)
      close_scaled(m, mc, rtol)
      close_scaled(v, vc, rtol)
    end)
  end

  git("attention under f16 autocast stays float32 and close", function()
    local q, k, v = randt({ 1, 2, 70, 64 }), randt({ 1, 2, 70, 64 }), randt({ 1, 2, 70, 64 })
    local ref = flow.scaled_dot_product_attention(q, k, v, { causal = true })
    local y = flow.autocast("float16", function()
      return flow.scaled_dot_product_attention(cuda(q), cuda(k), cuda(v), { causal = true })
    end)
    assert.equals("float32", y.dtype)
    close(ref, y, 5e-3, 5e-3)
  end)

  git("adamw_ updates in place like the CPU", function()
    local p, g = randt({ 7, 5 }), randt({ 7, 5 })
    local m, v = flow.zeros({ 7, 5 }), flow.zeros({ 7, 5 })
    local pc, gc, mc, vc = cuda(p), cuda(g), cuda(m), cuda(v)
    local opts = { lr = 1e-2, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, step = 3 }
    flow.adamw_(p, g, m, v, opts)
    flow.adamw_(pc, gc, mc, vc, opts)
    close(p, pc, 1e-5, 1e-6)
    close(m, mc, 1e-5, 1e-6)
    close(v, vc, 1e-5, 1e-6)
  end)
end)

describe("cuda out-of-range indices", function()
  -- A kernel cannot raise: it records the first bad index of its device and the call that next
  -- synchronises raises it, worded as on the CPU. Each case: the op itself returns, reading its
  -- result raises, and the device then gives the right numbers again.
  local function raises_when_read(pattern, f)
    local y = f()
    local ok, err = pcall(y.cpu, y)
    assert.is_false(ok)
    assert.matches(pattern, err)
    assert.matches("found by a CUDA kernel on cuda:0; reported at the next synchronisation", err, 1, true)
    flow.cuda.synchronize() -- the record was cleared: nothing left to raise
  end

  local function long(t) return flow.tensor(t, { dtype = "int64" }) end

  git("embedding", function()
    local w = randt({ 5, 3 })
    raises_when_read("embedding: index 7 out of range %[0, 5%)",
                     function() return flow.embedding(cuda(long({ 1, 7, 2 })), cuda(w)) end)
    close(flow.embedding(long({ 4, 0 }), w), flow.embedding(cuda(long({ 4, 0 })), cuda(w)))
  end)

  git("gather", function()
    local t = randt({ 2, 3 })
    raises_when_read("gather: index %-1 out of range %[0, 3%) on axis 1",
                     function() return flow.gather(cuda(t), 1, cuda(long({ { 0 }, { -1 } }))) end)
    close(flow.gather(t, 1, long({ { 2 }, { 0 } })), flow.gather(cuda(t), 1, cuda(long({ { 2 }, { 0 } }))))
  end)

  git("index_select", function()
    local t = randt({ 3, 4 })
    raises_when_read("index_select: index 4 out of range %[0, 4%) on axis 1",
                     function() return flow.index_select(cuda(t), 1, cuda(long({ 0, 4 }))) end)
    close(flow.index_select(t, 1, long({ 3, 1 })), flow.index_select(cuda(t), 1, cuda(long({ 3, 1 }))))
  end)

  git("scatter_add", function()
    local t, src = randt({ 2, 3 }), randt({ 2, 1 })
    raises_when_read("scatter_add: index 3 out of range %[0, 3%) on axis 1",
                     function() return flow.scatter_add(cuda(t), 1, cuda(long({ { 0 }, { 3 } })), cuda(src)) end)
    close(flow.scatter_add(t, 1, long({ { 0 }, { 2 } }), src),
          flow.scatter_add(cuda(t), 1, cuda(long({ { 0 }, { 2 } })), cuda(src)))
  end)

  git("cross_entropy, and flow.cuda.synchronize raises it too", function()
    local x = randt({ 3, 4 })
    raises_when_read("cross_entropy: target 9 is out of range for 4 classes",
                     function() return flow.cross_entropy(cuda(x), cuda(long({ 0, 9, -100 }))) end)
    flow.cross_entropy(cuda(x), cuda(long({ 1, -5, 2 })), { reduction = "none" })
    local ok, err = pcall(flow.cuda.synchronize)
    assert.is_false(ok)
    assert.matches("cross_entropy: target %-5 is out of range", err)
    local t = long({ 3, 0, -100 })
    close(flow.cross_entropy(x, t), flow.cross_entropy(cuda(x), cuda(t)), 1e-5, 1e-6)
  end)
end)

describe("cuda NCCL backend", function()
  git("allreduce sums over the ranks (a world of one keeps the values)", function()
    local t = flow.tensor({ 1.5, -2, 3 }):cuda()
    local n = flow.world_size and flow.world_size() or 1
    flow.cuda._nccl_allreduce(t)
    assert.same({ 1.5 * n, -2 * n, 3 * n }, t:totable())
  end)
end)

describe("cuda caching allocator", function()
  git("reuses freed blocks and reports its statistics", function()
    collectgarbage()
    collectgarbage("stop") -- no other tensor may be freed while the counts are compared
    flow.cuda.synchronize()
    local s0 = flow.cuda.memory_stats()
    local t = flow.zeros({ 1024, 256 }, { device = "cuda" }) -- 1 MiB
    local s1 = flow.cuda.memory_stats()
    assert.is_true(s1.allocated - s0.allocated >= 1024 * 256 * 4)
    assert.is_true(s1.peak >= s1.allocated)
    assert.equals(s0.num_allocs + 1, s1.num_allocs)
    t:free()
    local s2 = flow.cuda.memory_stats()
    assert.equals(s0.allocated, s2.allocated)
    local u = flow.zeros({ 1024, 256 }, { device = "cuda" })
    local s3 = flow.cuda.memory_stats()
    assert.equals(s2.cache_hits + 1, s3.cache_hits)
    assert.equals(s2.reserved, s3.reserved)
    u:free()
    collectgarbage("restart")
    flow.cuda.empty_cache()
    assert.is_true(flow.cuda.memory_stats().reserved < s3.reserved)
  end)
end)

-- Dense, 16-byte aligned operands take the vectorised kernels (16 bytes per load); a tail that
-- is not a whole vector, broadcasts and misaligned views take the strided ones. Both must agree
-- with the CPU.
describe("cuda elementwise: vectorised and strided paths", function()
  local n = 4099 -- not a multiple of any vector width
  git("add, mul and gelu (and its gradient) on dense float32 and bfloat16, with a tail", function()
    local a, b = randt({ n }), randt({ n })
    for _, dt in ipairs({ "float32", "bfloat16" }) do
      local tol = dt == "float32" and 1e-5 or 2e-2
      local ac, bc = cuda(a, dt), cuda(b, dt)
      local ah, bh = ac:cpu():float(), bc:cpu():float()
      close(ah + bh, (ac + bc):float(), tol, tol)
      close(ah * bh, (ac * bc):float(), tol, tol)
      close(flow.nn.functional.gelu(ah), flow.nn.functional.gelu(ac):float(), tol, tol)
    end
    local x, xc = a:detach():requires_grad_(), cuda(a):detach():requires_grad_()
    flow.sum(flow.nn.functional.gelu(x) * b):backward()
    flow.sum(flow.nn.functional.gelu(xc) * cuda(b)):backward()
    close(x.grad, xc.grad, 1e-5, 1e-5)
  end)
  git("misaligned views and broadcasts give the same numbers", function()
    local a, b = randt({ n }), randt({ 1 })
    local ac = cuda(a)
    local av, acv = a:narrow(0, 1, n - 1), ac:narrow(0, 1, n - 1) -- 4 bytes off: no vectors
    close(av + av, acv + acv)
    close(a + b, ac + cuda(b))
    close(flow.exp(av), flow.exp(acv))
  end)
end)

describe("cuda fused linear", function()
  git("x W^T + b (the bias written first, GEMM adding onto it) and its gradients match the CPU", function()
    local x, w, b = randt({ 37, 19 }), randt({ 11, 19 }), randt({ 11 })
    local F = flow.nn.functional
    close(F.linear(x, w, b), F.linear(cuda(x), cuda(w), cuda(b)), 1e-5, 1e-5)
    local x1, w1, b1 = x:detach():requires_grad_(), w:detach():requires_grad_(), b:detach():requires_grad_()
    local x2, w2, b2 = cuda(x):detach():requires_grad_(), cuda(w):detach():requires_grad_(), cuda(b):detach():requires_grad_()
    flow.sum(F.linear(x1, w1, b1):tanh()):backward()
    flow.sum(F.linear(x2, w2, b2):tanh()):backward()
    close(x1.grad, x2.grad, 1e-5, 1e-5)
    close(w1.grad, w2.grad, 1e-5, 1e-5)
    close(b1.grad, b2.grad, 1e-5, 1e-5)
    local y = flow.autocast("bfloat16", function() return F.linear(cuda(x), cuda(w), cuda(b)) end)
    assert.equals("float32", y.dtype)
    close(F.linear(x, w, b), y, 2e-2, 5e-2)
  end)
end)

describe("cuda graph mode", function()
  git("a GPT step traced into nn.Graph on cuda gives the eager cuda losses (5 steps)", function()
    local gpt = require "flow.gpt"
    local cfg = { vocab_size = 32, block_size = 8, n_layer = 2, n_head = 2, n_embd = 16 }
    local function make()
      flow.manual_seed(3)
      local m = gpt.GPT(cfg)
      m:to("cuda:0")
      return m, m:configure_optimizer({ lr = 1e-2, weight_decay = 0.1 })
    end
    flow.manual_seed(4)
    local idx, tgt = cuda(flow.randint(0, 32, { 4, 8 })), cuda(flow.randint(0, 32, { 4, 8 }))
    local m1, o1 = make()
    local m2, o2 = make()
    local G = flow.nn.Graph { model = m2, optimizer = o2, clip_grad_norm = 1.0,
      build = function(self, x, y) local _, l = self.model(x, y); l:backward(); return l end }
    for _ = 1, 5 do
      local _, l = m1(idx, tgt)
      l:backward()
      flow.optim.clip_grad_norm(m1:parameters(), 1.0)
      o1:step(); o1:zero_grad()
      assert.near(l:item(), G(idx, tgt):item(), 1e-4)
    end
    assert.equal("cuda:0", m2.wte.weight.device)
  end)
end)
