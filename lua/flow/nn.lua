-- flow.nn: modules in the style of Torch7/PyTorch, written in Lua over flow ops, and
-- flow.nn.functional (F), the stateless functions the modules call.
local flow = require "flow"

local nn = {}
local F = {}
nn.functional = F

-------------------------------------------------------------------------------- functional

-- Inputs of rank > 2 are folded into one [N, in] matrix first: one GEMM each way, and the weight
-- gradient comes out [out, in] directly instead of per batch and then summed; a 1-D input is one
-- row, its result 1-D, as torch.
-- With a bias, the fused "linear" op writes the bias and lets GEMM add onto it (one pass over the
-- output fewer); on global tensors its SBP rule splits rows, out features or in features.
F.linear = flow._named("linear", function(x, weight, bias)
  local s = x:shape()
  local x2 = x
  if #s ~= 2 then
    local rows = 1
    for i = 1, #s - 1 do rows = rows * s[i] end
    x2 = flow.reshape(x, { rows, s[#s] })
  end
  local y
  if bias then y = flow.linear(x2, weight, bias)
  else y = flow.matmul(x2, weight, { transpose_b = true }) end
  if #s ~= 2 then
    s[#s] = weight:shape()[1]
    y = flow.reshape(y, s)
  end
  return y
end)

-- opts: {approximate = "none" (erf, torch's default) | "tanh"}
function F.gelu(x, opts) return flow.gelu(x, opts) end
function F.relu(x) return flow.relu(x) end
function F.silu(x) return flow.silu(x) end
-- hardtanh(x, min_val = -1, max_val = 1 | {min_val, max_val}) = clamp(x, min_val, max_val) (max_val
-- everywhere if min_val > max_val, NaN at NaN), with torch's gradient: 1 strictly between the
-- bounds, 0 at and beyond them (clamp's is 1 at the bounds) and at NaN. Values from clamp, the
-- gradient from the where that picks x strictly inside. relu6(x) = hardtanh(x, 0, 6).
local function hardtanh(x, lo, hi)
  if not flow.is_tensor(x) then error(("expected a tensor (got %s)"):format(type(x)), 0) end
  if x.dtype == "bool" then error("bool inputs are not supported, as in torch", 0) end
  for what, v in pairs({ min_val = lo, max_val = hi }) do
    if type(v) ~= "number" then error(("%s must be a number (got %s)"):format(what, type(v)), 0) end
  end
  local c = flow.clamp(x, lo, hi):detach()
  return flow.where(flow.gt(x, lo), flow.where(flow.lt(x, hi), x, c), c)
end
F.hardtanh = flow._named("hardtanh", function(x, min_val, max_val)
  if type(min_val) == "table" then
    if max_val ~= nil then error("give the bounds as numbers or as one options table, not both", 0) end
    flow._check_opts("hardtanh", min_val, { "min_val", "max_val" })
    min_val, max_val = min_val.min_val, min_val.max_val
  end
  if min_val == nil then min_val = -1 end
  if max_val == nil then max_val = 1 end
  return hardtanh(x, min_val, max_val)
end)
F.relu6 = flow._named("relu6", function(x, ...)
  if select("#", ...) > 0 then error("takes only the input (got more arguments)", 0) end
  return hardtanh(x, 0, 6)
end)
function F.softplus(x, opts) return flow.softplus(x, opts) end
function F.softmax(x, axis) return flow.softmax(x, axis or -1) end
function F.log_softmax(x, axis) return flow.log_softmax(x, axis or -1) end
-- F.layer_norm(x, normalized_shape, weight, bias, eps = 1e-5) as torch: normalised over the trailing
-- axes normalized_shape names (an integer or a list), weight and bias of that shape; the axes are
-- folded into one for the op and unfolded after. F.layer_norm(x, weight, bias, eps) (over the last
-- axis) still works: a tensor or nil second argument means that form.
F.layer_norm = flow._named("layer_norm", function(x, normalized_shape, weight, bias, eps)
  if normalized_shape == nil or flow.is_tensor(normalized_shape) then
    return flow.layer_norm(x, normalized_shape, weight, bias or 1e-5)
  end
  local ns = type(normalized_shape) == "table" and normalized_shape or { normalized_shape }
  local s, m = x:shape(), #ns
  local function str(t) return "{" .. table.concat(t, ",") .. "}" end
  local ok, count = m <= #s and m > 0, 1
  for i = 1, m do
    ok = ok and s[#s - m + i] == ns[i]
    count = count * ns[i]
  end
  if not ok then
    error(("normalized_shape %s must be the input's trailing axes (got input of shape %s)"):format(str(ns), str(s)), 0)
  end
  for name, t in pairs({ weight = weight, bias = bias }) do
    if str(t:shape()) ~= str(ns) then
      error(("%s must have normalized_shape %s (got %s)"):format(name, str(ns), str(t:shape())), 0)
    end
  end
  if m == 1 then return flow.layer_norm(x, weight, bias, eps or 1e-5) end
  local folded = { table.unpack(s, 1, #s - m) }
  folded[#folded + 1] = count
  local y = flow.layer_norm(x:reshape(folded), weight and weight:reshape({ count }), bias and bias:reshape({ count }),
    eps or 1e-5)
  return y:reshape(s)
end)
-- PyTorch's layout: logits [C], [N, C] or [N, C, d1, ...], target [], [N] or [N, d1, ...].
-- Logits split on the class axis (vocab parallel): the composition in flow.parallel.
F.cross_entropy = flow._named("cross_entropy", function(logits, target, opts)
  flow._check_opts("cross_entropy", opts, { "ignore_index", "reduction" })
  local parallel = require "flow.parallel"
  if parallel.class_axis_split(logits) then return parallel.cross_entropy(logits, target, opts) end
  return flow.cross_entropy(logits, target, opts)
end)
-- The losses below are compositions of flow ops, computed as torch computes them (same numbers),
-- with the gradient from the ops' rules. reduction: "mean" (default) | "sum" | "none".
local function reduce(fn, loss, reduction)
  if reduction == nil or reduction == "mean" then return flow.mean(loss) end
  if reduction == "sum" then return flow.sum(loss) end
  if reduction == "none" then return loss end
  error(("%s: reduction must be \"mean\", \"sum\" or \"none\" (got %s)"):format(fn, tostring(reduction)), 3)
end

-- mse_loss(input, target) = reduce((input - target)^2)
F.mse_loss = flow._named("mse_loss", function(input, target, opts)
  flow._check_opts("mse_loss", opts, { "reduction" })
  local d = input - target
  return reduce("mse_loss", d * d, opts and opts.reduction)
end)

-- nll_loss(input, target): input log-probabilities [C], [N, C] or [N, C, d1, ...] (class axis 1, as
-- cross_entropy), target int64 [], [N] or [N, d1, ...]; loss = -input[n, target[n], ...], 0 where
-- target == ignore_index (default -100); mean divides the sum by the count of targets not ignored.
F.nll_loss = flow._named("nll_loss", function(input, target, opts)
  flow._check_opts("nll_loss", opts, { "ignore_index", "reduction" })
  local ignore = opts and opts.ignore_index or -100
  local reduction = opts and opts.reduction or "mean"
  if not flow.is_tensor(target) or target.dtype ~= "int64" then
    error("nll_loss: target must be an int64 tensor of class indices", 2)
  end
  local axis = #input:shape() == 1 and 0 or 1
  local ignored = flow.eq(target, ignore)
  local safe = flow.masked_fill(target, ignored, 0)
  local picked = flow.squeeze(flow.gather(input, axis, flow.unsqueeze(safe, axis)), axis)
  local loss = flow.masked_fill(-picked, ignored, 0)
  if reduction ~= "mean" then return reduce("nll_loss", loss, reduction) end
  return flow.sum(loss) / flow.sum(flow.ne(target, ignore):cast(loss.dtype))
end)

-- binary_cross_entropy_with_logits(x, y, {weight, reduction}) as torch computes it, stable for any x:
--   m = max(-x, 0); loss = (1 - y) x + m + log(exp(-m) + exp(-x - m))   [= -(y log s(x) + (1-y) log(1-s(x)))]
-- times weight when given.
F.binary_cross_entropy_with_logits = flow._named("binary_cross_entropy_with_logits", function(input, target, opts)
  flow._check_opts("binary_cross_entropy_with_logits", opts, { "weight", "reduction" })
  local m = flow.clamp(-input, 0)
  local loss = (1 - target) * input + m + flow.log(flow.exp(-m) + flow.exp(-input - m))
  if opts and opts.weight then loss = loss * opts.weight end
  return reduce("binary_cross_entropy_with_logits", loss, opts and opts.reduction)
end)

-- binary_cross_entropy(x, y, {weight, reduction}) on probabilities x in [0, 1], as torch:
--   loss = -w (y max(log x, -100) + (1 - y) max(log(1 - x), -100)),
-- whose gradient torch takes as w (x - y) / max(x (1 - x), eps) (finite at x = 0 and 1; eps is 1e-12
-- rounded to float32, as torch's kernel has it, in either dtype): x enters
-- the loss through x c - detach(x c) with c that gradient held constant, the target through the
-- loss of a detached x.
F.binary_cross_entropy = flow._named("binary_cross_entropy", function(input, target, opts)
  flow._check_opts("binary_cross_entropy", opts, { "weight", "reduction" })
  local function shape(t) return "{" .. table.concat(t:shape(), ",") .. "}" end
  if not flow.is_tensor(target) or shape(target) ~= shape(input) then
    error(("target must have the input's shape %s (got %s)"):format(shape(input),
      flow.is_tensor(target) and shape(target) or type(target)), 0)
  end
  local outside = flow.lt(input, 0):long() + flow.gt(input, 1):long() + flow.ne(input, input):long()
  if input:numel() > 0 and flow.sum(outside):item() > 0 then
    error("all elements of input should be between 0 and 1", 0)
  end
  local x = input:detach()
  local function clog(v) return flow.clamp(flow.log(v), -100) end
  local loss = -(target * clog(x) + (1 - target) * clog(1 - x))
  local eps = string.unpack("f", string.pack("f", 1e-12))
  local c = flow.no_grad(function() return (x - target) / flow.clamp(x * (1 - x), eps) end)
  local through_x = input * c
  loss = loss + (through_x - through_x:detach())
  if opts and opts.weight then loss = loss * opts.weight end
  return reduce("binary_cross_entropy", loss, opts and opts.reduction)
end)

-- one_hot(t, num_classes): int64 [..., C] with 1 at t's class, C = num_classes or max(t) + 1
F.one_hot = flow._named("one_hot", function(t, num_classes)
  if not flow.is_tensor(t) or t.dtype ~= "int64" then error("one_hot: expected an int64 tensor of class indices", 2) end
  local C = num_classes
  if C == nil or C == -1 then
    if t:numel() == 0 then error("one_hot: cannot infer the number of classes of an empty tensor", 2) end
    C = flow.max(t):item() + 1
  end
  if t:numel() > 0 and (flow.min(t):item() < 0 or flow.max(t):item() >= C) then
    error(("one_hot: class values must be in [0, %d) (got [%d, %d])"):format(C, flow.min(t):item(), flow.max(t):item()), 2)
  end
  local classes = flow.arange(0, C, 1, { dtype = "int64", device = t.device })
  return flow.eq(flow.unsqueeze(t, -1), classes):long()
end)
function F.dropout(x, p, training)
  if training == false or (p or 0.5) == 0 then return x end
  return flow.dropout(x, p or 0.5, true)
end
function F.embedding(ids, weight) return flow.embedding(ids, weight) end
-- softmax(q k^T scale, keys after the query masked when causal) v from two matmuls and a softmax:
-- the [Tq, Tk] scores are materialised, but the matmuls run on cuBLAS (tensor cores under autocast)
-- where the fused kernel runs on CUDA cores. flow.backends.attention = "math" selects it.
local function attention_math(q, k, v, opts)
  local s = q:shape()
  local Tq, Tk, D = s[#s - 1], k:shape()[#s - 1], s[#s]
  local scale = opts and opts.scale or 1 / math.sqrt(D)
  local scores = flow.matmul(q, k, { transpose_b = true }) * scale
  if opts and opts.causal then
    local i = flow.arange(0, Tq, 1, { dtype = "int64", device = q.device }):view({ Tq, 1 })
    local j = flow.arange(0, Tk, 1, { dtype = "int64", device = q.device }):view({ 1, Tk })
    scores = flow.masked_fill(scores, flow.gt(j, i), -math.huge)
  end
  return flow.matmul(flow.softmax(scores, -1), v)
end

-- q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] with the same leading axes, as torch: [B, H, T, D]
-- goes to the op as it is; any other rank (3-d [B, T, D], ...) is folded to [N, 1, T, D] and back.
-- causal masks the keys after each query from the top left (key j > query i), as torch, which for
-- Tq ~= Tk the math path does (the fused kernel takes Tq == Tk only).
function F.scaled_dot_product_attention(q, k, v, opts)
  flow._check_opts("scaled_dot_product_attention", opts, { "causal", "scale" })
  local backend = flow.backends and flow.backends.attention
  if backend ~= nil and backend ~= "fused" and backend ~= "math" then
    error(("scaled_dot_product_attention: flow.backends.attention is %q; expected \"fused\" or \"math\""):format(
      tostring(backend)), 2)
  end
  local function shape_of(t, name)
    local ok, s = pcall(function() return t:shape() end)
    if not ok or type(s) ~= "table" then
      error(("scaled_dot_product_attention: %s must be a tensor (%s)"):format(name,
        flow.is_tensor(t) and tostring(s) or "got a " .. type(t)), 3)
    end
    return s
  end
  local sq, sk, sv = shape_of(q, "q"), shape_of(k, "k"), shape_of(v, "v")
  local n = #sq
  if n ~= 4 then
    local lead, same = 1, n >= 2 and #sk == n and #sv == n
    for i = 1, n - 2 do
      same = same and sk[i] == sq[i] and sv[i] == sq[i]
      lead = lead * sq[i]
    end
    if not same then
      local function str(s) return "{" .. table.concat(s, ",") .. "}" end
      error(("scaled_dot_product_attention: q, k and v must have the same leading axes and at least 2 dimensions"
        .. " ([..., T, D]); got q %s, k %s, v %s"):format(str(sq), str(sk), str(sv)), 2)
    end
    local function fold(t, s) return t:reshape({ lead, 1, s[n - 1], s[n] }) end
    local out = F.scaled_dot_product_attention(fold(q, sq), fold(k, sk), fold(v, sv), opts)
    local back = { table.unpack(sq) }
    back[n] = sv[n]
    return out:reshape(back)
  end
  local causal_rect = opts and opts.causal and sq[3] ~= sk[3]
  if backend == "math" or causal_rect then return attention_math(q, k, v, opts) end
  return flow.scaled_dot_product_attention(q, k, v, opts)
end

-------------------------------------------------------------------------------- Module

-- A module table keeps, in `_order`, the names of its parameters and submodules in the order they
-- were assigned: that order is the order of parameters() and state_dict() keys.
local Module = {}
nn.Module = Module

local function is_tensor(v) return flow.is_tensor(v) end
local function is_module(v) return type(v) == "table" and v._order ~= nil end

-- Assigning a submodule, or a tensor that requires grad, registers it under that name.
local function newindex(self, k, v)
  if is_module(v) or (is_tensor(v) and v.requires_grad) then
    local order = rawget(self, "_order")
    order[#order + 1] = k
  end
  rawset(self, k, v)
end

-- A new module class. Calling the class builds an instance and runs its __init; calling an
-- instance runs forward.
function nn.class(name, parent)
  local cls = {}
  cls.__index = cls
  cls.__name = name
  cls.__newindex = newindex
  cls.__call = function(self, ...) return self:forward(...) end
  cls.__tostring = function(self) return self:__repr() end
  return setmetatable(cls, {
    __index = parent,
    __call = function(c, ...)
      local o = setmetatable({ _order = {}, training = true }, c)
      o:__init(...)
      return o
    end,
  })
end

function Module:__init() end

function Module:forward()
  error(("%s: forward is not defined"):format(getmetatable(self).__name), 2)
end

-- The name a key gets in dotted paths: list entries (ModuleList, Sequential) count from 0.
local function key_name(k)
  if math.type(k) == "integer" then return tostring(k - 1) end
  return k
end

function Module:__repr()
  local lines = { getmetatable(self).__name .. "(" }
  for _, k in ipairs(self._order) do
    local v = self[k]
    if is_module(v) then
      lines[#lines + 1] = ("  (%s): %s"):format(key_name(k), (tostring(v):gsub("\n", "\n  ")))
    end
  end
  if #lines == 1 then return lines[1] .. ")" end
  lines[#lines + 1] = ")"
  return table.concat(lines, "\n")
end

-- Visit every (owner, key, prefix..name, tensor) parameter, depth first in assignment order.
local function each_parameter(m, prefix, fn)
  for _, k in ipairs(m._order) do
    local v = m[k]
    local name = prefix .. key_name(k)
    if is_module(v) then each_parameter(v, name .. ".", fn)
    elseif is_tensor(v) then fn(m, k, name, v) end
  end
end

-- {{name, tensor}, ...}: a stable order (assignment order, depth first).
function Module:named_parameters()
  local out, seen = {}, {}
  each_parameter(self, "", function(_, _, name, t)
    if not seen[t] then -- a tied tensor is listed once, under its first name
      seen[t] = true
      out[#out + 1] = { name, t }
    end
  end)
  return out
end

function Module:parameters()
  local out = {}
  for i, nt in ipairs(self:named_parameters()) do out[i] = nt[2] end
  return out
end

-- Direct submodules, in order.
function Module:children()
  local out = {}
  for _, k in ipairs(self._order) do
    if is_module(self[k]) then out[#out + 1] = self[k] end
  end
  return out
end

-- fn(m) on every submodule (children first) and then on self, as PyTorch's apply.
function Module:apply(fn)
  for _, c in ipairs(self:children()) do c:apply(fn) end
  fn(self)
  return self
end

function Module:train(mode)
  if mode == nil then mode = true end
  return self:apply(function(m) m.training = mode end)
end

function Module:eval() return self:train(false) end

function Module:zero_grad()
  for _, p in ipairs(self:parameters()) do p.grad = nil end
end

-- name -> tensor for every parameter (tied tensors appear under each name, as in PyTorch).
function Module:state_dict()
  local sd = {}
  each_parameter(self, "", function(_, _, name, t) sd[name] = t end)
  return sd
end

local function shape_str(s) return "{" .. table.concat(s, ",") .. "}" end

-- Copy values from sd into the parameters. Every parameter must be present with its shape and
-- no other key may be (strict = false skips the checks for missing and unexpected keys).
-- Keys of sd that do not hold tensors (checkpoint metadata) are ignored.
function Module:load_state_dict(sd, strict)
  strict = strict ~= false
  local mine = {}
  each_parameter(self, "", function(_, _, name, t) mine[name] = t end)
  local missing, unexpected = {}, {}
  for name in pairs(mine) do
    if sd[name] == nil then missing[#missing + 1] = name end
  end
  for name, v in pairs(sd) do
    if is_tensor(v) and mine[name] == nil then unexpected[#unexpected + 1] = name end
  end
  table.sort(missing)
  table.sort(unexpected)
  if strict and #missing > 0 then
    error(("load_state_dict: missing key '%s'%s"):format(missing[1], #missing > 1 and (" (and %d more)"):format(#missing - 1) or ""), 2)
  end
  if strict and #unexpected > 0 then
    error(("load_state_dict: unexpected key '%s'%s"):format(unexpected[1], #unexpected > 1 and (" (and %d more)"):format(#unexpected - 1) or ""), 2)
  end
  local names = {} -- one order on every rank: copying into global parameters is a global op
  for name in pairs(mine) do names[#names + 1] = name end
  table.sort(names)
  for _, name in ipairs(names) do
    local p, src = mine[name], sd[name]
    if src ~= nil then
      if not is_tensor(src) then error(("load_state_dict: key '%s' is a %s, not a tensor"):format(name, type(src)), 2) end
      local ps, ss = p:shape(), src:shape()
      if shape_str(ps) ~= shape_str(ss) then
        error(("load_state_dict: key '%s' has shape %s but the parameter has shape %s"):format(name, shape_str(ss), shape_str(ps)), 2)
      end
      if src.dtype ~= p.dtype then src = src:cast(p.dtype) end
      if not p.placement and src.device ~= p.device then src = src:to(p.device) end
      flow.no_grad(function() p:copy_(src) end)
    end
  end
  return self
end

-- Move or cast every parameter, each a leaf of its own (the optimizer must be made after this),
-- keeping tied tensors tied: `target` is a device ("cuda", "cuda:1", "cpu"), a dtype ("bfloat16",
-- flow.float64) or {device =, dtype =}; as torch's Module.to, a dtype casts floating-point
-- parameters only.
local FLOATS = { float32 = true, float64 = true, float16 = true, bfloat16 = true }
function Module:to(target)
  local opts = target
  if type(target) ~= "table" then
    local device = type(target) == "string" and (target == "cpu" or target:match("^cuda"))
    opts = device and { device = target } or { dtype = target }
  end
  flow._check_opts("Module:to", opts, { "device", "dtype" })
  if opts.dtype ~= nil then -- its canonical name, through an empty tensor (which names what it accepts)
    local ok, probe = pcall(flow.zeros, { 0 }, { dtype = opts.dtype })
    if not ok then error("Module:to: " .. tostring(probe):gsub("^.-zeros: ", ""), 2) end
    if not FLOATS[probe.dtype] then
      error(("Module:to: expected a floating-point dtype, as torch's Module.to (got %s)"):format(probe.dtype), 2)
    end
  end
  local moved = {}
  each_parameter(self, "", function(owner, k, _, t)
    local m = moved[t]
    if not m then
      m = t:to({ device = opts.device, dtype = FLOATS[t.dtype] and opts.dtype or nil, requires_grad = t.requires_grad })
      moved[t] = m
    end
    rawset(owner, k, m)
  end)
  return self
end

-- Replace parameters by map[t] wherever they appear (tied ones stay tied); returns a function
-- that puts the previous ones back. nn.Graph uses it (ZeRO-3 shards the parameters, and its
-- trace gathers them before use).
function Module:swap_parameters(map)
  local undo = {}
  each_parameter(self, "", function(owner, k, _, t)
    local new = map[t]
    if new ~= nil then
      undo[#undo + 1] = { owner, k, t }
      rawset(owner, k, new)
    end
  end)
  return function()
    for i = #undo, 1, -1 do rawset(undo[i][1], undo[i][2], undo[i][3]) end
  end
end

-- Make every parameter a global tensor on placement with sbp (data parallel: sbp = broadcast).
-- Every parameter becomes a global leaf on `placement`. `sbp` is one SBP (list) for all, or a
-- function (name, tensor) -> SBP choosing per parameter (tensor parallel layouts). A tensor
-- shared by several modules stays shared.
function Module:to_global(placement, sbp)
  local done = {}
  each_parameter(self, "", function(owner, k, name, t)
    if not t.to_global then error("to_global: global tensors are not available in this build (parameter '" .. name .. "')", 0) end
    local g = done[t]
    if not g then
      local s = type(sbp) == "function" and sbp(name, t) or sbp
      -- a local tensor given to to_global is this rank's shard: make the whole tensor global
      -- first (broadcast, taken from rank 0), then lay it out as asked
      local whole = flow.sbp.broadcast
      if type(s) == "table" then
        whole = {}
        for i = 1, #s do whole[i] = flow.sbp.broadcast end
      end
      g = flow.no_grad(function() return t:to_global(placement, whole):to_global(placement, s) end):detach()
      g:requires_grad_(true)
      done[t] = g
    end
    rawset(owner, k, g)
  end)
  return self
end

-- A leaf parameter with the given values (built without recording autograd).
function nn.Parameter(t)
  local p = t:detach()
  p:requires_grad_(true)
  return p
end

-- In-place re-initialisations used by the modules and by GPT's init.
nn.init = {}
function nn.init.normal_(t, mean, std)
  flow.no_grad(function() t:copy_(flow.randn(t:shape(), { dtype = t.dtype }) * (std or 1) + (mean or 0)) end)
  return t
end
function nn.init.uniform_(t, a, b)
  flow.no_grad(function() t:copy_(flow.rand(t:shape(), { dtype = t.dtype }) * (b - a) + a) end)
  return t
end
function nn.init.zeros_(t) flow.no_grad(function() t:zero_() end) return t end
function nn.init.ones_(t) flow.no_grad(function() t:fill_(1) end) return t end

-------------------------------------------------------------------------------- layers

-- y = x W^T + b with W [out, in]; PyTorch's default init U(-1/sqrt(in), 1/sqrt(in)).
-- Sizes of a layer's parameter matrix: non-negative integers whose product fits in an integer, so a
-- bad size fails here, naming the layer, instead of deep inside the op that makes the matrix.
-- A layer's constructor arguments, checked before any parameter is made, so that errors name the
-- layer: sizes are integers >= min (0 unless given), their product fits, opts is a table or nil.
local function check_size(layer, name, v, min)
  min = min or 0
  if math.type(v) ~= "integer" or v < min then
    error(("%s: %s must be %s integer (got %s)"):format(layer, name, min == 0 and "a non-negative" or "a positive",
      tostring(v)), 0)
  end
end

local function check_numel(layer, dims)
  local n = 1
  for _, d in ipairs(dims) do
    if d ~= 0 and n > math.maxinteger // d then
      error(("%s: a parameter of shape {%s} has too many elements"):format(layer, table.concat(dims, ",")), 0)
    end
    n = n * d
  end
end

-- the options a layer hands to the tensor constructors
local TENSOR_OPTS = { "dtype", "device", "requires_grad", "placement", "sbp" }

local function check_opts(layer, opts, keys)
  if opts ~= nil and type(opts) ~= "table" then
    error(("%s: options must be a table (got %s)"):format(layer, type(opts)), 0)
  end
  flow._check_opts(layer, opts, keys or TENSOR_OPTS)
end

local function check_sizes(layer, a, an, b, bn)
  check_size(layer, an, a)
  check_size(layer, bn, b)
  check_numel(layer, { b, a })
end

local Linear = nn.class("Linear", Module)
nn.Linear = Linear
function Linear:__init(in_features, out_features, bias, opts)
  if type(bias) == "table" then
    local t = bias
    opts, bias = {}, t.bias
    for k, v in pairs(t) do if k ~= "bias" then opts[k] = v end end
  end
  check_opts("nn.Linear", opts)
  opts = opts or {}
  check_sizes("nn.Linear", in_features, "in_features", out_features, "out_features")
  self.in_features, self.out_features = in_features, out_features
  local bound = 1 / math.sqrt(in_features)
  self.weight = nn.Parameter(nn.init.uniform_(flow.zeros({ out_features, in_features }, opts), -bound, bound))
  if bias ~= false then
    self.bias = nn.Parameter(nn.init.uniform_(flow.zeros({ out_features }, opts), -bound, bound))
  end
end
Linear.__init = flow._named("nn.Linear", Linear.__init) -- errors making its parameters name the layer
function Linear:forward(x) return F.linear(x, self.weight, self.bias) end
function Linear:__repr() return ("Linear(%d -> %d%s)"):format(self.in_features, self.out_features, self.bias and "" or ", no bias") end

local Embedding = nn.class("Embedding", Module)
nn.Embedding = Embedding
function Embedding:__init(num, dim, opts)
  check_sizes("nn.Embedding", num, "num_embeddings", dim, "embedding_dim")
  check_opts("nn.Embedding", opts)
  self.num_embeddings, self.embedding_dim = num, dim
  self.weight = nn.Parameter(flow.randn({ num, dim }, opts))
end
Embedding.__init = flow._named("nn.Embedding", Embedding.__init) -- errors making its parameters name the layer
function Embedding:forward(ids) return F.embedding(ids, self.weight) end
function Embedding:__repr() return ("Embedding(%d, %d)"):format(self.num_embeddings, self.embedding_dim) end

local LayerNorm = nn.class("LayerNorm", Module)
nn.LayerNorm = LayerNorm
function LayerNorm:__init(dim, eps, opts)
  check_size("nn.LayerNorm", "normalized_shape", dim)
  if eps ~= nil and type(eps) ~= "number" then
    error(("nn.LayerNorm: eps must be a number (got %s)"):format(type(eps)), 0)
  end
  check_opts("nn.LayerNorm", opts)
  self.dim, self.eps = dim, eps or 1e-5
  self.weight = nn.Parameter(flow.ones({ dim }, opts))
  self.bias = nn.Parameter(flow.zeros({ dim }, opts))
end
LayerNorm.__init = flow._named("nn.LayerNorm", LayerNorm.__init) -- errors making its parameters name the layer
function LayerNorm:forward(x) return F.layer_norm(x, self.weight, self.bias, self.eps) end
function LayerNorm:__repr() return ("LayerNorm(%d, eps=%g)"):format(self.dim, self.eps) end

local GELU = nn.class("GELU", Module)
nn.GELU = GELU
-- GELU(approximate = "none" | "tanh")
function GELU:__init(approximate) self.approximate = approximate or "none" end
function GELU:forward(x) return F.gelu(x, { approximate = self.approximate }) end

local ReLU = nn.class("ReLU", Module)
nn.ReLU = ReLU
function ReLU:forward(x) return F.relu(x) end

local Hardtanh = nn.class("Hardtanh", Module)
nn.Hardtanh = Hardtanh
-- Hardtanh(min_val = -1, max_val = 1)
function Hardtanh:__init(min_val, max_val)
  self.min_val, self.max_val = min_val or -1, max_val or 1
end
function Hardtanh:forward(x) return F.hardtanh(x, self.min_val, self.max_val) end
function Hardtanh:__repr() return ("Hardtanh(min_val=%g, max_val=%g)"):format(self.min_val, self.max_val) end

local ReLU6 = nn.class("ReLU6", Module)
nn.ReLU6 = ReLU6
function ReLU6:forward(x) return F.relu6(x) end

local Dropout = nn.class("Dropout", Module)
nn.Dropout = Dropout
function Dropout:__init(p) self.p = p or 0.5 end
function Dropout:forward(x) return F.dropout(x, self.p, self.training) end
function Dropout:__repr() return ("Dropout(p=%g)"):format(self.p) end

-- A list of modules, indexed 1..n in Lua and named "0".."n-1" in state_dict keys.
local ModuleList = nn.class("ModuleList", Module)
nn.ModuleList = ModuleList
function ModuleList:__init(mods)
  for _, m in ipairs(mods or {}) do self:append(m) end
end
function ModuleList:append(m)
  self[#self + 1] = m
  return self
end
function ModuleList:forward() error("ModuleList: has no forward; iterate over it", 2) end

local Sequential = nn.class("Sequential", ModuleList)
nn.Sequential = Sequential
function Sequential:__init(...)
  for _, m in ipairs({ ... }) do self:append(m) end
end
function Sequential:forward(x)
  for i = 1, #self._order do x = self[i](x) end
  return x
end

-- The transformer MLP: Linear(d, hidden) -> GELU (tanh form, as GPT-2) -> Linear(hidden, d) -> Dropout.
local MLP = nn.class("MLP", Module)
nn.MLP = MLP
function MLP:__init(dim, hidden, dropout, opts)
  hidden = hidden or 4 * dim
  self.c_fc = Linear(dim, hidden, true, opts)
  self.c_proj = Linear(hidden, dim, true, opts)
  self.dropout = Dropout(dropout or 0)
end
function MLP:forward(x) return self.dropout(self.c_proj(F.gelu(self.c_fc(x), { approximate = "tanh" }))) end

-- Multi-head causal self-attention: one fused qkv projection, heads as [B, H, T, D].
local CausalSelfAttention = nn.class("CausalSelfAttention", Module)
nn.CausalSelfAttention = CausalSelfAttention
function CausalSelfAttention:__init(dim, heads, dropout, opts)
  if dim % heads ~= 0 then
    error(("CausalSelfAttention: dim %d is not divisible by heads %d"):format(dim, heads), 3)
  end
  self.dim, self.heads = dim, heads
  self.c_attn = Linear(dim, 3 * dim, true, opts)
  self.c_proj = Linear(dim, dim, true, opts)
  self.dropout = Dropout(dropout or 0)
end
function CausalSelfAttention:forward(x)
  local s = x:shape()
  local B, T, C = s[1], s[2], s[3]
  local H = self.heads
  local D = C // H
  local qkv = flow.split(self.c_attn(x), C, 2)
  local function heads(t) return flow.transpose(flow.reshape(t, { B, T, H, D }), 1, 2) end
  local y = F.scaled_dot_product_attention(heads(qkv[1]), heads(qkv[2]), heads(qkv[3]), { causal = true })
  y = flow.reshape(flow.contiguous(flow.transpose(y, 1, 2)), { B, T, C })
  return self.dropout(self.c_proj(y))
end

-- Convolution, pooling and batch norm over NCHW images (flow.conv2d, flow.*_pool2d, flow.batch_norm).
local function pair(v) return type(v) == "table" and v or { v, v } end

local Conv2d = nn.class("Conv2d", Module)
nn.Conv2d = Conv2d
-- opts: stride, padding, dilation, groups, bias (default true), dtype, device.
function Conv2d:__init(in_channels, out_channels, kernel_size, opts)
  check_opts("nn.Conv2d", opts, { "stride", "padding", "dilation", "groups", "bias", "dtype", "device" })
  opts = opts or {}
  local k = pair(kernel_size)
  check_size("nn.Conv2d", "in_channels", in_channels, 1)
  check_size("nn.Conv2d", "out_channels", out_channels, 1)
  check_size("nn.Conv2d", "kernel_size[1]", k[1], 1)
  check_size("nn.Conv2d", "kernel_size[2]", k[2], 1)
  local groups = opts.groups or 1
  check_size("nn.Conv2d", "groups", groups, 1)
  if in_channels % groups ~= 0 or out_channels % groups ~= 0 then
    error(("nn.Conv2d: groups (%d) must divide in_channels (%d) and out_channels (%d)"):format(groups, in_channels,
      out_channels), 0)
  end
  check_numel("nn.Conv2d", { out_channels, in_channels // groups, k[1], k[2] })
  self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, k
  self.stride, self.padding = opts.stride or 1, opts.padding or 0
  self.dilation, self.groups = opts.dilation or 1, opts.groups or 1
  local topts = { dtype = opts.dtype, device = opts.device }
  local bound = 1 / math.sqrt(in_channels // self.groups * k[1] * k[2])
  self.weight = nn.Parameter(nn.init.uniform_(
    flow.zeros({ out_channels, in_channels // self.groups, k[1], k[2] }, topts), -bound, bound))
  if opts.bias ~= false then
    self.bias = nn.Parameter(nn.init.uniform_(flow.zeros({ out_channels }, topts), -bound, bound))
  end
end
Conv2d.__init = flow._named("nn.Conv2d", Conv2d.__init)
function Conv2d:forward(x)
  return flow.conv2d(x, self.weight, self.bias,
    { stride = self.stride, padding = self.padding, dilation = self.dilation, groups = self.groups })
end
function Conv2d:__repr()
  return ("Conv2d(%d -> %d, kernel %dx%d)"):format(self.in_channels, self.out_channels, self.kernel_size[1],
    self.kernel_size[2])
end

local MaxPool2d = nn.class("MaxPool2d", Module)
nn.MaxPool2d = MaxPool2d
-- stride defaults to the kernel size.
function MaxPool2d:__init(kernel_size, stride, padding)
  self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding or 0
end
function MaxPool2d:forward(x)
  return flow.max_pool2d(x, { kernel = self.kernel_size, stride = self.stride, padding = self.padding })
end

local AvgPool2d = nn.class("AvgPool2d", Module)
nn.AvgPool2d = AvgPool2d
function AvgPool2d:__init(kernel_size, stride, padding)
  self.kernel_size, self.stride, self.padding = kernel_size, stride or kernel_size, padding or 0
end
function AvgPool2d:forward(x)
  return flow.avg_pool2d(x, { kernel = self.kernel_size, stride = self.stride, padding = self.padding })
end

local BatchNorm2d = nn.class("BatchNorm2d", Module)
nn.BatchNorm2d = BatchNorm2d
-- opts: eps (1e-5), momentum (0.1), dtype, device. running_mean/running_var are plain tensors (not
-- parameters), updated in place by forward in training mode.
function BatchNorm2d:__init(num_features, opts)
  opts = opts or {}
  local topts = { dtype = opts.dtype, device = opts.device }
  self.num_features, self.eps, self.momentum = num_features, opts.eps or 1e-5, opts.momentum or 0.1
  self.weight = nn.Parameter(flow.ones({ num_features }, topts))
  self.bias = nn.Parameter(flow.zeros({ num_features }, topts))
  self.running_mean = flow.zeros({ num_features }, topts)
  self.running_var = flow.ones({ num_features }, topts)
end
function BatchNorm2d:forward(x)
  return flow.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
    { training = self.training, momentum = self.momentum, eps = self.eps })
end
function BatchNorm2d:__repr() return ("BatchNorm2d(%d, eps=%g)"):format(self.num_features, self.eps) end

-- Lazy mode: flow.nn.Graph {model=, optimizer=, build=, config=} (lua/flow/graph.lua)
function nn.Graph(opts) return require("flow.graph").new(opts) end

return nn
