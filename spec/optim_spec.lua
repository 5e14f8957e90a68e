local flow = require "flow"
local optim = flow.optim

local function close(a, b, tol)
  tol = tol or 1e-6
  if type(a) == "table" then
    assert.are.equal(#a, #b)
    for i = 1, #a do close(a[i], b[i], tol) end
    return
  end
  assert(math.abs(a - b) <= tol * (1 + math.abs(b)), ("%.12g vs %.12g"):format(a, b))
end

local function param(values)
  local p = flow.tensor(values, { dtype = "float64" })
  p:requires_grad_(true)
  return p
end

local function set_grad(p, values) p.grad = flow.tensor(values, { dtype = "float64" }) end

describe("optim.SGD", function()
  it("plain step: p -= lr * g", function()
    local p = param({ 1, -2 })
    local opt = optim.SGD({ p }, { lr = 0.1 })
    set_grad(p, { 0.5, 1 })
    opt:step()
    close(p:totable(), { 0.95, -2.1 })
  end)

  it("momentum and weight decay follow PyTorch's update", function()
    local p = param({ 1, 2 })
    local opt = optim.SGD({ p }, { lr = 0.1, momentum = 0.9, weight_decay = 0.01 })
    local w, buf = { 1, 2 }, nil
    for _, g in ipairs({ { 1, -1 }, { 0.5, 0.5 }, { -2, 0 } }) do
      set_grad(p, g)
      opt:step()
      for i = 1, 2 do
        local gi = g[i] + 0.01 * w[i]
        buf = buf or { 0, 0 }
        buf[i] = opt.step_count == 1 and gi or 0.9 * buf[i] + gi
        w[i] = w[i] - 0.1 * buf[i]
      end
      close(p:totable(), w)
    end
  end)

  it("nesterov uses g + momentum * buf", function()
    local p = param({ 0 })
    local opt = optim.SGD({ p }, { lr = 1, momentum = 0.5, nesterov = true })
    set_grad(p, { 1 })
    opt:step() -- buf = 1; step = 1 + 0.5*1
    close(p:totable(), { -1.5 })
    set_grad(p, { 1 })
    opt:step() -- buf = 0.5 + 1 = 1.5; step = 1 + 0.75
    close(p:totable(), { -3.25 })
    assert.has_error(function() optim.SGD({ p }, { nesterov = true }) end, "SGD: nesterov needs momentum > 0 and dampening 0")
  end)

  it("skips parameters without gradients and zero_grad clears them", function()
    local a, b = param({ 1 }), param({ 1 })
    local opt = optim.SGD({ a, b }, { lr = 1 })
    set_grad(a, { 1 })
    opt:step()
    close(a:totable(), { 0 })
    close(b:totable(), { 1 })
    opt:zero_grad()
    assert.is_nil(a.grad)
  end)
end)

-- Adam(W) by hand, one parameter element at a time.
local function adam_ref(w, grads, o, decoupled)
  local m, v = 0, 0
  for t, g in ipairs(grads) do
    if not decoupled then g = g + o.weight_decay * w end
    m = o.beta1 * m + (1 - o.beta1) * g
    v = o.beta2 * v + (1 - o.beta2) * g * g
    local mhat, vhat = m / (1 - o.beta1 ^ t), v / (1 - o.beta2 ^ t)
    if decoupled then w = w - o.lr * o.weight_decay * w end
    w = w - o.lr * mhat / (math.sqrt(vhat) + o.eps)
  end
  return w
end

describe("optim.AdamW and optim.Adam", function()
  local o = { lr = 0.01, beta1 = 0.9, beta2 = 0.99, eps = 1e-8, weight_decay = 0.1 }
  local grads = { { 0.3, -1 }, { 0.1, 2 }, { -0.5, 0.25 } }

  for _, case in ipairs({ { "AdamW", true }, { "Adam", false } }) do
    it(case[1] .. " matches the update computed by hand", function()
      local p = param({ 1, -0.5 })
      local opt = optim[case[1]]({ p }, { lr = o.lr, betas = { o.beta1, o.beta2 }, eps = o.eps, weight_decay = o.weight_decay })
      for _, g in ipairs(grads) do
        set_grad(p, g)
        opt:step()
      end
      local want = {}
      for i, w in ipairs({ 1, -0.5 }) do
        local gs = {}
        for t = 1, #grads do gs[t] = grads[t][i] end
        want[i] = adam_ref(w, gs, o, case[2])
      end
      close(p:totable(), want, 1e-9)
    end)
  end

  it("param groups override options (no decay on the second group)", function()
    local a, b = param({ 1 }), param({ 1 })
    local opt = optim.AdamW({ { params = { a } }, { params = { b }, weight_decay = 0 } }, { lr = 0.1, weight_decay = 0.5 })
    set_grad(a, { 0 })
    set_grad(b, { 0 })
    opt:step()
    close(a:totable(), { 1 - 0.1 * 0.5 })
    close(b:totable(), { 1 })
  end)

  it("state_dict / load_state_dict resume to the same trajectory", function()
    local function run(p, opt, gs) for _, g in ipairs(gs) do set_grad(p, g); opt:step() end end
    local p1 = param({ 1, 2 })
    local o1 = optim.AdamW({ p1 }, { lr = 0.1 })
    run(p1, o1, { { 1, 1 }, { -1, 2 } })
    local snap = o1:state_dict()
    assert.are.equal(2, snap.step)
    local saved = flow.tensor(p1)
    local path = os.tmpname()
    flow.save(snap, path)
    run(p1, o1, { { 0.5, -3 } })

    local p2 = param(saved:totable())
    local o2 = optim.AdamW({ p2 }, { lr = 0.1 })
    o2:load_state_dict(flow.load(path))
    os.remove(path)
    run(p2, o2, { { 0.5, -3 } })
    assert.are.same(p1:totable(), p2:totable())
    assert.has_error(function() o2:load_state_dict({}) end, "AdamW.load_state_dict: the state has no integer 'step'")
    assert.has_error(function() o2:load_state_dict({ step = 1, ["m.1"] = flow.zeros({ 3 }) }) end,
      "AdamW.load_state_dict: 'm.1' has shape {3}, parameter 1 has {2}")
  end)
end)

describe("optim.clip_grad_norm", function()
  it("returns the global norm and scales gradients down to max_norm", function()
    local a, b = param({ 0, 0 }), param({ 0 })
    set_grad(a, { 3, 0 })
    set_grad(b, { 4 })
    close(optim.clip_grad_norm({ a, b }, 1), 5)
    close(a.grad:totable(), { 0.6, 0 }, 1e-5)
    close(b.grad:totable(), { 0.8 }, 1e-5)
  end)

  it("leaves small gradients alone", function()
    local a = param({ 0, 0 })
    set_grad(a, { 0.3, 0.4 })
    close(optim.clip_grad_norm({ a }, 1), 0.5)
    close(a.grad:totable(), { 0.3, 0.4 })
  end)
end)

describe("optim.cosine_schedule", function()
  it("warms up linearly, then decays along a cosine to min_lr", function()
    local lr = optim.cosine_schedule({ lr = 1, min_lr = 0.1, warmup = 10, steps = 110 })
    close(lr(0), 0.1)
    close(lr(4), 0.5)
    close(lr(9), 1)
    close(lr(10), 1)
    close(lr(60), 0.1 + 0.5 * 0.9)
    close(lr(35), 0.1 + 0.5 * (1 + math.cos(math.pi / 4)) * 0.9)
    close(lr(110), 0.1)
    close(lr(500), 0.1)
  end)
end)
