-- GELU (exact, torch's default) in float32 computes the normal CDF with its own vectorised erf
-- (kernels/cpu/unary.c), not libm's erff. Here: its values and gradient on every 1e-4 of
-- [-10, 10] against float64 (libm's erf), the left tail against a reference that does not cancel,
-- and the gradient against central differences.
local flow = require "flow"
local F = flow.nn.functional

-- every 1e-4 over [-10, 10] in float32, and the same values in float64
local function grid()
  local x32 = (flow.arange(-100000, 100001, { dtype = "float64" }) / 10000):float()
  return x32, x32:double()
end

-- float32 gelu and its gradient at x32, as float64 tensors
local function gelu32(x32)
  local x = x32:detach():requires_grad_(true)
  local y = F.gelu(x)
  y:sum():backward()
  return y:double(), x.grad:double()
end

-- The normal CDF in double without the cancellation of 1 + erf in the left tail: for x < 0,
-- Phi(x) = erfc(z) / 2 with z = -x / sqrt 2, erfc(z) = 1 - erf(z) from erf's Taylor series below
-- z = 2 (erfc >= 0.0047 there), else from its continued fraction
-- erfc(z) = e^-z^2 / sqrt(pi) * 1 / (z + (1/2) / (z + 1 / (z + (3/2) / (z + ...)))).
local function phi_left(x)
  local z = -x / math.sqrt(2)
  if z < 2 then
    local term, sum, n = z, z, 0
    repeat
      n = n + 1
      term = -term * z * z / n
      sum = sum + term / (2 * n + 1)
    until math.abs(term) < 1e-18
    return (1 - 2 / math.sqrt(math.pi) * sum) / 2
  end
  local k = z
  for n = 400, 1, -1 do k = z + (n / 2) / k end
  return math.exp(-z * z) / math.sqrt(math.pi) / k / 2
end

describe("gelu in float32", function()
  it("is within 1e-7 |x| + 1.2e-7 |gelu(x)| of float64 on every 1e-4 of [-10, 10]", function()
    local x32, x = grid()
    local got = gelu32(x32)
    local want = F.gelu(x)
    local err = (got - want):abs()
    -- the CDF's own error (its erf within 2e-7, Phi within 1e-7) times |x|, and the last rounding
    local excess = (err - (x:abs() * 1e-7 + want:abs() * 1.2e-7)):max():item()
    assert.is_true(excess <= 0, ("the error exceeds the bound by %.3g"):format(excess))
    assert.is_true(err:max():item() < 1.2e-6)
    -- Phi = gelu / x, where the division is well conditioned
    local far = x:abs():gt(0.01)
    local phi_err = ((got - want) / x):abs()
    assert.is_true(flow.where(far, phi_err, flow.zeros_like(phi_err)):max():item() < 1.5e-7)
  end)

  it("has the float64 gradient within 2.5e-7 on every 1e-4 of [-10, 10]", function()
    local x32, x = grid()
    local _, g = gelu32(x32)
    local xd = x:detach():requires_grad_(true)
    F.gelu(xd):sum():backward()
    assert.is_true((g - xd.grad):abs():max():item() < 2.5e-7)
  end)

  it("agrees with central differences of float64 gelu", function()
    local x32, x = grid()
    local _, g = gelu32(x32)
    local h = 1e-4 -- truncation error h^2 |gelu'''| / 6 < 1e-9
    local fd = (F.gelu(x + h) - F.gelu(x - h)) / (2 * h)
    assert.is_true((g - fd):abs():max():item() < 2.5e-7)
  end)

  it("keeps 1e-5 relative accuracy, value and gradient, in the left tail down to -10", function()
    local xs = {}
    for i = 0, 9 * 256 do xs[#xs + 1] = -10 + i / 256 end -- exact in float32
    local y, g = gelu32(flow.tensor(xs, { dtype = "float32" }))
    y, g = y:totable(), g:totable()
    local worst_y, worst_g = 0, 0
    for i, x in ipairs(xs) do
      local phi = phi_left(x)
      local want_y = x * phi
      local want_g = phi + x * math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
      worst_y = math.max(worst_y, math.abs(y[i] - want_y) / math.abs(want_y))
      worst_g = math.max(worst_g, math.abs(g[i] - want_g) / math.abs(want_g))
    end
    -- 1 + erff(x / sqrt 2) would be off by 10% at x = -5 and 0 below -5.7
    assert.is_true(worst_y < 1e-5, ("gelu: relative error %.3g"):format(worst_y))
    assert.is_true(worst_g < 1e-5, ("gradient: relative error %.3g"):format(worst_g))
  end)

  it("gives 0 at 0, x far right, -0 far left, and passes inf and nan as torch", function()
    local t = flow.tensor({ 0, 30, -30, 1 / 0, -1 / 0, 0 / 0 }, { dtype = "float32" })
    local v = F.gelu(t):totable()
    assert.are.equal(0, v[1])
    assert.are.equal(30, v[2])
    assert.are.equal(0, v[3])
    assert.are.equal(1 / 0, v[4])
    assert.is_true(v[6] ~= v[6])
  end)
end)

-- GELU's tanh form (GPT-2's) in float32: x / (1 + e^-2u), u = sqrt(2/pi) (x + 0.044715 x^3), with
-- an exp whose exponent is clamped rather than its argument (kernels/cpu/unary.c), so the limits
-- beyond |2u| = 87 are selected after the division
describe("gelu tanh in float32", function()
  local function tanh32(x32)
    local x = x32:detach():requires_grad_(true)
    local y = F.gelu(x, { approximate = "tanh" })
    y:sum():backward()
    return y:double(), x.grad:double()
  end

  it("is within 1e-7 |x| + 1.2e-7 |gelu(x)| of float64, gradient within 2.5e-7, on every 1e-4 of [-10, 10]", function()
    local x32, x = grid()
    local y, g = tanh32(x32)
    local xd = x:detach():requires_grad_(true)
    local want = F.gelu(xd, { approximate = "tanh" })
    want:sum():backward()
    local excess = ((y - want):abs() - (x:abs() * 1e-7 + want:abs() * 1.2e-7)):max():item()
    assert.is_true(excess <= 0, ("the error exceeds the bound by %.3g"):format(excess))
    assert.is_true((g - xd.grad):abs():max():item() < 2.5e-7)
  end)

  it("gives torch's values and gradients far out and at inf and nan", function()
    -- torch 1.13: gelu -0 -0 -0 10.3 100 inf nan nan; gradient 0 0 0 1 1 nan nan nan
    local y, g = tanh32(flow.tensor({ -200, -100, -10.3, 10.3, 100, 1 / 0, -1 / 0, 0 / 0 }, { dtype = "float32" }))
    y, g = y:totable(), g:totable()
    for i, want in ipairs({ 0, 0, 0, flow.tensor(10.3, { dtype = "float32" }):item(), 100, 1 / 0 }) do
      assert.are.equal(want, y[i], "gelu at point " .. i)
    end
    for i, want in ipairs({ 0, 0, 0, 1, 1 }) do assert.are.equal(want, g[i], "gradient at point " .. i) end
    assert.is_true(y[7] ~= y[7] and y[8] ~= y[8], "gelu(-inf) and gelu(nan) are nan")
    assert.is_true(g[6] ~= g[6] and g[7] ~= g[7] and g[8] ~= g[8], "the gradient at inf, -inf and nan is nan")
  end)
end)
