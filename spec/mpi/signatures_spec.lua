-- Every op in the registry under every 1-D signature sbp/signature.c gives it (flow._signatures) on
-- a placement of all ranks: inputs built with exactly that signature's input SBP, the global result
-- (boxed to broadcast) and the gradients of sum(out * r) equal the 1-rank ones (float32, 1e-5).
-- An op without a rule runs its fallback (inputs boxed to broadcast), also from split inputs.
-- A registered op without a case here fails: new ops must come with a case.
local flow = require "flow"
local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
local ws = flow.world_size()
flow.set_check_consistency(true)

local ranks = {}
for i = 0, ws - 1 do ranks[#ranks + 1] = i end
local P = flow.placement("cpu", ranks)

local TOL = 1e-5

-- ---- deterministic data (the same on every rank) ---------------------------------------------
local uniform, value, positive = require("support.gradcheck").generator(4321)
local function nest(shape, gen)
  if #shape == 0 then return gen() end
  local function build(d)
    local t = {}
    for i = 1, shape[d] do t[i] = d == #shape and gen() or build(d + 1) end
    return t
  end
  return build(1)
end
local function rand(shape, gen) return flow.tensor(nest(shape, gen or value), {dtype = "float32"}) end

-- case inputs: a shape list (float32 in ±[0.1, 1]), pos(shape), or a ready tensor (ids, masks)
local function pos(shape) return {shape = shape, gen = positive} end
local function int64(v) return flow.tensor(v, {dtype = "int64"}) end
local function bool(v) return flow.tensor(v, {dtype = "bool"}) end
local function materialize(spec)
  if type(spec) == "userdata" then return spec end
  if spec.shape then return rand(spec.shape, spec.gen) end
  return rand(spec)
end

local function flat(t, out)
  out = out or {}
  if type(t) ~= "table" then out[#out + 1] = t return out end
  for _, v in ipairs(t) do flat(v, out) end
  return out
end
local function num(v) if type(v) == "boolean" then return v and 1 or 0 end return v end
local function assert_close(what, expected, actual)
  local e, a = flat(expected:totable()), flat(actual:totable())
  if #e ~= #a then error(("%s: %d elements expected, got %d"):format(what, #e, #a), 0) end
  for i = 1, #e do
    local x, y = num(e[i]), num(a[i])
    if math.abs(x - y) > TOL * (1 + math.abs(x)) then
      error(("%s: element %d: 1-rank %.9g, global %.9g"):format(what, i, x, y), 0)
    end
  end
end

local function global(full, sbp) return full:to_global(P, B):to_global(P, sbp) end
local function whole(g) return g:to_global(P, B):to_local() end
local function copy(t) return flow.tensor(t:totable(), {dtype = t.dtype}) end
local function is_float(t) return t.dtype == "float32" or t.dtype == "float64" end

-- ---- cases: op name -> list of {label=, inputs=, attrs=, fn=} ---------------------------------
-- The op runs as flow._call(name, attrs, inputs...), or case.fn(inputs...). Shapes are chosen so
-- split axes are uneven at 2 and 4 ranks as well as even.
local cases = {}
local function one(inputs, attrs, label) return {{label = label or "case", inputs = inputs, attrs = attrs}} end

for _, n in ipairs({"add", "sub", "mul", "maximum", "minimum"}) do
  cases[n] = {{label = "broadcast", inputs = {{5, 1, 4}, {3, 1}}}, {label = "same shape", inputs = {{4, 3}, {4, 3}}}}
end
cases.div = {{label = "broadcast", inputs = {{5, 4}, pos({4})}}}
cases.pow = one({pos({4, 3}), {4, 3}})
for _, n in ipairs({"remainder", "fmod", "floor_divide", "trunc_divide"}) do
  cases[n] = {{label = "broadcast", inputs = {{5, 1, 4}, pos({3, 1})}}}
end
for _, n in ipairs({"eq", "ne", "lt", "le", "gt", "ge"}) do
  cases[n] = one({{4, 3}, {3}}, nil, "broadcast")
end
for _, n in ipairs({"neg", "abs", "exp", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "contiguous", "silu",
                    "sin", "cos", "erf", "expm1", "softplus", "sign", "floor", "ceil", "round", "trunc"}) do
  cases[n] = one({{5, 3}})
end
for _, n in ipairs({"log", "sqrt", "rsqrt", "log1p"}) do cases[n] = one({pos({5, 3})}) end
cases.clamp = one({{4, 5}}, {has_min = true, scalar = -0.4, has_max = true, scalar2 = 0.5})
cases.cast = one({{4, 3}}, {dtype = "float32"})
cases.to_device = one({{4, 3}}, {device = "cpu"})
cases.dropout = one({{6, 5}}, {scalar = 0.5, seed = 7})
-- unary gradients: (dy, x or y); positive so log/sqrt/rsqrt are defined
for _, n in ipairs({"relu", "gelu", "tanh", "sigmoid", "abs", "exp", "log", "sqrt", "rsqrt", "gelu_tanh", "silu",
                    "sin", "cos", "erf", "log1p", "expm1", "softplus"}) do
  cases[n .. "_grad"] = one({{4, 3}, pos({4, 3})})
end
cases.clamp_grad = one({{4, 3}, {4, 3}}, {has_min = true, scalar = -0.4, has_max = true, scalar2 = 0.5})
cases.where = one({bool({{true, false, true}, {false, false, true}, {true, true, false}, {false, true, true}}),
  {4, 1}, {4, 3}})
cases.masked_fill = one({{4, 3}, bool({false, true, false})}, {scalar = -1})
-- in place: the written tensor keeps its SBP
cases.add_ = one({{5, 3}, {5, 3}})
cases.mul_ = one({{5, 3}, {5, 3}})
cases.copy_ = one({{5, 3}, {5, 3}})
cases.zero_ = one({{5, 3}})
cases.fill_ = one({{5, 3}}, {scalar = 2.5})
cases.adamw_ = {{label = "step 1", inputs = {{5, 3}, {5, 3}, {5, 3}, pos({5, 3})}, attrs = {k = 1},
  fn = function(p, g, m, v) return flow.adamw_(p, g, m, v, {lr = 0.1, step = 1}) end}}

cases.sum = {{label = "all", inputs = {{5, 3}}}, {label = "axis 1 keepdim", inputs = {{3, 5, 2}}, attrs = {axes = {1}, keepdim = true}}}
cases.mean = one({{3, 5, 2}}, {axes = {0, 2}})
cases.var = one({{5, 3}}, {axes = {0}, unbiased = true})
cases.max = {{label = "axis 1", inputs = {{5, 3}}, attrs = {axes = {1}}}, {label = "all", inputs = {{5, 3}}}}
cases.min = one({{3, 5}}, {axes = {0}, keepdim = true})
cases.argmax = one({{5, 3}}, {axes = {1}})
cases.argmin = one({{3, 5}}, {axes = {0}})
cases.argreduce_backward = one({{5}, int64({2, 0, 1, 1, 0})}, {shape = {5, 3}, axes = {1}})

cases.matmul = {
  {label = "2-d", inputs = {{5, 3}, {3, 6}}},
  {label = "transposes", inputs = {{3, 5}, {6, 3}}, attrs = {transpose_a = true, transpose_b = true}},
  {label = "batched broadcast", inputs = {{2, 1, 3, 4}, {3, 4, 2}}},
}
cases.linear = one({{5, 3}, {4, 3}, {4}})

cases.softmax = {{label = "last axis", inputs = {{4, 5}}, attrs = {axis = -1}}, {label = "axis 0", inputs = {{3, 4, 2}}, attrs = {axis = 0}}}
cases.log_softmax = one({{4, 5}}, {axis = 1})
cases.softmax_grad = one({{4, 5}, {4, 5}}, {axis = -1})
cases.log_softmax_grad = one({{4, 5}, {4, 5}}, {axis = 0})
local LN_WEIGHT, LN_BIAS = 1 << 16, 1 << 17
cases.layer_norm = {
  {label = "weight and bias", inputs = {{5, 4}, {4}, {4}}, attrs = {flags = LN_WEIGHT | LN_BIAS, eps = 1e-5}},
  {label = "3-d, none", inputs = {{3, 2, 4}}, attrs = {eps = 1e-5}},
}
-- dy, dmean, drstd, x, mean, rstd, weight (mean/rstd from the forward, so the math is the real one)
do
  local x, w = rand({5, 4}), rand({4})
  local _, mean, rstd = flow._call("layer_norm", {flags = LN_WEIGHT, eps = 1e-5}, x, w)
  cases.layer_norm_grad = one({{5, 4}, {5}, {5}, x, mean, rstd, w}, {flags = LN_WEIGHT, eps = 1e-5})
end
local CE_SUM, CE_MEAN = 1 << 16, (1 << 16) | (1 << 17)
cases.cross_entropy = {
  {label = "none", inputs = {{5, 4}, int64({1, 3, 0, 2, 2})}},
  {label = "sum", inputs = {{5, 4}, int64({2, 2, 3, 0, 1})}, attrs = {flags = CE_SUM}},
  {label = "mean, 3-d", inputs = {{3, 2, 4}, int64({{0, 3}, {1, 1}, {2, -100}})}, attrs = {flags = CE_MEAN}},
}
do
  local logits, target = rand({5, 4}), int64({1, 3, 0, 2, 2})
  local _, lse = flow._call("cross_entropy", {}, logits, target)
  cases.cross_entropy_grad = one({logits, target, lse, {5}, {5}})
end
cases.scaled_dot_product_attention = one({{3, 2, 3, 4}, {3, 2, 3, 4}, {3, 2, 3, 2}}, {causal = true, scalar = 0.5})
do
  local q, k, v = rand({3, 2, 3, 4}), rand({3, 2, 3, 4}), rand({3, 2, 3, 2})
  local o, lse = flow._call("scaled_dot_product_attention", {causal = true, scalar = 0.5}, q, k, v)
  cases.scaled_dot_product_attention_grad = one({q, k, v, o, lse, {3, 2, 3, 2}, {3, 2, 3}}, {causal = true, scalar = 0.5})
end

cases.view = {{label = "split an axis", inputs = {{4, 6}}, attrs = {shape = {4, 2, 3}}},
  {label = "merge", inputs = {{4, 3, 2}}, attrs = {shape = {12, 2}}}}
cases.expand = one({{5, 1}}, {shape = {2, 5, 3}})
cases.permute = one({{5, 3, 2}}, {axes = {2, 0, 1}})
cases.cumsum = one({{5, 3, 4}}, {axis = 1})
cases.flip = one({{5, 3, 4}}, {axes = {1}})
cases.prod = {{label = "all", inputs = {{5, 3}}}, {label = "axis 1 keepdim", inputs = {{3, 5, 2}}, attrs = {axes = {1}, keepdim = true}}}
cases.amax = {{label = "axes 0, -1", inputs = {{5, 3, 4}}, attrs = {axes = {0, -1}}},
              {label = "all keepdim", inputs = {{5, 3}}, attrs = {keepdim = true}}}
cases.amin = cases.amax
cases.sort = one({{5, 3, 4}}, {axis = 1})
cases.topk = one({{5, 3, 4}}, {axis = -1, k = 2, descending = true})
cases.narrow = one({{5, 3}}, {axis = 0, start = 1, length = 3})
cases.narrow_backward = one({{3, 5}}, {shape = {6, 5}, axis = 0, start = 2})
cases.cat = one({{5, 2}, {5, 3}}, {axis = 1})
cases.tril = one({{3, 4, 5}}, {k = 0})
cases.triu = one({{3, 4, 5}}, {k = 1})

cases.embedding = one({int64({{0, 3, 3}, {4, 0, 1}, {2, 2, 4}}), {5, 3}})
cases.index_select = one({{5, 3}, int64({3, 0, 3, 4})}, {axis = 0})
cases.gather = one({{5, 4}, int64({{0, 3}, {1, 1}, {2, 0}, {3, 3}, {0, 2}})}, {axis = 1})
cases.scatter_add = one({{3, 4}, int64({{0, 1, 2, 0}, {0, 2, 2, 1}, {1, 1, 0, 2}}), {3, 4}}, {axis = 0})

-- conv2d: axes = {stride_h, stride_w, pad_h, pad_w, dil_h, dil_w}, k = groups, flags 1<<16: bias;
-- pools: shape = kernel, axes = {stride_h, stride_w, pad_h, pad_w}; batch_norm flags 1<<16:
-- training, scalar = momentum (ops/conv.c). The backward ops take dy of the forward's shape.
local CONV_BIAS, BN_TRAINING = 1 << 16, 1 << 16
local conv_attrs = {axes = {2, 1, 1, 1, 1, 1}, k = 1, flags = CONV_BIAS}
cases.conv2d = one({{3, 2, 5, 4}, {3, 2, 3, 2}, {3}}, conv_attrs)
do
  local x, w = rand({3, 2, 5, 4}), rand({3, 2, 3, 2})
  local y = flow._call("conv2d", {axes = {2, 1, 1, 1, 1, 1}, k = 1}, x, w)
  cases.conv2d_grad = one({y:shape(), x, w}, {axes = {2, 1, 1, 1, 1, 1}, k = 1})
end
local pool_attrs = {shape = {2, 2}, axes = {2, 2, 0, 0}}
cases.max_pool2d = one({{3, 2, 4, 4}}, pool_attrs)
cases.avg_pool2d = one({{3, 2, 5, 4}}, {shape = {3, 3}, axes = {2, 2, 1, 1}})
cases.max_pool2d_grad = one({{3, 2, 2, 2}, {3, 2, 4, 4}}, pool_attrs)
cases.avg_pool2d_grad = one({{3, 2, 2, 2}, {3, 2, 4, 4}}, pool_attrs)
local function stats(v) return flow.tensor(v, {dtype = "float32"}) end
cases.batch_norm = {
  {label = "training", inputs = {{3, 2, 2, 2}, {2}, {2}, stats({0, 0}), stats({1, 1})},
   attrs = {flags = BN_TRAINING, scalar = 0.1, eps = 1e-5}},
  {label = "eval", inputs = {{3, 2, 3, 1}, {2}, {2}, stats({0.3, -0.2}), stats({1.5, 0.7})}, attrs = {eps = 1e-5}},
}
cases.batch_norm_grad = one({{3, 2, 2, 2}, {3, 2, 2, 2}, {2}, stats({0.3, -0.2}), stats({1.5, 0.7})},
  {flags = BN_TRAINING, eps = 1e-5})

-- more attrs per rule: negative axes, keepdim, other axes, 1-d operands, uneven views
local function more(name, case) table.insert(cases[name], case) end
more("sum", {label = "axis -1 of 3-d", inputs = {{3, 4, 5}}, attrs = {axes = {-1}}})
more("max", {label = "axis 0 keepdim", inputs = {{5, 3}}, attrs = {axes = {0}, keepdim = true}})
more("argmax", {label = "axis 0 keepdim", inputs = {{5, 3}}, attrs = {axes = {0}, keepdim = true}})
more("view", {label = "merge inner axes", inputs = {{3, 4, 2}}, attrs = {shape = {3, 8}}})
more("view", {label = "rows regrouped", inputs = {{4, 6}}, attrs = {shape = {2, 12}}})
more("view", {label = "flat to 2-d", inputs = {{8}}, attrs = {shape = {2, 4}}})
more("permute", {label = "negative dims", inputs = {{4, 5}}, attrs = {axes = {-1, -2}}})
more("cumsum", {label = "axis -1, reverse", inputs = {{4, 5}}, attrs = {axis = -1, reverse = true}})
more("flip", {label = "axes 0 and -1", inputs = {{4, 5, 3}}, attrs = {axes = {0, -1}}})
more("prod", {label = "axis -1 of 3-d", inputs = {{3, 4, 5}}, attrs = {axes = {-1}}})
more("sort", {label = "axis 0, descending", inputs = {{4, 5}}, attrs = {axis = 0, descending = true}})
more("topk", {label = "smallest along axis 0", inputs = {{5, 4}}, attrs = {axis = 0, k = 3}})
more("narrow", {label = "axis -1, negative start", inputs = {{4, 5}}, attrs = {axis = -1, start = -3, length = 2}})
more("cat", {label = "axis 0, three", inputs = {{2, 3}, {1, 3}, {4, 3}}, attrs = {axis = 0}})
more("tril", {label = "2-d, k = -1", inputs = {{4, 5}}, attrs = {k = -1}})
more("softmax_grad", {label = "axis 0", inputs = {{4, 5}, {4, 5}}, attrs = {axis = 0}})
more("layer_norm", {label = "3-d, weight only", inputs = {{2, 3, 4}, {4}}, attrs = {flags = LN_WEIGHT, eps = 1e-5}})
more("cross_entropy", {label = "sum with ignore_index 2, 3-d", inputs = {{3, 2, 4}, int64({{2, 3}, {1, 2}, {0, 0}})},
  attrs = {flags = CE_SUM, ignore_index = 2}})
more("embedding", {label = "1-d ids", inputs = {int64({2, 2, 0, 1, 2}), {3, 4}}})
more("index_select", {label = "axis 1", inputs = {{4, 5}, int64({4, 0, 2})}, attrs = {axis = 1}})
more("gather", {label = "axis 0", inputs = {{4, 3}, int64({{3, 0, 1}, {2, 2, 0}})}, attrs = {axis = 0}})
more("scatter_add", {label = "axis 1", inputs = {{4, 3}, int64({{2, 2}, {0, 1}, {1, 1}, {0, 0}}), {4, 2}}, attrs = {axis = 1}})
more("where", {label = "broadcast condition", inputs = {bool({true, false, false}), {5, 1}, {5, 3}}})
more("expand", {label = "new leading axes", inputs = {{3}}, attrs = {shape = {2, 5, 3}}})

-- Ops that do not run on global inputs by design: sources take a placement (the creation specs
-- below), and the boxing ops are the conversions themselves (boxing_spec.lua).
local by_design = {to_global = "boxing op", to_local = "boxing op"}

-- ---- the check ----------------------------------------------------------------------------------

local function sbp_str(list)
  local s = {}
  for i, v in ipairs(list) do s[i] = tostring(v) end
  return table.concat(s, ",")
end

-- The 1-rank reference: outputs, the projections r (float outputs), gradients of sum(out * r).
local function reference(name, case, ins, grads_on)
  local call = case.fn or function(...) return flow._call(name, case.attrs or {}, ...) end
  local leaves = {}
  for i, t in ipairs(ins) do
    leaves[i] = copy(t)
    if grads_on and is_float(t) then leaves[i]:requires_grad_(true) end
  end
  local outs = table.pack(call(table.unpack(leaves, 1, #ins)))
  local r, loss = {}, nil
  for j = 1, outs.n do
    if is_float(outs[j]) then
      r[j] = rand(outs[j]:shape())
      if grads_on and outs[j].requires_grad then
        local term = (outs[j] * r[j]):sum()
        loss = loss and loss + term or term
      end
    end
  end
  if loss then loss:backward() end
  local grads = {}
  for i, l in ipairs(leaves) do grads[i] = l.grad end
  return call, outs, r, grads
end

-- outs_ok: the output SBPs (as "a,b") the signatures taking these inputs give; the result must have one
local function check(name, call, ins, in_sbp, ref_outs, r, ref_grads, grads_on, outs_ok)
  local gins = {}
  for i, t in ipairs(ins) do
    gins[i] = global(copy(t), in_sbp[i])
    if grads_on and is_float(t) then gins[i] = gins[i]:detach():requires_grad_(true) end
  end
  local outs = table.pack(call(table.unpack(gins, 1, #ins)))
  assert.equal(ref_outs.n, outs.n)
  if outs_ok then
    local got = {}
    for j = 1, outs.n do got[j] = tostring(outs[j].sbp) end
    got = table.concat(got, ",")
    if not outs_ok[got] then
      local want = {}
      for k in pairs(outs_ok) do want[#want + 1] = k end
      table.sort(want)
      error(("%s: outputs %s, the signatures for these inputs give %s"):format(name, got, table.concat(want, " or ")), 0)
    end
  end
  local loss
  for j = 1, outs.n do
    assert_close(("%s output %d"):format(name, j), ref_outs[j], whole(outs[j]))
    if grads_on and r[j] and outs[j].requires_grad then
      local term = (outs[j] * global(r[j], B)):sum()
      loss = loss and loss + term or term
    end
  end
  if loss then loss:backward() end
  for i, g in pairs(ref_grads) do
    if not gins[i].grad then error(("%s: input %d has no gradient"):format(name, i), 0) end
    assert_close(("%s gradient of input %d"):format(name, i), g, whole(gins[i].grad))
  end
end

describe("every op under every signature", function()
  local ops = flow._ops()
  table.sort(ops, function(a, b) return a.name < b.name end)
  for _, op in ipairs(ops) do
    local list = cases[op.name]
    if op.kind == "source" or by_design[op.name] then
      -- not run on global inputs (see by_design and the creation specs)
    elseif not list then
      it(op.name .. " has a signature case", function()
        error(("op '%s' has no case in spec/mpi/signatures_spec.lua: add one"):format(op.name), 0)
      end)
    else
      for _, case in ipairs(list) do
        local ins = {}
        for i, spec in ipairs(case.inputs) do ins[i] = materialize(spec) end
        local grads_on = op.differentiable and op.kind ~= "inplace"
        local ok, call, ref_outs, r, ref_grads = pcall(reference, op.name, case, ins, grads_on)
        local sigs, ruled, err = {}, true, call
        if ok then
          ok, sigs, ruled = pcall(flow._signatures, op.name, case.attrs or {}, table.unpack(ins))
          err = sigs
        end
        if not ok then
          it(("%s (%s): the case runs"):format(op.name, case.label), function()
            error(("%s (%s): the case does not run on 1 rank: %s"):format(op.name, case.label, tostring(err)), 0)
          end)
          sigs, ruled = {}, true
        end
        local runs, outs_ok = {}, {}
        for _, sig in ipairs(sigs) do
          local key = sbp_str(sig["in"])
          outs_ok[key] = outs_ok[key] or {}
          outs_ok[key][sbp_str(sig.out)] = true
        end
        for _, sig in ipairs(sigs) do
          runs[#runs + 1] = {label = sbp_str(sig["in"]) .. " -> " .. sbp_str(sig.out), sbp = sig["in"],
            outs_ok = outs_ok[sbp_str(sig["in"])]}
        end
        if not ruled then -- the fallback boxes split inputs to broadcast
          local split = {}
          for i, t in ipairs(ins) do split[i] = #t:shape() > 0 and S(0) or B end
          local all_b = {}
          for j = 1, ref_outs.n do all_b[j] = "B" end
          runs[#runs + 1] = {label = "no rule: from " .. sbp_str(split), sbp = split,
            outs_ok = {[table.concat(all_b, ",")] = true}}
        end
        for _, run in ipairs(runs) do
          it(("%s (%s): %s"):format(op.name, case.label, run.label), function()
            check(op.name, call, ins, run.sbp, ref_outs, r, ref_grads, grads_on, run.outs_ok)
          end)
        end
      end
    end
  end

  it("catches a result computed on the local shard only", function()
    if ws == 1 then return end -- one rank: the shard is the whole tensor
    local x = rand({4, 3})
    local shard_only = function(t) return t:to_local():to_global(P, B) end
    assert.has_error(function() check("shard_only", shard_only, {x}, {S(0)}, table.pack(x), {}, {}, false) end)
  end)

  it("enumerates the rule's signatures", function()
    local sigs, ruled = flow._signatures("matmul", {}, rand({4, 3}), rand({3, 2}))
    assert.is_true(ruled)
    assert.equal("B,B -> B", sbp_str(sigs[1]["in"]) .. " -> " .. sbp_str(sigs[1].out))
    local seen = {}
    for _, s in ipairs(sigs) do seen[sbp_str(s["in"]) .. " -> " .. sbp_str(s.out)] = true end
    assert.is_true(seen["S(0),B -> S(0)"] and seen["B,S(1) -> S(1)"] and seen["S(1),S(0) -> P"] and seen["P,B -> P"])
    local _, g_ruled = flow._signatures("gather", {axis = 0}, rand({3, 2}), int64({{0, 1}}))
    assert.is_false(g_ruled)
    assert.has_error(function() flow._signatures("nope", {}) end, "_signatures: no op named 'nope'")
  end)
end)

describe("random and range sources with each SBP", function()
  for _, sbp in ipairs({S(0), S(1), B}) do
    for _, name in ipairs({"rand", "randn"}) do
      it(("%s with %s equals the 1-rank draw"):format(name, tostring(sbp)), function()
        flow.manual_seed(99)
        local ref = flow[name]({5, 3})
        flow.manual_seed(99)
        local g = flow[name]({5, 3}, {placement = P, sbp = sbp})
        assert.equal(tostring(sbp), tostring(g.sbp))
        assert_close(name, ref, whole(g))
      end)
    end
  end
  it("arange with S(0) and B", function()
    for _, sbp in ipairs({S(0), B}) do
      assert_close("arange", flow.arange(0, 7), whole(flow.arange(0, 7, 1, {placement = P, sbp = sbp})))
    end
  end)
end)
