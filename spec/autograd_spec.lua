local flow = require "flow"

local function leaf(values)
  return flow.tensor(values, {dtype = "float64", requires_grad = true})
end

local function close(expected, got, tol)
  tol = tol or 1e-12
  assert.are.equal(#expected, #got)
  for i = 1, #expected do
    assert.is_true(math.abs(expected[i] - got[i]) <= tol,
      ("element %d: expected %.17g, got %.17g"):format(i, expected[i], got[i]))
  end
end

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("gradient accumulation", function()
  it("sums the contributions of a tensor used several times", function()
    local x = leaf({1, 2, 3})
    ;(x * x + x * 3):sum():backward()     -- d/dx (x^2 + 3x) = 2x + 3
    close({5, 7, 9}, x.grad:totable())
  end)

  it("adds up across backward calls until grad is cleared", function()
    local x = leaf({1, -2})
    local w = leaf({3, 4})
    for _ = 1, 3 do (x * w):sum():backward() end
    close({9, 12}, x.grad:totable())
    close({3, -6}, w.grad:totable())
    x.grad = nil
    assert.is_nil(x.grad)
    ;(x * w):sum():backward()
    close({3, 4}, x.grad:totable())
    close({4, -8}, w.grad:totable())
  end)

  it("broadcast inputs receive gradients of their own shape", function()
    local x = leaf({{1, 2, 3}, {4, 5, 6}})
    local b = leaf({10, 20, 30})
    ;(x * b):sum():backward()
    assert.are.same({3}, b.grad:shape())
    close({5, 7, 9}, b.grad:totable())
    close({10, 20, 30}, x.grad:totable()[2])
  end)

  it("a stored grad is not an alias of the incoming gradient", function()
    local x = leaf({1, 2})
    local g = flow.tensor({5, 6}, {dtype = "float64"})
    local y = x * 1
    y:backward(g, {retain_graph = true})
    y:backward(g)
    close({10, 12}, x.grad:totable())
    close({5, 6}, g:totable())
  end)
end)

  -- The pieces of a split, and narrows that overlap, add into one buffer in place (ops/autograd.c
  -- passes the gathered gradient to narrow's rule); a piece that gets no gradient adds nothing.
  it("split pieces and overlapping narrows fill one gradient, each piece at its place", function()
    local x = leaf({{1, 2, 3, 4, 5, 6}, {7, 8, 9, 10, 11, 12}})
    local y = x * 1
    local p = flow.split(y, 2, 1)
    ;((p[1] * 1):sum() + (p[3] * 3):sum() + (p[2] * p[2]):sum()):backward()
    close({1, 1, 6, 8, 3, 3}, x.grad:totable()[1])
    close({1, 1, 18, 20, 3, 3}, x.grad:totable()[2])
    local z = leaf({1, 2, 3, 4, 5})
    local w = z * 2
    ;((w:narrow(0, 0, 3) * 10):sum() + (w:narrow(0, 2, 3) * 100):sum() + w:narrow(0, 1, 1):sum()):backward()
    close({20, 22, 220, 200, 200}, z.grad:totable())
    -- one piece only: the rest of the gradient is zero
    local u = leaf({1, 2, 3, 4})
    ;(flow.split(u * 1, 2, 0)[2] * 5):sum():backward()
    close({0, 0, 5, 5}, u.grad:totable())
  end)

  it("a leaf's first gradient is kept without a copy only when nothing else holds it", function()
    local x = leaf({1, 2})
    local y = x * 3
    local g = flow.tensor({1, 1}, {dtype = "float64"})
    y:backward(g)                       -- mul's gradient is a fresh tensor: it becomes x.grad
    close({3, 3}, x.grad:totable())
    x:backward(g)                       -- g itself arrives at the leaf: added, not taken
    close({4, 4}, x.grad:totable())
    g:fill_(7)
    close({4, 4}, x.grad:totable())
    x.grad = nil
    x:backward(g)                       -- a first gradient the caller holds is copied
    g:fill_(0)
    close({7, 7}, x.grad:totable())
  end)

describe("grad mode", function()
  after_each(function() flow.set_grad_enabled(true) end) -- a failing test must not leak the mode
  it("no_grad runs fn with arguments, returns its results and records nothing", function()
    local x = leaf({1, 2})
    local y, n = flow.no_grad(function(a, k) return a * 2, k + 1 end, x, 41)
    assert.is_false(y.requires_grad)
    assert.is_true(y.is_leaf)
    assert.are.equal(42, n)
    close({2, 4}, y:totable())
    assert.is_true(flow.is_grad_enabled())
  end)

  it("restores the mode when fn raises", function()
    local err = error_of(flow.no_grad, function() error("boom") end)
    assert.matches("boom", err)
    assert.is_true(flow.is_grad_enabled())
    flow.set_grad_enabled(false)
    error_of(flow.enable_grad, function() error("boom") end)
    assert.is_false(flow.is_grad_enabled())
    flow.set_grad_enabled(true)
  end)

  it("enable_grad inside no_grad records again", function()
    local x = leaf({3})
    local y = flow.no_grad(function()
      assert.is_false(flow.is_grad_enabled())
      return flow.enable_grad(function() return x * x end)
    end)
    assert.is_true(y.requires_grad)
    y:sum():backward()
    close({6}, x.grad:totable())
  end)

  it("set_grad_enabled returns the previous mode", function()
    assert.is_true(flow.set_grad_enabled(false))
    assert.is_false(flow.set_grad_enabled(false))
    assert.is_false(flow.set_grad_enabled(true))
    assert.is_true(flow.is_grad_enabled())
  end)

  it("no_grad wants a function", function()
    assert.matches("function expected", error_of(flow.no_grad, 42))
  end)
end)

describe("requires_grad and detach", function()
  it("propagates from any input that requires grad", function()
    local a = flow.tensor({1, 2}, {dtype = "float64"})
    local b = leaf({3, 4})
    assert.is_false((a + a).requires_grad)
    local c = a + b
    assert.is_true(c.requires_grad)
    assert.is_false(c.is_leaf)
    assert.is_true(b.is_leaf)
    c:sum():backward()
    assert.is_nil(a.grad)
    close({1, 1}, b.grad:totable())
  end)

  it("detach shares values but cuts the graph", function()
    local x = leaf({2, 3})
    local d = (x * x):detach()
    assert.is_false(d.requires_grad)
    assert.is_true(d.is_leaf)
    close({4, 9}, d:totable())
    ;(x * d):sum():backward()          -- d is a constant: gradient is d, not 3x^2
    close({4, 9}, x.grad:totable())
  end)

  it("backward on a tensor that needs no grad is an error", function()
    local a = flow.tensor({1}, {dtype = "float64"})
    assert.matches("does not require grad", error_of(function() a:backward() end))
  end)

  it("only floating-point tensors can require grad", function()
    local i = flow.tensor({1, 2}, {dtype = "int64"})
    assert.matches("floating%-point", error_of(function() i.requires_grad = true end))
  end)
end)

describe("backward errors", function()
  it("a second backward without retain_graph names the op", function()
    local x = leaf({1, 2})
    local s = (x * x):sum()
    s:backward()
    assert.matches("second time.*retain_graph", error_of(function() s:backward() end))
  end)

  it("retain_graph allows a second backward", function()
    local x = leaf({1, 2})
    local s = (x * x):sum()
    s:backward(nil, {retain_graph = true})
    s:backward()
    close({4, 8}, x.grad:totable())
  end)

  it("an in-place change to a tensor saved for backward is caught", function()
    local x = leaf({1, 2})
    local w = flow.tensor({3, 4}, {dtype = "float64", requires_grad = true})
    local y = x * w
    flow.no_grad(function() w:add_(1) end)
    local err = error_of(function() y:sum():backward() end)
    assert.matches("mul", err)
    assert.matches("in%-place", err)
  end)

  it("in-place ops on a tensor that requires grad are refused in grad mode", function()
    local w = leaf({1, 2})
    assert.matches("add_.*in%-place", error_of(function() w:add_(1) end))
  end)

  it("an explicit gradient of another dtype is cast to the tensor's, as torch's engine does", function()
    local x = flow.tensor({1, 2, 3}, {dtype = "float32", requires_grad = true})
    local y = x * 2
    y:backward(flow.tensor({1, 10, 100}))   -- int64
    close({2, 20, 200}, x.grad:totable())
    local z = flow.tensor({1, 2}, {dtype = "float64", requires_grad = true})
    ;(z * 3):backward(flow.tensor({0.5, 0.25}, {dtype = "float32"}))
    close({1.5, 0.75}, z.grad:totable())
    assert.are.equal("float64", z.grad.dtype)
  end)

  it("a non-scalar output needs an explicit gradient", function()
    local x = leaf({1, 2, 3})
    local y = x * 2
    assert.matches("one%-element.*{3}", error_of(function() y:backward() end))
    y:backward(flow.tensor({1, 10, 100}, {dtype = "float64"}))
    close({2, 20, 200}, x.grad:totable())
  end)

  it("a gradient of the wrong shape is refused", function()
    local x = leaf({1, 2, 3})
    local g = flow.tensor({1, 2}, {dtype = "float64"})
    assert.matches("{2}.*{3}", error_of(function() (x * 2):backward(g) end))
  end)
end)

describe("graph shapes", function()
  it("a tensor reached by paths of different lengths gets every contribution once", function()
    local x = leaf({1, 2})
    local y = x * 2
    local z = y * 3 + y          -- 8x
    ;(z * y):sum():backward()     -- d/dx (8x * 2x) = 32x
    close({32, 64}, x.grad:totable())
  end)

  it("an unused output of a multi-output op is a zero gradient", function()
    local x = leaf({1, 2, 3, 4})
    local parts = flow.split(x, 2)
    ;(parts[2] * 5):sum():backward()
    close({0, 0, 5, 5}, x.grad:totable())
  end)

  it("integer outputs (indices) carry no gradient", function()
    local x = leaf({{3, 1}, {2, 5}})
    local v, i = flow.max(x, 1)
    assert.is_true(v.requires_grad)
    assert.is_false(i.requires_grad)
    v:sum():backward()
    close({1, 0}, x.grad:totable()[1])
    close({0, 1}, x.grad:totable()[2])
  end)

  it("a detached alias shares the version counter: writing it invalidates the graph", function()
    local x = leaf({1, 2})
    local d = x:detach()
    local y = x * x
    flow.no_grad(function() d:add_(1) end)
    assert.matches("input 1 of mul.*in%-place", error_of(function() y:sum():backward() end))
  end)
end)

describe("graph size", function()
  it("backward through a chain of 10000 adds does not overflow the stack", function()
    local x = leaf({1})
    local y = x
    for _ = 1, 10000 do y = y + 1 end
    close({10001}, y:totable())
    y:sum():backward()
    close({1}, x.grad:totable())
  end)

  it("freeing a long chain does not recurse", function()
    local x = leaf({1})
    local y = x
    for _ = 1, 10000 do y = y * 1 end
    y = nil
    collectgarbage()
    collectgarbage()
    assert.is_true(x.requires_grad)
  end)

  it("graphs built in a loop are freed", function()
    local w = leaf({{1, 2}, {3, 4}})
    local x = flow.tensor({{1, 0}, {0, 1}}, {dtype = "float64"})
    local function step()
      local y = flow.matmul(x, w)
      ;(y * y):sum():backward()
    end
    for _ = 1, 50 do step() end
    collectgarbage()
    collectgarbage()
    local before = collectgarbage("count")
    for _ = 1, 500 do step() end
    collectgarbage()
    collectgarbage()
    assert.is_true(collectgarbage("count") < before + 64,
      ("Lua heap grew from %.0f KiB to %.0f KiB"):format(before, collectgarbage("count")))
    -- d/dw sum((xw)^2) = 2 x^T x w = 2w per step
    close({2 * 550, 4 * 550}, w.grad:totable()[1])
  end)

  -- Lua's GC sees only tensors' small boxes: lua/bind.c collects by the bytes the allocator holds,
  -- including an output autograd also keeps and the gradient backward makes in C
  it("a loop of fresh leaves and backward on 4 MB tensors stays near its live set, without collectgarbage", function()
    local x, g = flow.randn({1024, 1024}), flow.randn({1024, 1024})
    local last
    local function step()
      local a = x:detach():requires_grad_(true)
      flow.sigmoid(a):backward(g)
      last = a
    end
    step()
    local base = flow._graph.memory(true)   -- and the high-water mark from now on
    for _ = 1, 100 do step() end
    local _, peak = flow._graph.memory()
    -- live: x and g, and per step the output and the gradient (16 MB); without collections the
    -- loop held 8 MB more each step (800 MB)
    assert.is_true(peak - base < 64 * 2 ^ 20, ("peak %.0f MB above the start"):format((peak - base) / 2 ^ 20))
    local s = flow.sigmoid(x)
    assert.is_true((last.grad - s * (1 - s) * g):abs():max():item() < 1e-6)
  end)
end)

describe("registry introspection", function()
  it("_ops lists every op with its arity and differentiability", function()
    local by = {}
    for _, o in ipairs(flow._ops()) do by[o.name] = o end
    assert.are.same({name = "matmul", nin = 2, nout = 1, kind = "compute", differentiable = true}, by.matmul)
    assert.is_false(by.add_.differentiable)
    assert.are.equal("inplace", by.add_.kind)
  end)

  it("_call runs an op by name with attrs and records autograd", function()
    local a = leaf({{1, 2}, {3, 4}})
    local b = flow.tensor({{1, 0}, {0, 2}}, {dtype = "float64"})
    local y = flow._call("matmul", {transpose_a = true}, a, b)   -- a^T b
    close({1, 6}, y:totable()[1])
    close({2, 8}, y:totable()[2])
    local s = flow._call("sum", {axes = {0}, keepdim = true}, y)
    assert.are.same({1, 2}, s:shape())
    s:sum():backward()                 -- d/da = b G^T with G = ones: rows {1,1}, {2,2}
    close({1, 1}, a.grad:totable()[1])
    close({2, 2}, a.grad:totable()[2])
  end)

  it("_call rejects unknown ops and attrs", function()
    local a = leaf({1})
    assert.matches("no op named 'nope'", error_of(flow._call, "nope", {}, a))
    assert.matches("unknown attr 'axs'", error_of(flow._call, "sum", {axs = 0}, a))
    assert.matches("attr 'axis' must be an integer", error_of(flow._call, "sum", {axis = 0.5}, a))
    assert.matches("sum: expected 1 tensor inputs, got 2", error_of(flow._call, "sum", {}, a, a))
    assert.matches("argument 4 must be a tensor", error_of(flow._call, "add", {}, a, "x"))
  end)
end)
