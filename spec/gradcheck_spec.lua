-- Every differentiable op in the registry against central finite differences, in float64.
-- For inputs x and a random projection r of the outputs, L(x) = sum_j sum(out_j * r_j); the
-- gradient autograd gives for each input must match (L(x + eps e_i) - L(x - eps e_i)) / 2eps.
-- A differentiable op without an entry in `cases` fails: new ops must come with a case.
local flow = require "flow"

local EPS, RTOL, ATOL = 1e-6, 1e-6, 1e-6

local F64 = "float64"

-- Deterministic values away from the kinks of relu/abs/clamp (|v| >= 0.1) and from ties.
local uniform, value, positive = require("support.gradcheck").generator(12345)

local G = require "support.gradcheck"
local numel, nest, flatten = G.numel, G.nest, G.flat

-- ---- input makers ---------------------------------------------------------------------------
-- A case input is one of:
--   {2, 3}                          a float64 leaf of that shape with values in ±[0.1, 1]
--   leaf({2, 3}, {gen=, prep=})     the same with a value generator and/or a function applied to
--                                   the leaf before the op (a transposed view, an expand: this is
--                                   how non-contiguous inputs reach the op; the check is on the leaf)
--   fixed(tensor)                   a constant input that is not checked (ids, masks, targets)
local function leaf(shape, opts)
  opts = opts or {}
  return {shape = shape, gen = opts.gen or value, prep = opts.prep}
end
local function fixed(t) return {fixed = t} end
local function pos(shape, opts)
  opts = opts or {}
  opts.gen = positive
  return leaf(shape, opts)
end

