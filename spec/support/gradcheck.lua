-- Plain-Lua helpers for specs: error messages, nested <-> flat lists, seeded random tensors,
-- and a gradient check against central finite differences (float64).
local flow = require "flow"
local assert = require "luassert" -- busted's assert, as inside spec files

local M = {}

-- the message of the error fn(...) raises (fails the spec when it does not raise)
function M.err_of(fn, ...)
  local ok, e = pcall(fn, ...)
  assert.is_false(ok)
  return tostring(e)
end

function M.flat(v, out)
  out = out or {}
  if type(v) ~= "table" then out[#out + 1] = v; return out end
  for _, x in ipairs(v) do M.flat(x, out) end
  return out
end

-- flat (row-major) -> nested list of the given shape
function M.nest(flat, shape)
  if #shape == 0 then return flat[1] end
  local pos = 0
  local function build(d)
    local t = {}
    for i = 1, shape[d] do
      if d == #shape then pos = pos + 1; t[i] = flat[pos] else t[i] = build(d + 1) end
    end
    return t
  end
  return build(1)
end

local function numel(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return n
end
M.numel = numel

-- A deterministic generator, the same on every rank: uniform in [0, 1); values in ±[0.1, 1], away
-- from the kinks of relu/abs/clamp and from ties; positive values in [0.2, 2].
function M.generator(seed)
  local state = seed
  local function uniform()
    state = (state * 1103515245 + 12345) % 2147483648
    return state / 2147483648
  end
  local function value()
    local v = 0.1 + 0.9 * uniform()
    return uniform() < 0.5 and -v or v
  end
  return uniform, value, function() return 0.2 + 1.8 * uniform() end
end

function M.randlist(n)
  local t = {}
  for i = 1, n do t[i] = math.random() * 2 - 1 end
  return t
end

-- A tensor of uniform values in [-1, 1) from math.random (seed it with math.randomseed).
function M.randt(shape, dtype)
  return flow.tensor(M.nest(M.randlist(numel(shape)), shape), { dtype = dtype or "float64" })
end

-- Compares the gradients autograd gives for `inputs` (float64 tensors) of sum(f(inputs) * W),
-- W random, with central differences. Returns the largest absolute difference.
function M.gradcheck(f, inputs, eps)
  eps = eps or 1e-6
  local vals = {}
  for i, x in ipairs(inputs) do vals[i] = M.flat(x:totable()) end
  local function leaves(grad)
    local xs = {}
    for i, x in ipairs(inputs) do
      xs[i] = flow.tensor(M.nest(vals[i], x:shape()), { dtype = "float64" })
      if grad then xs[i]:requires_grad_(true) end
    end
    return xs
  end
  local xs = leaves(true)
  local out = f(table.unpack(xs))
  local w = M.randlist(numel(out:shape()))
  out:backward(flow.tensor(M.nest(w, out:shape()), { dtype = "float64" }))
  local function loss()
    local o = M.flat(f(table.unpack(leaves(false))):totable())
    local s = 0
    for k = 1, #o do s = s + o[k] * w[k] end
    return s
  end
  local worst = 0
  for i = 1, #inputs do
    local g = xs[i].grad and M.flat(xs[i].grad:totable()) or {}
    for k = 1, #vals[i] do
      local v = vals[i][k]
      vals[i][k] = v + eps
      local up = loss()
      vals[i][k] = v - eps
      local down = loss()
      vals[i][k] = v
      local err = math.abs((up - down) / (2 * eps) - (g[k] or 0))
      if err > worst then worst = err end
    end
  end
  return worst
end

return M
