-- flow against PyTorch, op by op: values, dtypes and the gradient of sum(out) for the cases in
-- spec/reference/conformance_ref.py (same names), in float64 and float32, with NaN/inf,
-- broadcasting, a transposed input, 0-d and size-0 tensors, a negative axis with keepdim, and the
-- type promotion and division rules; where torch raises, flow must raise an error naming the op.
local flow = require "flow"
local F = flow.nn.functional

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local SCRIPT = here .. "reference/conformance_ref.py"
local nan, inf = 0 / 0, math.huge
local X = {-1.5, -0.5, 0.0, 0.25, 0.5, 2.5, nan, inf, -inf}

local function find_python()
  local seen = {}
  for _, py in ipairs({os.getenv("FLOW_PYTHON") or "python3", "python3", "/usr/bin/python3"}) do
    -- each candidate once: a probe starts python (through a pyenv shim, 0.3 s)
    if not seen[py] then
      seen[py] = true
      local probe = " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)'"
      if os.execute(py .. probe .. " >/dev/null 2>&1") then return py end
    end
  end
end

local leaves = {}
local function t(v, dt, grad)
  local x = flow.tensor(v, {dtype = dt, requires_grad = grad})
  if grad then leaves[#leaves + 1] = x end
  return x
end

local unary = {relu = flow.relu, gelu = F.gelu, silu = F.silu, sin = flow.sin, cos = flow.cos, erf = flow.erf,
  expm1 = flow.expm1, softplus = F.softplus, sign = flow.sign, floor = flow.floor, ceil = flow.ceil,
  round = flow.round, trunc = flow.trunc, sigmoid = flow.sigmoid, tanh = flow.tanh, exp = flow.exp, abs = flow.abs}
local cases, order = {}, {}
local function case(name, fn, grad) cases[name] = {fn = fn, grad = grad}; order[#order + 1] = name end
local function raises(name, op, fn) cases[name] = {fn = fn, raises = op}; order[#order + 1] = name end
for _, dt in ipairs({"float64", "float32", "bfloat16"}) do
  local names = {}
  for n in pairs(unary) do names[#names + 1] = n end
  table.sort(names)
  for _, n in ipairs(names) do case(n .. " " .. dt, function() return unary[n](t(X, dt, true)) end, true) end
  case("gelu tanh " .. dt, function() return F.gelu(t(X, dt, true), {approximate = "tanh"}) end, true)
  case("log1p " .. dt, function() return flow.log1p(t({0.0, 0.5, 3.0, -0.5, inf}, dt, true)) end, true)
  case("clamp min>max " .. dt, function() return flow.clamp(t(X, dt, true), 3, 2) end, true)
  case("max ties " .. dt, function() return flow.max(t({{1.0, 5.0}, {5.0, 2.0}}, dt, true)) end, true)
  case("min nan " .. dt, function() return flow.min(t({1.0, nan, 0.0, nan}, dt, true)) end, true)
  case("maximum nan/tie " .. dt, function() return flow.maximum(t({1.0, nan, 3.0, 2.0}, dt, true), t({2.0, 2.0, nan, 2.0}, dt)) end, true)
  case("minimum broadcast " .. dt, function() return flow.minimum(t({{1.0}, {4.0}}, dt, true), t({2.0, 2.0, 5.0}, dt)) end, true)
  case("max axis -1 keepdim " .. dt, function() return (flow.max(t({{1.0, 5.0, 5.0}, {nan, 2.0, 3.0}}, dt, true), -1, true)) end, true)
  case("relu transposed " .. dt, function() return flow.relu(t({{1.0, -2.0, nan}, {-0.5, 3.0, 0.0}}, dt, true):transpose(0, 1)) end, true)
  case("sin 0-d " .. dt, function() return flow.sin(t(0.7, dt, true)) end, true)
  case("erf size-0 " .. dt, function() return flow.erf(flow.zeros({0}, {dtype = dt, requires_grad = true})) end, false)
  -- cross_entropy on N-D logits: the class axis is 1 ([N, C, d1, ...] with target [N, d1, ...])
  local L3 = {{{1.0, -2.0}, {0.5, 3.0}, {-1.5, 0.25}}, {{2.0, 0.0}, {-0.5, 1.5}, {4.0, -3.0}}}
  local T3 = {{0, -100}, {2, 1}}
  case("cross_entropy [N,C,d1] mean " .. dt, function() return F.cross_entropy(t(L3, dt, true), flow.tensor(T3)) end, true)
  case("cross_entropy [N,C,d1] none " .. dt, function()
    return F.cross_entropy(t(L3, dt, true), flow.tensor(T3), {reduction = "none"}) end, true)
  case("cross_entropy [N,C,d1,d2] sum ignore_index 1 " .. dt, function()
    return F.cross_entropy(t({L3[1], L3[2], L3[1]}, dt, true):view({1, 3, 3, 2}), flow.tensor({{{1, 0}, {2, 1}, {0, 2}}}),
      {ignore_index = 1, reduction = "sum"}) end, true)
  case("logsumexp axis 1 " .. dt, function() return flow.logsumexp(t({{1.0, -2.0, 3.0}, {0.5, -inf, 0.25}}, dt, true), 1) end, true)
  case("logsumexp all keepdim " .. dt, function() return flow.logsumexp(t(L3, dt, true), {0, 1, 2}, true) end, true)
  case("std axis 0 " .. dt, function() return flow.std(t(L3, dt, true), 0) end, true)
  case("std biased " .. dt, function() return flow.std(t(L3, dt, true), {1, 2}, true, false) end, true)
  case("mse_loss " .. dt, function() return F.mse_loss(t(L3, dt, true), t(L3, dt) * 0.5) end, true)
  case("mse_loss none " .. dt, function() return F.mse_loss(t({1.0, -2.0, 3.0}, dt, true), t({0.5, 0.0, 3.0}, dt), {reduction = "none"}) end, true)
  case("nll_loss [N,C,d1] " .. dt, function() return F.nll_loss(t(L3, dt, true), flow.tensor(T3)) end, true)
  case("nll_loss sum ignore_index 2 " .. dt, function()
    return F.nll_loss(t({{1.0, -2.0, 0.5}, {3.0, -1.5, 0.25}}, dt, true), flow.tensor({2, 0}), {ignore_index = 2, reduction = "sum"}) end, true)
  case("bce_with_logits " .. dt, function()
    return F.binary_cross_entropy_with_logits(t({-30.0, -1.5, 0.0, 0.5, 2.5, 40.0}, dt, true), t({0.0, 1.0, 0.5, 1.0, 0.0, 1.0}, dt)) end, true)
  case("bce_with_logits weight none " .. dt, function()
    return F.binary_cross_entropy_with_logits(t({-1.5, 0.0, 2.5}, dt, true), t({1.0, 0.5, 0.0}, dt),
      {weight = t({2.0, 1.0, 0.5}, dt), reduction = "none"}) end, true)
  case("cumsum axis 1 nan/inf " .. dt, function() return flow.cumsum(t({{1.0, nan, 3.0}, {inf, 2.0, -inf}}, dt, true), 1) end, true)
  case("cumsum axis -2 transposed " .. dt, function() return flow.cumsum(t(L3, dt, true):transpose(1, 2), -2) end, true)
  case("cumsum 0-d " .. dt, function() return flow.cumsum(t(2.5, dt, true), 0) end, true)
  case("cumsum size-0 " .. dt, function() return flow.cumsum(flow.zeros({2, 0}, {dtype = dt}), 1) end)
  case("flip axes 0,-1 " .. dt, function() return flow.flip(t(L3, dt, true), {0, -1}) end, true)
  case("flip transposed nan/inf " .. dt, function() return flow.flip(t({{1.0, nan, 3.0}, {inf, 2.0, -inf}}, dt, true):transpose(0, 1), 1) end, true)
  case("flip size-0 " .. dt, function() return flow.flip(flow.zeros({0, 3}, {dtype = dt}), {0, 1}) end)
  case("prod all " .. dt, function() return flow.prod(t(L3, dt, true)) end, true)
  case("prod one zero " .. dt, function() return flow.prod(t({1.5, 0.0, -2.0, 3.0}, dt, true)) end, true)
  case("prod two zeros " .. dt, function() return flow.prod(t({1.5, 0.0, -2.0, 0.0}, dt, true)) end, true)
  case("prod axis -1 keepdim zeros " .. dt, function()
    return flow.prod(t({{1.5, 0.0, -2.0}, {0.0, 0.0, 3.0}, {0.5, 4.0, -1.0}}, dt, true), -1, true) end, true)
  case("prod axis 0 transposed zeros " .. dt, function()
    return flow.prod(t({{1.5, 0.0, -2.0}, {0.0, 0.5, 3.0}}, dt, true):transpose(0, 1), 1) end, true)
  case("prod nan/inf " .. dt, function() return flow.prod(t({{2.0, nan}, {inf, -0.5}}, dt), 1) end)
  case("prod 0-d " .. dt, function() return flow.prod(t(2.5, dt, true)) end, true)
  case("prod size-0 " .. dt, function() return flow.prod(flow.zeros({2, 0}, {dtype = dt}), 1) end)
  case("roll axes 0,-1 " .. dt, function() return flow.roll(t(L3, dt, true), {1, -4}, {0, -1}) end, true)
  case("roll flat transposed " .. dt, function() return flow.roll(t({{1.0, nan, 3.0}, {inf, 2.0, -inf}}, dt, true):transpose(0, 1), 4) end, true)
  case("roll size-0 " .. dt, function() return flow.roll(flow.zeros({0, 3}, {dtype = dt}), 2, 0) end)
  local S2 = {{3.0, 1.0, nan, 1.0, -0.5}, {2.0, -inf, 2.0, inf, 0.0}}
  case("sort nan/ties " .. dt, function() return flow.sort(t(S2, dt, true)) end, true)
  case("sort axis 1 descending transposed " .. dt, function() return flow.sort(t(L3, dt, true):transpose(1, 2), 1, true) end, true)
  case("sort axis 0 stable descending " .. dt, function()
    return flow.sort(t(S2, dt, true), 0, {descending = true, stable = true}) end, true)
  case("sort 0-d " .. dt, function() return flow.sort(t(2.5, dt, true)) end, true)
  case("sort size-0 " .. dt, function() return flow.sort(flow.zeros({2, 0}, {dtype = dt}), 1) end)
  case("argsort descending nan " .. dt, function() return flow.argsort(t(S2, dt), -1, true) end)
  case("topk 2 nan/inf " .. dt, function() return flow.topk(t({{3.0, 1.0, nan, 0.5}, {2.0, -inf, 5.0, inf}}, dt, true), 2) end, true)
  case("topk smallest axis 0 " .. dt, function() return flow.topk(t(L3, dt, true), 1, 0, false) end, true)
  case("topk axis -2 transposed " .. dt, function() return flow.topk(t(L3, dt, true):transpose(1, 2), 1, -2, {largest = true}) end, true)
  case("topk k 0 " .. dt, function() return flow.topk(t({{1.0, 2.0}}, dt), 0) end)
  case("unbind axis -1 " .. dt, function() return table.unpack(flow.unbind(t(L3, dt, true), -1)) end, true)
  case("unbind transposed " .. dt, function() return table.unpack(flow.unbind(t(S2, dt, true):transpose(0, 1))) end, true)
  case("repeat leading axis " .. dt, function() return flow["repeat"](t({{1.0, nan}, {inf, -2.0}}, dt, true), {2, 1, 3}) end, true)
  case("repeat transposed " .. dt, function() return flow["repeat"](t(L3, dt, true):transpose(0, 2), 1, 2, 2) end, true)
  case("repeat 0-d " .. dt, function() return flow["repeat"](t(2.5, dt, true), {3}) end, true)
  case("repeat zero times " .. dt, function() return flow["repeat"](t({1.0, 2.0}, dt, true), {2, 0}) end, true)
  case("tile short reps " .. dt, function() return flow.tile(t({{1.0, 2.0}, {3.0, 4.0}}, dt, true), {3}) end, true)
  case("masked_select broadcast " .. dt, function()
    return flow.masked_select(t(S2, dt, true), flow.tensor({true, false, true, true, false})) end, true)
  case("masked_select mask wider " .. dt, function()
    return flow.masked_select(t({{1.0}, {nan}}, dt, true), flow.tensor({{true, false, true}, {false, true, true}})) end, true)
  case("masked_select none " .. dt, function() return flow.masked_select(t({1.0, 2.0}, dt, true), flow.tensor({false, false})) end, true)
  local A, D = {5.5, -5.5, 5.5, -5.5, 3.0, -0.0, nan, inf, 2.0}, {3.0, 3.0, -3.0, -3.0, 1.5, 2.0, 1.0, 2.0, inf}
  case("remainder signs " .. dt, function() return flow.remainder(t(A, dt, true), t(D, dt)) end, true)
  case("fmod signs " .. dt, function() return flow.fmod(t(A, dt, true), t(D, dt)) end, true)
  case("floor_divide signs " .. dt, function() return flow.floor_divide(t(A, dt), t(D, dt)) end)
  case("remainder by zero " .. dt, function() return flow.remainder(t({1.0, -1.0, 0.0}, dt), 0.0) end)
  case("fmod by zero " .. dt, function() return flow.fmod(t({1.0, -1.0, 0.0}, dt), 0.0) end)
  case("floor_divide by zero " .. dt, function() return flow.floor_divide(t({1.0, -1.0, 0.0}, dt), 0.0) end)
  case("remainder divisor gradient " .. dt, function() return flow.remainder(t({5.5, -5.5}, dt), t({{3.0}, {-2.0}}, dt, true)) end, true)
  case("fmod divisor gradient transposed " .. dt, function()
    return flow.fmod(t({{7.0, -7.0}, {2.5, 4.0}}, dt), t({{2.0, -2.0}, {3.0, -3.0}}, dt, true):transpose(0, 1)) end, true)
  case("a % b " .. dt, function() return t({-7.5, 7.5}, dt, true) % 2 end, true)
  case("a // b " .. dt, function() return t({-7.5, 7.5, 0.5}, dt) // -2 end)
  case("div trunc gradient " .. dt, function() return flow.div(t({7.5, -7.5}, dt, true), 2, {rounding_mode = "trunc"}) end, true)
  case("div floor 0-d " .. dt, function() return flow.div(t(-7.0, dt), t(2.0, dt), {rounding_mode = "floor"}) end)
  local P, Y = {0.0, 1e-50, 0.25, 0.5, 0.9, 1.0, 1.0, 0.0}, {0.0, 1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 1.0}
  case("binary_cross_entropy clamps " .. dt, function()
    return F.binary_cross_entropy(t(P, dt, true), t(Y, dt), {reduction = "none"}) end, true)
  case("binary_cross_entropy mean " .. dt, function() return F.binary_cross_entropy(t(P, dt, true), t(Y, dt)) end, true)
  case("binary_cross_entropy weight sum " .. dt, function()
    return F.binary_cross_entropy(t({{0.1, 0.7}, {0.3, 1.0}}, dt, true), t({{0.0, 1.0}, {0.2, 1.0}}, dt),
      {weight = t({2.0, 0.5}, dt), reduction = "sum"}) end, true)
  case("binary_cross_entropy 0-d " .. dt, function() return F.binary_cross_entropy(t(0.3, dt, true), t(1.0, dt)) end, true)
  case("binary_cross_entropy target gradient " .. dt, function()
    return F.binary_cross_entropy(t({0.2, 0.6, 1.0}, dt), t({0.0, 0.4, 1.0}, dt, true), {reduction = "sum"}) end, true)
  case("where promoted gradient " .. dt, function()
    return flow.where(flow.tensor({true, false, true}), t({1.5, nan, -2.0}, dt, true), flow.tensor({1, 2, 3})) end, true)
  case("cat promoted gradient " .. dt, function() return flow.cat({t({{1.5, 2.0}}, dt, true), flow.tensor({{1, 2}})}, 0) end, true)
  local V, M2 = {1.5, -2.0, 0.5}, {{1.0, -1.0, 2.0}, {0.5, 3.0, -0.25}}
  case("matmul vector . vector " .. dt, function() return flow.matmul(t(V, dt, true), t({2.0, 1.0, -4.0}, dt)) end, true)
  case("matmul matrix . vector " .. dt, function() return flow.matmul(t(M2, dt), t(V, dt, true)) end, true)
  case("matmul vector . matrix " .. dt, function() return flow.matmul(t({2.0, -1.0}, dt, true), t(M2, dt)) end, true)
  case("matmul batched . vector " .. dt, function() return flow.matmul(t({M2, M2}, dt, true), t(V, dt)) end, true)
  case("matmul vector . batched transposed " .. dt, function()
    return flow.matmul(t(V, dt, true), t({M2, M2}, dt):transpose(1, 2)) end, true)
  case("matmul size-0 vector " .. dt, function() return flow.matmul(flow.zeros({0}, {dtype = dt}), flow.zeros({0}, {dtype = dt})) end)
  case("linear 1-d input " .. dt, function() return F.linear(t(V, dt, true), t(M2, dt), t({0.5, -1.0}, dt)) end, true)
  local W2 = {{0.5, -1.0}, {2.0, 1.5}, {1.0, 0.25}}
  case("layer_norm over two axes " .. dt, function()
    return F.layer_norm(t(L3, dt, true), {3, 2}, t(W2, dt), t({{0.0, 1.0}, {-1.0, 0.5}, {0.25, 0.0}}, dt), 1e-5) end, true)
  case("layer_norm last axis, integer shape " .. dt, function() return F.layer_norm(t(L3, dt, true):transpose(0, 1), 2) end, true)
  case("layer_norm weight only eps " .. dt, function() return F.layer_norm(t(L3, dt, true), {2}, t({2.0, -0.5}, dt), nil, 0.1) end, true)
  local Q3 = {{{0.5, -1.0, 0.25}, {1.0, 0.0, -0.5}}, {{-0.75, 0.5, 2.0}, {0.1, 0.2, 0.3}}}
  local K3 = {{{1.0, 0.5, -0.5}, {0.0, -1.0, 1.0}, {0.25, 0.75, 0.5}}, {{-1.0, 2.0, 0.0}, {0.5, 0.5, 0.5}, {1.5, -0.5, 1.0}}}
  case("attention 3-d " .. dt, function() return F.scaled_dot_product_attention(t(Q3, dt, true), t(K3, dt), t(K3, dt)) end, true)
  case("attention 3-d causal Tq < Tk " .. dt, function()
    return F.scaled_dot_product_attention(t(Q3, dt, true), t(K3, dt), t(K3, dt), {causal = true}) end, true)
  case("attention 4-d scale " .. dt, function()
    return F.scaled_dot_product_attention(t({Q3}, dt, true), t({K3}, dt), t({K3}, dt), {scale = 0.5}) end, true)
  case("topk 0-d " .. dt, function() return flow.topk(t(2.5, dt, true), 1) end, true)
  case("sort size-0 1-d " .. dt, function() return flow.sort(flow.zeros({0}, {dtype = dt})) end)
  case("masked_select size-0 " .. dt, function() return flow.masked_select(flow.zeros({0, 2}, {dtype = dt}), flow.tensor({true, false})) end)
  case("repeat size-0 " .. dt, function() return flow["repeat"](t({{1.0, 2.0}}, dt), 0, 2) end)
  case("remainder 0-d divisor broadcast " .. dt, function() return flow.remainder(t({{-3.5, 4.0}, {7.0, -0.5}}, dt, true), t(-2.0, dt)) end, true)
  case("where 0-d operands " .. dt, function() return flow.where(flow.tensor({true, false}), t(1.5, dt, true), t(-2.0, dt)) end, true)
  case("any axis 1 " .. dt, function() return flow.any(t({{0.0, nan}, {0.0, 0.0}}, dt), 1) end)
  case("all " .. dt, function() return flow.all(t({{1.0, inf}, {-2.0, 0.0}}, dt)) end)
  local TT = {{{1.0, -2.0}, {3.0, -2.0}}, {{-2.0, 0.5}, {3.0, 3.0}}}
  case("amax axis 1 nan/ties " .. dt, function() return flow.amax(t({{1.0, 5.0, 5.0}, {nan, 2.0, nan}}, dt, true), 1) end, true)
  case("amin axes 0,-1 keepdim ties " .. dt, function() return flow.amin(t(TT, dt, true), {0, -1}, true) end, true)
  case("amax all ties " .. dt, function() return flow.amax(t(TT, dt, true)) end, true)
  case("amax method transposed " .. dt, function() return t(TT, dt, true):transpose(0, 2):amax(0) end, true)
  case("amin inf " .. dt, function() return flow.amin(t({{inf, -inf, 1.0}, {inf, inf, inf}}, dt, true), 1) end, true)
  case("amax method axis -1 keepdim " .. dt, function() return t({{0.5, 0.5}, {-1.0, 2.0}}, dt, true):amax(-1, {keepdim = true}) end, true)
  case("amax 0-d " .. dt, function() return flow.amax(t(2.5, dt, true), 0) end, true)
  case("amin 0-d all " .. dt, function() return flow.amin(t(-1.5, dt, true)) end, true)
  case("amax size-0 kept axis " .. dt, function() return flow.amax(flow.zeros({0, 3}, {dtype = dt}), 1) end)
  -- gradients away from NaN: there torch's is 0 or 1 by the element's position (README)
  local HX, XB = {-1.5, -1.0, -0.5, 0.0, 1.0, 1.5, inf, -inf}, {-1.5, -0.5, 0.0, 0.25, 0.5, 2.5, 3.0, inf, -inf}
  case("hardtanh bounds inf " .. dt, function() return F.hardtanh(t(HX, dt, true)) end, true)
  case("hardtanh nan " .. dt, function() return F.hardtanh(t(X, dt)) end)
  case("hardtanh min_val max_val " .. dt, function() return F.hardtanh(t(XB, dt, true), -0.5, 2.5) end, true)
  case("hardtanh options max_val " .. dt, function() return F.hardtanh(t(XB, dt, true), {max_val = 0.25}) end, true)
  case("hardtanh min>max " .. dt, function() return F.hardtanh(t(XB, dt, true), 2.0, 1.0) end, true)
  case("hardtanh 0-d at bound " .. dt, function() return F.hardtanh(t(1.0, dt, true)) end, true)
  case("relu6 bounds inf " .. dt, function() return F.relu6(t({-1.0, 0.0, 3.0, 6.0, 7.0, inf, -inf}, dt, true)) end, true)
  case("relu6 nan " .. dt, function() return F.relu6(t(X, dt)) end)
  case("relu6 transposed " .. dt, function() return F.relu6(t({{0.0, 6.5, -2.0}, {6.0, 2.5, 7.0}}, dt, true):transpose(0, 1)) end, true)
  case("relu6 size-0 " .. dt, function() return F.relu6(flow.zeros({0, 2}, {dtype = dt})) end)
  case("nn.Hardtanh " .. dt, function() return flow.nn.Hardtanh(-0.5, 0.5)(t(XB, dt, true)) end, true)
  case("nn.ReLU6 " .. dt, function() return flow.nn.ReLU6()(t(XB, dt, true)) end, true)
  case("clamp_min nan " .. dt, function() return flow.clamp_min(t(X, dt, true), 0.25) end, true)
  case("clamp_max method " .. dt, function() return t(X, dt, true):clamp_max(0.5) end, true)
  case("bool * float nan gradient " .. dt, function() return flow.tensor({true, false}) * t({1.5, nan}, dt, true) end, true)
end
case("amax int64 axes", function() return flow.amax(flow.tensor({{{1, 7}, {3, -4}}, {{9, 2}, {0, 5}}}), {0, 2}) end)
case("amin int32 keepdim", function() return flow.amin(flow.tensor({{1, 7}, {3, -4}}, {dtype = "int32"}), 1, true) end)
case("amax bool", function() return flow.amax(flow.tensor({{true, false}, {false, false}}), 1) end)
case("amin bool all", function() return flow.tensor({{true, false}, {true, true}}):amin() end)
case("hardtanh int64", function() return F.hardtanh(flow.tensor({-3, -1, 0, 1, 3})) end)
case("relu6 int64", function() return F.relu6(flow.tensor({-3, 0, 6, 7})) end)
local BA, BB = {true, false, true, false}, {true, true, false, false}
local function ba() return flow.tensor(BA) end
local function bb() return flow.tensor(BB) end
case("bool + bool", function() return ba() + bb() end)
case("bool * bool", function() return ba() * bb() end)
case("maximum bool", function() return flow.maximum(ba(), bb()) end)
case("minimum bool", function() return flow.minimum(ba(), bb()) end)
case("bool / bool", function() return ba() / bb() end)
case("bool + bool 0-d broadcast", function() return flow.tensor({{true}, {false}}) + flow.tensor(true) end)
case("bool + true", function() return ba() + true end)
case("bool * false", function() return ba() * false end)
case("bool + 1", function() return ba() + 1 end)
case("bool + 1.5", function() return ba() + 1.5 end)
case("bool * 2", function() return ba() * 2 end)
case("bool * int32", function() return ba() * flow.tensor({1, 2, 3, 4}, {dtype = "int32"}) end)
case("bool + float64 0-d", function() return ba() + flow.tensor(0.5, {dtype = "float64"}) end)
case("bool % 2", function() return ba() % 2 end)
case("bool // 2", function() return ba() // 2 end)
case("bool ^ 2", function() return ba() ^ 2 end)
case("bool + bool size-0", function() return flow.zeros({0}, {dtype = "bool"}) + flow.zeros({0}, {dtype = "bool"}) end)
-- where torch raises, flow raises naming the op
raises("bool - bool raises", "sub", function() return ba() - bb() end)
raises("bool - true raises", "sub", function() return ba() - true end)
raises("bool - 1 raises", "sub", function() return ba() - 1 end)
raises("1 - bool raises", "sub", function() return 1 - ba() end)
raises("bool - float32 raises", "sub", function() return ba() - flow.tensor({1.0, 2.0, 3.0, 4.0}) end)
raises("-bool raises", "neg", function() return -ba() end)
raises("bool // bool raises", "floor_divide", function() return ba() // bb() end)
raises("bool % bool raises", "remainder", function() return ba() % bb() end)
raises("bool ^ bool raises", "pow", function() return ba() ^ bb() end)
raises("amax empty axis raises", "amax", function() return flow.amax(flow.zeros({0, 3}), 0) end)
raises("amin all of empty raises", "amin", function() return flow.amin(flow.zeros({2, 0})) end)
raises("amax axis twice raises", "amax", function() return flow.amax(flow.zeros({2, 3}), {1, -1}) end)
raises("hardtanh bool raises", "hardtanh", function() return F.hardtanh(ba()) end)
raises("relu6 bool raises", "relu6", function() return F.relu6(ba()) end)
case("one_hot", function() return F.one_hot(flow.tensor({{0, 2}, {1, 0}})) end)
case("one_hot num_classes 4", function() return F.one_hot(flow.tensor({3, 1}), 4) end)
case("cumsum int32", function() return flow.cumsum(flow.tensor({{1, 2}, {3, 4}}, {dtype = "int32"}), 0) end)
case("cumsum bool", function() return flow.cumsum(flow.tensor({true, false, true}), 0) end)
case("flip int64", function() return flow.flip(flow.tensor({{1, 2, 3}, {4, 5, 6}}), {1}) end)
case("prod int32", function() return flow.prod(flow.tensor({{1, 2}, {3, -4}}, {dtype = "int32"}), 0) end)
case("prod bool", function() return flow.prod(flow.tensor({true, true})) end)
case("sort int64 descending ties", function() return flow.sort(flow.tensor({3, 1, 2, 1, 3, 2}), 0, true) end)
case("argsort int32", function() return flow.argsort(flow.tensor({{5, -1, 3}, {0, 0, -7}}, {dtype = "int32"})) end)
case("topk int64", function() return flow.topk(flow.tensor({4, 9, -2, 7}), 3) end)
case("sort bool", function() return flow.sort(flow.tensor({true, false, true, false})) end)
case("repeat int64", function() return flow["repeat"](flow.tensor({{1, 2}}), 2, 2) end)
case("masked_select bool", function() return flow.masked_select(flow.tensor({true, false, true}), flow.tensor({false, true, true})) end)
case("remainder int64 signs", function() return flow.remainder(flow.tensor({7, -7, 7, -7, 0}), flow.tensor({3, 3, -3, -3, 5})) end)
case("fmod int64 signs", function() return flow.fmod(flow.tensor({7, -7, 7, -7, 0}), flow.tensor({3, 3, -3, -3, 5})) end)
case("floor_divide int64 signs", function() return flow.floor_divide(flow.tensor({7, -7, 7, -7, 0}), flow.tensor({3, 3, -3, -3, 5})) end)
case("floor_divide int32 by -1", function() return flow.floor_divide(flow.tensor({7, -8}, {dtype = "int32"}), -1) end)
case("remainder int64 by float", function() return flow.remainder(flow.tensor({5, -5}), 2.5) end)
case("remainder number by int64", function() return flow.remainder(-3, flow.tensor({2, -2})) end)
case("fmod int32 + int64", function() return flow.fmod(flow.tensor({-7, 9}, {dtype = "int32"}), flow.tensor({2, 4})) end)
case("int64 % int64", function() return flow.tensor({-7, 7}) % flow.tensor({2, -2}) end)
case("int64 // int64", function() return flow.tensor({-7, 7}) // flow.tensor({2, -2}) end)
case("remainder size-0", function() return flow.remainder(flow.zeros({0, 2}), flow.ones({2})) end)
case("where int64, float32", function() return flow.where(flow.tensor({true, false, true}), flow.tensor({1, 2, 3}), flow.tensor({0.5, 1.5, 2.5})) end)
case("where int64, 2.5", function() return flow.where(flow.tensor({true, false}), flow.tensor({1, 2}), 2.5) end)
case("where float32, 2", function() return flow.where(flow.tensor({true, false}), flow.tensor({1.5, 2.5}), 2) end)
case("where int32, int64 0-d", function() return flow.where(flow.tensor({true, false}), flow.tensor({1, 2}, {dtype = "int32"}), flow.tensor(5)) end)
case("where 1, 2.5", function() return flow.where(flow.tensor({true, false}), 1, 2.5) end)
case("where bool, float64 broadcast", function()
  return flow.where(flow.tensor({{true}, {false}}), flow.tensor({true, false}), flow.tensor({0.25, 0.5}, {dtype = "float64"})) end)
case("cat int64, float32", function() return flow.cat({flow.tensor({1, 2}), flow.tensor({0.5})}) end)
case("cat int32, bool", function() return flow.cat({flow.tensor({1}, {dtype = "int32"}), flow.tensor({true})}) end)
case("cat float32, float64 axis 1", function() return flow.cat({flow.tensor({{1.5}}), flow.tensor({{2.25, 3.0}}, {dtype = "float64"})}, 1) end)
case("stack int64, float64", function() return flow.stack({flow.tensor({1, 2}), flow.tensor({0.5, 1.5}, {dtype = "float64"})}) end)
case("matmul int64", function() return flow.matmul(flow.tensor({{1, 2}, {3, 4}}), flow.tensor({{5, -6}, {7, 8}})) end)
case("matmul int64 batched broadcast", function() return flow.matmul(flow.tensor({{{1, 2}}, {{3, 4}}}), flow.tensor({{5, -6}, {7, 8}})) end)
case("matmul int64 vectors", function() return flow.matmul(flow.tensor({1, 2, 3}), flow.tensor({4, 5, -6})) end)
case("matmul int32 transposed", function() return flow.matmul(flow.tensor({{1, 2}, {3, 4}}, {dtype = "int32"}):transpose(0, 1), flow.tensor({{1}, {-1}}, {dtype = "int32"})) end)
case("index_select int32 index", function() return flow.index_select(flow.tensor({{1.5, 2.0}, {3.0, -1.0}, {0.5, 4.0}}), 0, flow.tensor({2, 0, 2}, {dtype = "int32"})) end)
case("embedding int32 ids", function() return F.embedding(flow.tensor({{1, 0}}, {dtype = "int32"}), flow.tensor({{1.5, 2.0}, {3.0, -1.0}})) end)
case("int64 / int64", function() return flow.tensor({3, 4, -7}) / flow.tensor({2, 0, 2}) end)
case("int64 + 2.0", function() return flow.tensor({1, 2}) + 2.0 end)
case("int64 + 2", function() return flow.tensor({1, 2}) + 2 end)
case("int32 + int64", function() return flow.tensor({1, 2}, {dtype = "int32"}) + flow.tensor({1, 2}) end)
case("int32 + int64 0-d", function() return flow.tensor({1, 2}, {dtype = "int32"}) + flow.tensor(5) end)
case("float32 * float64", function() return flow.tensor({1.5, 2.0}) * flow.tensor({2.0, 3.0}, {dtype = "float64"}) end)
case("float32 * float64 0-d", function() return flow.tensor({1.5, 2.0}) * flow.tensor(2.0, {dtype = "float64"}) end)
case("int64 * float64 0-d", function() return flow.tensor({1, 2}) * flow.tensor(0.5, {dtype = "float64"}) end)
case("bool * float32", function() return flow.tensor({true, false}) * flow.tensor({1.5, 2.0}) end)
case("int64 < 2.5", function() return flow.lt(flow.tensor({1, 2, 3}), 2.5):long() end)
case("div floor int", function() return flow.div(flow.tensor({7, -7, 6}), flow.tensor({2, 2, -4}), {rounding_mode = "floor"}) end)
case("div trunc int", function() return flow.div(flow.tensor({7, -7, 6}), 2, {rounding_mode = "trunc"}) end)
case("div floor float", function() return flow.div(flow.tensor({7.5, -7.5}), 2, {rounding_mode = "floor"}) end)

local function flat(v, out)
  out = out or {}
  if type(v) == "table" then for _, x in ipairs(v) do flat(x, out) end
  elseif type(v) == "boolean" then out[#out + 1] = v and 1 or 0 -- torch's side prints bools as numbers
  else out[#out + 1] = v end
  return out
end
local function parse(s)
  local out = {}
  for w in s:gmatch("%S+") do out[#out + 1] = w == "nan" and nan or w == "inf" and inf or w == "-inf" and -inf or tonumber(w) end
  return out
end
local function same(a, b, tol)
  if #a ~= #b then return false, ("%d values, torch %d"):format(#a, #b) end
  for i = 1, #b do
    local x, y = a[i], b[i]
    local ok = (x ~= x and y ~= y) or x == y or (math.abs(x - y) <= tol * math.max(1, math.abs(y)))
    if not ok then return false, ("element %d: flow %.9g, torch %.9g"):format(i, x, y) end
  end
  return true
end

describe("conformance with PyTorch", function()
  local python = find_python()
  if not python then pending("python3-torch not installed") return end
  local args = {}
  for _, n in ipairs(order) do args[#args + 1] = "'" .. n .. "'" end
  local p = assert(io.popen(python .. " " .. SCRIPT .. " " .. table.concat(args, " ")))
  local want = {}
  for line in p:lines() do
    local name, dtype, values, grad = line:match("^(.-)|(.-)|(.-)|(.*)$")
    want[name] = {dtype = dtype, values = parse(values), grad = parse(grad), message = values}
  end
  p:close()
  for _, name in ipairs(order) do
    it(name, function()
      leaves = {}
      local c, w = cases[name], want[name]
      assert(w, "no torch result for " .. name)
      if c.raises or w.dtype == "error" then
        assert(w.dtype == "error", "torch computes this, flow expected to raise")
        assert(c.raises, "torch raises (" .. tostring(w.message) .. "), flow expected to compute")
        local ok, err = pcall(c.fn)
        assert(not ok, "flow computes where torch raises: " .. w.message)
        assert(tostring(err):sub(1, #c.raises + 1) == c.raises .. ":", "the error should name " .. c.raises .. ": " .. tostring(err))
        return
      end
      local outs = table.pack(c.fn()) -- several (sort's values and indices): dtypes and values in turn
      local out, dtypes, values = outs[1], {}, {}
      for i = 1, outs.n do
        dtypes[i] = outs[i].dtype
        flat(outs[i]:totable(), values)
      end
      assert.are.equal(w.dtype, table.concat(dtypes, ","))
      local tol = ({float32 = 2e-6, bfloat16 = 2 ^ -7})[out.dtype] or 1e-12
      local ok, why = same(values, w.values, tol)
      assert(ok, "values: " .. tostring(why))
      if c.grad then
        flow.sum(out):backward()
        ok, why = same(flat(leaves[1].grad:totable()), w.grad, tol)
        assert(ok, "gradient: " .. tostring(why))
      end
    end)
  end
end)