-- A [.., a, b] input the op sees as a non-contiguous transposed view of a [.., b, a] leaf.
local function transposed(shape)
  local s = {table.unpack(shape)}
  s[#s - 1], s[#s] = s[#s], s[#s - 1]
  return leaf(s, {prep = function(t) return flow.transpose(t, -2, -1) end})
end

-- An input of `shape` that the op sees as an expand (stride 0) of a leaf of `base` shape.
local function expanded(base, shape)
  return leaf(base, {prep = function(t) return flow.expand(t, shape) end})
end

local function normalize(spec)
  if spec.fixed or spec.shape then return spec end
  return leaf(spec)
end

local function make(spec, values, requires_grad)
  return flow.tensor(nest(values, spec.shape), {dtype = F64, requires_grad = requires_grad})
end

-- ---- the check ------------------------------------------------------------------------------

local function is_float(t) return t.dtype == "float64" or t.dtype == "float32" end

-- Outputs of fn on the given leaves (after each input's prep).
local function run(fn, specs, leaves)
  local args = {}
  for i, s in ipairs(specs) do
    local x = s.fixed or leaves[i]
    if s.prep then x = s.prep(x) end
    args[i] = x
  end
  return table.pack(fn(table.unpack(args, 1, #specs)))
end

-- L = sum_j <out_j, r_j> in plain Lua (for finite differences).
local function projection(outs, r)
  local L = 0
  for j = 1, outs.n do
    if r[j] then
      local v = flatten(outs[j]:totable())
      for k = 1, #v do L = L + v[k] * r[j][k] end
    end
  end
  return L
end

-- fn(inputs...) -> outputs is the function under test; name labels the messages.
local function check_case(name, fn, case)
  local specs = {}
  for i, s in ipairs(case.inputs) do specs[i] = normalize(s) end
  local values = {}
  for i, s in ipairs(specs) do
    if not s.fixed then
      values[i] = {}
      for k = 1, numel(s.shape) do values[i][k] = s.gen() end
    end
  end

  -- analytic: backward of sum(out_j * r_j), with every leaf requiring grad or only leaf `only`
  -- (gradient rules branch on which inputs need a gradient: both paths must agree)
  local r
  local function analytic(only)
    local leaves = {}
    for i, s in ipairs(specs) do
      if not s.fixed then leaves[i] = make(s, values[i], only == nil or only == i) end
    end
    local outs = run(fn, specs, leaves)
    local first = r == nil
    r = r or {}
    local L
    for j = 1, outs.n do
      local o = outs[j]
      if is_float(o) then
        if first then
          r[j] = {}
          for k = 1, o:numel() do r[j][k] = value() end
        end
        local term = (o * flow.tensor(nest(r[j], o:shape()), {dtype = o.dtype})):sum()
        L = L and L + term or term
      end
    end
    assert(L, name .. ": the op has no floating-point output to check")
    L:backward()
    local grads = {}
    for i, s in ipairs(specs) do
      if not s.fixed and (only == nil or only == i) then
        local g = leaves[i].grad
        assert(g, ("%s: input %d received no gradient"):format(name, i))
        assert.are.same(s.shape, g:shape(), ("%s: gradient of input %d has the wrong shape"):format(name, i))
        grads[i] = flatten(g:totable())
      end
    end
    return grads
  end
  local grads = analytic(nil)
  local nleaves = 0
  for _ in pairs(grads) do nleaves = nleaves + 1 end
  if nleaves > 1 then
    for i, full in pairs(grads) do
      local alone = analytic(i)[i]
      for k = 1, #full do
        if math.abs(alone[k] - full[k]) > ATOL + RTOL * math.abs(full[k]) then
          error(("%s (%s): input %d element %d: gradient %.10g when only it requires grad, %.10g when all do")
            :format(name, case.label or "case", i, k, alone[k], full[k]), 0)
        end
      end
    end
  end

  -- numeric, one element at a time, with the other leaves held fixed
  local current = {}
  flow.no_grad(function()
    for i, s in ipairs(specs) do
      if not s.fixed then current[i] = make(s, values[i], false) end
    end
  end)
  for i, s in ipairs(specs) do
    if not s.fixed then
      local analytic = grads[i]
      local vals = values[i]
      for k = 1, #vals do
        local v0 = vals[k]
        local function at(v)
          vals[k] = v
          current[i] = make(s, vals, false)
          return flow.no_grad(function() return projection(run(fn, specs, current), r) end)
        end
        local numeric = (at(v0 + EPS) - at(v0 - EPS)) / (2 * EPS)
        vals[k] = v0
        current[i] = make(s, vals, false)
        local err = math.abs(analytic[k] - numeric)
        if err > ATOL + RTOL * math.abs(numeric) then
          error(("%s (%s): input %d element %d: autograd %.10g, finite differences %.10g (error %.3g)")
            :format(name, case.label or "case", i, k, analytic[k], numeric, err), 0)
        end
      end
    end
  end
end

-- ---- cases: op name -> list of {label=, inputs=, attrs=} ------------------------------------
-- The op runs as flow._call(name, attrs, inputs...), or as case.fn(inputs...) when given.

local cases = {}

local function binary_cases()
  return {
    {label = "same shape", inputs = {{2, 3}, {2, 3}}},
    {label = "broadcast", inputs = {{2, 1, 3}, {4, 1}}},
    {label = "0-d operand", inputs = {{2, 3}, {}}},
    {label = "expanded", inputs = {expanded({3, 1}, {3, 4}), {3, 4}}},
  }
end
cases.add = binary_cases()
cases.sub = binary_cases()
cases.mul = binary_cases()
cases.remainder = {
  {label = "broadcast, negative divisor", inputs = {{2, 1, 3}, leaf({4, 1}, {gen = function() return -1.7 * positive() end})}},
  {label = "expanded divisor", inputs = {{3, 4}, expanded({1, 4}, {3, 4})}},
}
cases.fmod = cases.remainder
cases.floor_divide = {{label = "broadcast: zero gradients", inputs = {{2, 3}, pos({3})}}}
cases.trunc_divide = cases.floor_divide
cases.div = {
  {label = "same shape", inputs = {{2, 3}, pos({2, 3})}},
  {label = "broadcast", inputs = {{2, 1, 3}, pos({4, 1})}},
  {label = "expanded denominator", inputs = {{3, 4}, expanded({1, 4}, {3, 4})}},
}

cases.sum = {
  {label = "all", inputs = {{2, 3}}},
  {label = "axis 1 keepdim", inputs = {{2, 3, 2}}, attrs = {axes = {1}, keepdim = true}},
  {label = "axes 0,2", inputs = {{2, 3, 2}}, attrs = {axes = {0, -1}}},
  {label = "expanded", inputs = {expanded({1, 3}, {2, 3})}, attrs = {axes = {0}}},
}

cases.matmul = {
  {label = "2-d", inputs = {{2, 3}, {3, 4}}},
  {label = "batched broadcast", inputs = {{2, 1, 2, 3}, {3, 3, 2}}},
  {label = "transpose_a", inputs = {{3, 2}, {3, 4}}, attrs = {transpose_a = true}},
  {label = "transpose_b", inputs = {{2, 3}, {4, 3}}, attrs = {transpose_b = true}},
  {label = "both", inputs = {{2, 3, 2}, {4, 3}}, attrs = {transpose_a = true, transpose_b = true}},
  {label = "expanded", inputs = {expanded({1, 3}, {2, 3}), {3, 2}}},
}

cases.view = {
  {label = "split an axis", inputs = {{2, 6}}, attrs = {shape = {2, 2, 3}}},
  {label = "-1", inputs = {{2, 3, 2}}, attrs = {shape = {-1, 2}}},
}
cases.expand = {
  {label = "size-1 axis", inputs = {{2, 1}}, attrs = {shape = {2, 3}}},
  {label = "new leading axes", inputs = {{3}}, attrs = {shape = {2, 2, 3}}},
}
cases.contiguous = {
  {label = "copy", inputs = {{2, 3}}},
  {label = "of an expand", inputs = {expanded({3, 1}, {3, 2})}},
}
cases.cast = {
  {label = "float64 to float64", inputs = {{2, 3}}, attrs = {dtype = F64}},
}

cases.matmul[#cases.matmul + 1] = {label = "transposed view", inputs = {transposed({2, 3}), {3, 2}}}
cases.linear = {
  {label = "x W^T + b", inputs = {{4, 3}, {2, 3}, {2}}},
  {label = "transposed x", inputs = {transposed({4, 3}), {2, 3}, {2}}},
  {label = "transposed weight, expanded bias", inputs = {{3, 4}, transposed({5, 4}), expanded({1}, {5})}},
}
cases.add[#cases.add + 1] = {label = "transposed view", inputs = {transposed({2, 3}), {2, 3}}}
cases.mul[#cases.mul + 1] = {label = "transposed view", inputs = {{3, 2}, transposed({3, 2})}}

local function int64(values) return fixed(flow.tensor(values, {dtype = "int64"})) end
local function bool(values) return fixed(flow.tensor(values, {dtype = "bool"})) end

local function unary_cases(make_leaf)
  make_leaf = make_leaf or leaf
  return {
    {label = "2-d", inputs = {make_leaf({2, 3})}},
    {label = "0-d", inputs = {make_leaf({})}},
    {label = "transposed", inputs = {make_leaf({3, 2}, {prep = function(t) return flow.transpose(t, 0, 1) end})}},
  }
end
for _, name in ipairs({"neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu", "sin", "cos",
                       "erf", "expm1", "softplus", "sign", "floor", "ceil", "round", "trunc"}) do
  cases[name] = unary_cases()
end
for _, name in ipairs({"log", "sqrt", "rsqrt", "log1p"}) do cases[name] = unary_cases(pos) end
cases.clamp = {
  {label = "min and max", inputs = {{3, 4}}, attrs = {has_min = true, scalar = -0.45, has_max = true, scalar2 = 0.55}},
  {label = "min only", inputs = {{2, 5}}, attrs = {has_min = true, scalar = 0.3}},
  {label = "max only, transposed", inputs = {transposed({3, 3})}, attrs = {has_max = true, scalar2 = -0.2}},
}
cases.pow = {
  {label = "same shape", inputs = {pos({2, 3}), {2, 3}}},
  {label = "scalar exponent", inputs = {pos({3, 2}), {}}},
  {label = "broadcast base", inputs = {pos({3, 1}), {3, 4}}},
}
cases.maximum = {
  {label = "same shape", inputs = {{3, 4}, {3, 4}}},
  {label = "broadcast", inputs = {{2, 3}, {3}}},
}
cases.minimum = cases.maximum
cases.where = {
  {label = "same shape", inputs = {bool({{true, false, true}, {false, false, true}}), {2, 3}, {2, 3}}},
  {label = "broadcast condition and operands", inputs = {bool({true, false, false}), {2, 1}, {2, 3}}},
}
cases.masked_fill = {
  {label = "same shape", inputs = {{2, 3}, bool({{true, false, true}, {false, false, true}})}, attrs = {scalar = 7}},
  {label = "broadcast mask", inputs = {{3, 3}, bool({false, true, false})}, attrs = {scalar = -1}},
}

cases.mean = {
  {label = "all", inputs = {{2, 3}}},
  {label = "axis -1 keepdim", inputs = {{2, 3, 2}}, attrs = {axes = {-1}, keepdim = true}},
  {label = "axes 0,1 of transposed", inputs = {transposed({3, 4})}, attrs = {axes = {0, 1}}},
}
cases.var = {
  {label = "all, unbiased", inputs = {{3, 4}}, attrs = {unbiased = true}},
  {label = "axis 1, biased", inputs = {{2, 5}}, attrs = {axes = {1}}},
  {label = "axes 0,2 keepdim unbiased", inputs = {{3, 2, 2}}, attrs = {axes = {0, 2}, keepdim = true, unbiased = true}},
}
cases.max = {
  {label = "everything", inputs = {{3, 4}}},
  {label = "axis 1", inputs = {{3, 4}}, attrs = {axes = {1}}},
  {label = "axis 0 keepdim, transposed", inputs = {transposed({3, 4})}, attrs = {axes = {0}, keepdim = true}},
}
cases.min = cases.max

cases.permute = {
  {label = "3-d", inputs = {{2, 3, 4}}, attrs = {axes = {2, 0, 1}}},
  {label = "negative dims", inputs = {{2, 3}}, attrs = {axes = {-1, -2}}},
}
cases.cumsum = {
  {label = "axis 1", inputs = {{2, 4}}, attrs = {axis = 1}},
  {label = "axis -3, reverse", inputs = {{3, 2, 2}}, attrs = {axis = -3, reverse = true}},
  {label = "transposed", inputs = {transposed({3, 4})}, attrs = {axis = 0}},
  {label = "0-d", inputs = {{}}, attrs = {axis = 0}},
}
cases.flip = {
  {label = "axis 0", inputs = {{3, 2}}, attrs = {axes = {0}}},
  {label = "axes -1, 0 of 3-d", inputs = {{2, 3, 2}}, attrs = {axes = {-1, 0}}},
  {label = "transposed", inputs = {transposed({3, 4})}, attrs = {axes = {1}}},
}
cases.prod = {
  {label = "all", inputs = {{2, 3}}},
  {label = "axis 1 keepdim", inputs = {{2, 3, 2}}, attrs = {axes = {1}, keepdim = true}},
  {label = "axis -1, transposed", inputs = {transposed({3, 4})}, attrs = {axes = {-1}}},
}
cases.amax = {
  {label = "all", inputs = {{2, 3}}},
  {label = "axes 0, -1 keepdim", inputs = {{2, 3, 2}}, attrs = {axes = {0, -1}, keepdim = true}},
  {label = "axis 1, transposed", inputs = {transposed({3, 4})}, attrs = {axes = {1}}},
}
cases.amin = cases.amax
cases.sort = {
  {label = "axis -1", inputs = {{3, 4}}, attrs = {axis = -1}},
  {label = "axis 0 descending, transposed", inputs = {transposed({3, 4})}, attrs = {axis = 0, descending = true}},
  {label = "0-d", inputs = {{}}, attrs = {axis = 0}},
}
cases.topk = {
  {label = "2 largest along axis 1", inputs = {{3, 4}}, attrs = {axis = 1, k = 2, descending = true}},
  {label = "3 smallest along axis 0, transposed", inputs = {transposed({4, 2})}, attrs = {axis = 0, k = 3}},
}
cases.narrow = {
  {label = "axis 0", inputs = {{4, 3}}, attrs = {axis = 0, start = 1, length = 2}},
  {label = "negative axis and start", inputs = {{2, 5}}, attrs = {axis = -1, start = -3, length = 2}},
}
cases.narrow_backward = {
  {label = "pad axis 0", inputs = {{2, 3}}, attrs = {shape = {4, 3}, axis = 0, start = 1}},
  {label = "pad axis 1", inputs = {{2, 2}}, attrs = {shape = {2, 5}, axis = 1, start = 3}},
}
cases.cat = {
  {label = "axis 0", inputs = {{2, 3}, {1, 3}}, attrs = {axis = 0}},
  {label = "three on axis -1", inputs = {{2, 1}, transposed({2, 2}), {2, 3}}, attrs = {axis = -1}},
}
cases.tril = {
  {label = "k = 0", inputs = {{3, 4}}, attrs = {k = 0}},
  {label = "k = -1, batched", inputs = {{2, 3, 3}}, attrs = {k = -1}},
}
cases.triu = {
  {label = "k = 1", inputs = {{3, 4}}, attrs = {k = 1}},
  {label = "k = 0, transposed", inputs = {transposed({3, 3})}, attrs = {k = 0}},
}

cases.softmax = {
  {label = "last axis", inputs = {{2, 5}}, attrs = {axis = -1}},
  {label = "axis 0 of 3-d", inputs = {{3, 2, 2}}, attrs = {axis = 0}},
  {label = "transposed", inputs = {transposed({3, 4})}, attrs = {axis = 1}},
}
cases.log_softmax = cases.softmax

-- layer_norm inputs: x, then weight if flag 1<<16, then bias if flag 1<<17 (ops/nn.c LN_*).
local LN_WEIGHT, LN_BIAS = 1 << 16, 1 << 17
cases.layer_norm = {
  {label = "weight and bias", inputs = {{3, 4}, {4}, {4}}, attrs = {flags = LN_WEIGHT | LN_BIAS, eps = 1e-5}},
  {label = "3-d, weight only", inputs = {{2, 2, 3}, {3}}, attrs = {flags = LN_WEIGHT, eps = 1e-5}},
  {label = "bias only, transposed x", inputs = {transposed({2, 4}), {4}}, attrs = {flags = LN_BIAS, eps = 0.1}},
  {label = "neither", inputs = {{2, 5}}, attrs = {eps = 1e-5}},
}

-- cross_entropy flags: 1<<16 sums the per-row losses, 1<<17 then takes the mean (ops/nn.c CE_*).
local CE_SUM, CE_MEAN = 1 << 16, (1 << 16) | (1 << 17)
cases.cross_entropy = {
  {label = "none", inputs = {{3, 5}, int64({1, 4, 0})}},
  {label = "sum", inputs = {{3, 5}, int64({2, 2, 3})}, attrs = {flags = CE_SUM}},
  {label = "mean, 3-d", inputs = {{2, 2, 4}, int64({{0, 3}, {1, 1}})}, attrs = {flags = CE_MEAN}},
  {label = "mean with ignore_index", inputs = {{4, 3}, int64({1, -100, 2, 0})}, attrs = {flags = CE_MEAN}},
  {label = "ignore_index 2", inputs = {{3, 3}, int64({2, 0, 1})}, attrs = {flags = CE_MEAN, ignore_index = 2}},
}

cases.scaled_dot_product_attention = {
  {label = "causal", inputs = {{1, 2, 3, 4}, {1, 2, 3, 4}, {1, 2, 3, 2}}, attrs = {causal = true, scalar = 0.5}},
  {label = "Tq != Tk", inputs = {{2, 1, 2, 3}, {2, 1, 4, 3}, {2, 1, 4, 3}}, attrs = {scalar = 0.7}},
  {label = "transposed k", inputs = {{1, 1, 3, 2}, transposed({1, 1, 3, 2}), {1, 1, 3, 2}},
   attrs = {causal = true, scalar = 1}},
}

-- conv2d: axes = {stride_h, stride_w, pad_h, pad_w, dil_h, dil_w}, k = groups, flags 1<<16: bias
-- (ops/conv.c); pools: shape = kernel, axes = {stride_h, stride_w, pad_h, pad_w}; batch_norm flags
-- 1<<16: training, scalar = momentum (running stats are fixed inputs, updated in place).
local CONV_BIAS, BN_TRAINING = 1 << 16, 1 << 16
cases.conv2d = {
  {label = "bias, stride 2, padding 1", inputs = {{2, 2, 5, 4}, {3, 2, 3, 2}, {3}},
   attrs = {axes = {2, 1, 1, 1, 1, 1}, k = 1, flags = CONV_BIAS}},
  {label = "groups 2, dilation 2, no bias", inputs = {{1, 4, 5, 5}, {4, 2, 2, 2}},
   attrs = {axes = {1, 2, 0, 1, 2, 1}, k = 2}},
  {label = "transposed input", inputs = {transposed({1, 1, 4, 3}), {2, 1, 2, 2}}, attrs = {axes = {1, 1, 0, 0, 1, 1}, k = 1}},
}
cases.max_pool2d = {
  {label = "2x2 stride 2", inputs = {{2, 2, 4, 4}}, attrs = {shape = {2, 2}, axes = {2, 2, 0, 0}}},
  {label = "3x2 stride 1 padding 1", inputs = {{1, 2, 4, 3}}, attrs = {shape = {3, 2}, axes = {1, 1, 1, 1}}},
}
cases.avg_pool2d = {
  {label = "2x2 stride 2", inputs = {{2, 2, 4, 4}}, attrs = {shape = {2, 2}, axes = {2, 2, 0, 0}}},
  {label = "3x3 stride 2 padding 1", inputs = {{1, 2, 5, 4}}, attrs = {shape = {3, 3}, axes = {2, 2, 1, 1}}},
}
local function stats(v) return fixed(flow.tensor(v, {dtype = F64})) end
cases.batch_norm = {
  {label = "training", inputs = {{3, 2, 2, 2}, {2}, {2}, stats({0, 0}), stats({1, 1})},
   attrs = {flags = BN_TRAINING, scalar = 0.1, eps = 1e-5}},
  {label = "training, 2-d", inputs = {{4, 3}, {3}, {3}, stats({0, 0, 0}), stats({1, 1, 1})},
   attrs = {flags = BN_TRAINING, scalar = 0.1, eps = 1e-3}},
  {label = "eval", inputs = {{2, 2, 3, 1}, {2}, {2}, stats({0.3, -0.2}), stats({1.5, 0.7})}, attrs = {eps = 1e-5}},
}

cases.embedding = {
  {label = "repeated ids", inputs = {int64({{0, 3, 3}, {4, 0, 1}}), {5, 3}}},
  {label = "1-d ids", inputs = {int64({2, 2}), {3, 2}}},
}
cases.gather = {
  {label = "axis 1", inputs = {{3, 4}, int64({{0, 3}, {1, 1}, {2, 0}})}, attrs = {axis = 1}},
  {label = "axis 0, smaller index", inputs = {{3, 3}, int64({{2, 0}, {2, 2}})}, attrs = {axis = 0}},
}
cases.index_select = {
  {label = "axis 0 with repeats", inputs = {{4, 3}, int64({3, 0, 3})}, attrs = {axis = 0}},
  {label = "axis -1", inputs = {{2, 3}, int64({2, 1})}, attrs = {axis = -1}},
}
cases.scatter_add = {
  {label = "axis 0 with collisions", inputs = {{3, 4}, int64({{0, 1, 2, 0}, {0, 2, 2, 1}}), {2, 4}},
   attrs = {axis = 0}},
  {label = "axis 1", inputs = {{2, 3}, int64({{2, 2}, {0, 1}}), {2, 2}}, attrs = {axis = 1}},
}

cases.dropout = {
  {label = "p = 0.5", inputs = {{4, 5}}, attrs = {scalar = 0.5, seed = 7}},
  {label = "p = 0.2 at an offset", inputs = {{3, 3}}, attrs = {scalar = 0.2, seed = 3, rng_offset = 100}},
}
cases.to_device = {
  {label = "cpu to cpu", inputs = {{2, 3}}, attrs = {device = "cpu"}},
}

-- The global ops keep their placement and SBP in a table their attrs point into, so these
-- cases go through the Lua API (fn) instead of raw attrs; on one rank every SBP is the whole tensor.
local function through_global(sbp)
  return function(x) return (x:to_global(flow.placement("cpu", {0}), sbp) * 3):to_local() end
end
cases.to_global = {
  {label = "split(0), then to_local", inputs = {{2, 3}}, fn = through_global(flow.sbp.split(0))},
  {label = "broadcast, transposed", inputs = {transposed({2, 3})}, fn = through_global(flow.sbp.broadcast)},
}
cases.to_local = {
  {label = "of a local tensor", inputs = {{2, 3}}, attrs = {k = -1}},
  {label = "of a split(1) tensor", inputs = {{2, 4}}, fn = through_global(flow.sbp.split(1))},
}

-- ---- the specs ------------------------------------------------------------------------------

-- Functions composed of ops in Lua (lua/flow/reductions.lua, the losses in lua/flow/nn.lua): their
-- gradient comes from the ops' rules; checked here as a whole.
local F = flow.nn.functional
local composed = {
  {"logsumexp", function(x) return flow.logsumexp(x, 1) end, {inputs = {{3, 4}}}},
  {"logsumexp over two axes, keepdim", function(x) return flow.logsumexp(x, {0, 2}, true) end, {inputs = {{2, 3, 2}}}},
  {"std", function(x) return flow.std(x, 0) end, {inputs = {{4, 3}}}},
  {"std biased, all", function(x) return flow.std(x, nil, false, false) end, {inputs = {{3, 2}}}},
  {"mse_loss", function(a, b) return F.mse_loss(a, b) end, {inputs = {{3, 2}, {3, 2}}}},
  {"mse_loss none", function(a, b) return F.mse_loss(a, b, {reduction = "none"}) end, {inputs = {{4}, {4}}}},
  {"nll_loss [N, C, d1] with an ignored target", function(x) return F.nll_loss(x, flow.tensor({{0, -100}, {2, 1}})) end,
   {inputs = {{2, 3, 2}}}},
  {"nll_loss sum", function(x) return F.nll_loss(x, flow.tensor({1, 0, 2}), {reduction = "sum"}) end, {inputs = {{3, 3}}}},
  {"binary_cross_entropy_with_logits", function(x, y) return F.binary_cross_entropy_with_logits(x, y) end,
   {inputs = {{5}, fixed(flow.tensor({0.0, 1.0, 0.5, 1.0, 0.0}, {dtype = F64}))}}},
  {"roll over two axes", function(x) return flow.roll(x, {1, -4}, {0, -1}) end, {inputs = {{2, 3}}}},
  {"roll flat", function(x) return flow.roll(x, 4) end, {inputs = {transposed({3, 2})}}},
  {"unbind axis 1", function(x) return table.unpack(flow.unbind(x, 1)) end, {inputs = {{2, 3}}}},
  {"repeat with a leading axis", function(x) return flow["repeat"](x, {2, 1, 3}) end, {inputs = {transposed({3, 2})}}},
  {"tile", function(x) return flow.tile(x, {2}) end, {inputs = {{2, 2}}}},
  {"masked_select broadcast", function(x) return flow.masked_select(x, flow.tensor({{true, false, true}, {false, true, true}})) end,
   {inputs = {{2, 1}}}},
  {"binary_cross_entropy on probabilities, and its target", function(x, y) return F.binary_cross_entropy(x, y) end,
   {inputs = {leaf({5}, {prep = flow.sigmoid}), leaf({5}, {prep = flow.sigmoid})}}},
  {"matmul vector . vector", function(a, b) return flow.matmul(a, b) end, {inputs = {{3}, {3}}}},
  {"matmul batched . vector", function(a, b) return flow.matmul(a, b) end, {inputs = {transposed({2, 4, 3}), {3}}}},
  {"matmul vector . matrix", function(a, b) return flow.matmul(a, b) end, {inputs = {{2}, {2, 3}}}},
  {"linear on a 1-d input", function(x, w, b) return F.linear(x, w, b) end, {inputs = {{3}, {2, 3}, {2}}}},
  {"layer_norm over two trailing axes", function(x, w, b) return F.layer_norm(x, {3, 2}, w, b) end,
   {inputs = {{2, 3, 2}, {3, 2}, {3, 2}}}},
  {"scaled_dot_product_attention on 3-d inputs", function(q, k, v) return F.scaled_dot_product_attention(q, k, v) end,
   {inputs = {{2, 3, 4}, {2, 3, 4}, {2, 3, 2}}}},
  {"scaled_dot_product_attention causal, fewer queries than keys", function(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, {causal = true}) end, {inputs = {{1, 2, 2, 3}, {1, 2, 4, 3}, {1, 2, 4, 3}}}},
  {"binary_cross_entropy_with_logits weight, sum", function(x, w)
    return F.binary_cross_entropy_with_logits(x, flow.tensor({1.0, 0.0, 0.25}, {dtype = F64}), {weight = w, reduction = "sum"})
  end, {inputs = {{3}, {3}}}},
}

describe("gradient check of compositions", function()
  for _, c in ipairs(composed) do
    c[3].label = c[1]
    it(c[1], function() check_case(c[1], c[2], c[3]) end)
  end
end)

describe("gradient check", function()
  local ops = flow._ops()
  table.sort(ops, function(a, b) return a.name < b.name end)
  for _, op in ipairs(ops) do
    if op.differentiable then
      local list = cases[op.name]
      if not list then
        it(op.name .. " has a gradient check case", function()
          error(("op '%s' is differentiable but spec/gradcheck_spec.lua has no case for it: add one")
            :format(op.name), 0)
        end)
      else
        for _, case in ipairs(list) do
          it(("%s: %s"):format(op.name, case.label), function()
            check_case(op.name, case.fn or function(...) return flow._call(op.name, case.attrs or {}, ...) end, case)
          end)
        end
      end
    end
  end

  it("no case names an op registered as non-differentiable", function()
    for _, op in ipairs(ops) do
      assert.is_true(op.differentiable or cases[op.name] == nil,
        ("case for '%s', which has no gradient rule"):format(op.name))
    end
  end)

  it("catches a wrong gradient", function()
    -- x * detach(x) has autograd gradient x where finite differences see 2x
    local wrong = function(x) return x * x:detach() end
    local ok, err = pcall(check_case, "x*detach(x)", wrong, {label = "self-test", inputs = {{3}}})
    assert.is_false(ok)
    assert.matches("x%*detach%(x%) %(self%-test%): input 1 element 1: autograd", err)
    check_case("x*x", function(x) return x * x end, {label = "self-test", inputs = {{3}}})
  end)
end)
