-- flow.parallel: model-parallel compositions that fall out of the SBP op rules, with no
-- communication code of their own (every collective is a boxing the ops ask for).
local flow = require "flow"

local parallel = {}

local function sbp_list(t)
  local s = t.sbp
  if s == nil then return nil end
  if s.kind then return { s } end
  return s
end

-- The class axis of cross-entropy logits, as PyTorch: 0 of [C], else 1 of [N, C, d1, ...].
local function class_axis(t) return #t:shape() == 1 and 0 or 1 end

-- Is t global with its class axis split on some mesh axis?
function parallel.class_axis_split(t)
  local list = flow.is_tensor(t) and sbp_list(t)
  if not list then return false end
  local axis = class_axis(t)
  for _, s in ipairs(list) do
    if s.kind == "split" and s.axis == axis then return true end
  end
  return false
end

-- [N, C, d1, ..., dk] viewed as [N, d1, ..., dk, C]
local function class_axis_last(t)
  local n = #t:shape()
  if n <= 2 then return t end
  local dims = { 0 }
  for i = 2, n - 1 do dims[#dims + 1] = i end
  dims[#dims + 1] = 1
  return flow.permute(t, dims)
end

local function one(list) return #list == 1 and list[1] or list end

-- Cross-entropy of logits split on the class axis (Megatron's vocab-parallel loss, as
-- OneFlow's split_sparse_softmax_cross_entropy pass does it, here from the op rules):
--   m    = max over the local classes, then the max of the p small maxes (an all-gather of [..., p]);
--          a constant shift (no gradient: the loss does not depend on it)
--   lse  = log(sum(exp(x - m))): the sum over the split axis is partial, boxed to broadcast for log
--   x_t  = the target's shifted logit, picked where it lives: (x - m) * onehot summed -> partial
--   loss = lse - x_t per row, 0 where target == ignore_index; then none / sum / mean over the rows
-- Logits and target in PyTorch's layout, as flow.cross_entropy ([N, C, d1, ...] is viewed as
-- [N, d1, ..., C] first, so "per row" below is per class vector).
-- opts as flow.cross_entropy: {ignore_index = -100, reduction = "mean" | "sum" | "none"}.
function parallel.cross_entropy(logits, target, opts)
  opts = opts or {}
  local ignore = opts.ignore_index or -100
  local reduction = opts.reduction or "mean"
  if reduction ~= "mean" and reduction ~= "sum" and reduction ~= "none" then
    error(("cross_entropy: reduction must be \"mean\", \"sum\" or \"none\" (got %s)"):format(tostring(reduction)), 2)
  end
  if not flow.is_tensor(target) or target.dtype ~= "int64" then
    error("cross_entropy: target must be an int64 tensor", 2)
  end
  logits = class_axis_last(logits)
  local place, list = logits.placement, sbp_list(logits)
  local shape = logits:shape()
  local last, C = #shape - 1, shape[#shape]
  -- targets outside [0, C) are an error as on one rank (no rank would pick them). A graph has no
  -- data while tracing: there the check is left out (see the note on nn.Graph in the README).
  local bad = flow._graph.tracing() and 0 or flow.no_grad(function()
    return flow.sum((flow.lt(target, 0):long() + flow.ge(target, C):long()) * flow.ne(target, ignore):long()):item()
  end)
  if bad > 0 then
    for _, v in ipairs(flow.flatten(target):totable()) do
      if v ~= ignore and (v < 0 or v >= C) then
        error(("cross_entropy: target %d is out of range for %d classes (expected 0 <= target < %d, or ignore_index %d)")
          :format(v, C, C, ignore), 2)
      end
    end
  end
  -- partial sums on other mesh axes are summed first (max and exp are not linear)
  local whole, has_p = {}, false
  for i, s in ipairs(list) do
    if s.kind == "partial_sum" then has_p = true; whole[i] = flow.sbp.broadcast else whole[i] = s end
  end
  if has_p then logits = logits:to_global(place, one(whole)) end
  local m = flow.no_grad(function()
    local mine = logits:detach():to_local()
    local shape = mine:shape()
    local local_max
    if shape[#shape] == 0 then -- a rank outside the placement (a pipeline stage it is not in) holds nothing
      shape[#shape] = 1
      local_max = flow.zeros(shape, { dtype = mine.dtype, device = mine.device })
    else
      local_max = flow.max(mine, -1, true)
    end
    return flow.max(local_max:to_global(place, one(whole)), -1, true)
  end)
  local z = logits - m
  local lse = flow.log(flow.sum(flow.exp(z), -1))
  -- class ids [C], split like the logits' class axis: this rank's shard holds its own classes
  local csbp, all_b = {}, {}
  for i, s in ipairs(whole) do
    csbp[i] = (s.kind == "split" and s.axis == last) and flow.sbp.split(0) or flow.sbp.broadcast
    all_b[i] = flow.sbp.broadcast
  end
  local classes = flow.arange(0, C, 1, { dtype = "int64" }):to_global(place, one(all_b)):to_global(place, one(csbp))
  local onehot = flow.eq(classes, flow.unsqueeze(target, -1)):cast(logits.dtype)
  local picked = flow.sum(z * onehot, -1)
  local valid = flow.ne(target, ignore):cast(logits.dtype)
  local loss = (lse - picked) * valid
  if reduction == "none" then return loss end
  if reduction == "sum" then return flow.sum(loss) end
  return flow.sum(loss) / flow.sum(valid)
end

return parallel
