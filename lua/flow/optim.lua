-- flow.optim: optimizers (SGD, Adam, AdamW), gradient clipping and learning-rate schedules.
-- Updates run under flow.no_grad and write parameters in place, so the model keeps its tensors.
local flow = require "flow"

local optim = {}

-------------------------------------------------------------------------------- Optimizer

-- Parameters come as a list of tensors, or as a list of groups {params = {...}, <option> = ...}
-- whose options override the optimizer's. Per-parameter state is keyed by the position of the
-- parameter in the flattened list, which is what state_dict() names ("m.3", "v.3", ...).
local Optimizer = {}
Optimizer.__index = Optimizer
optim.Optimizer = Optimizer

local function new_optimizer(cls, name, params, opts, defaults)
  if type(params) ~= "table" or #params == 0 then error(name .. ": expected a non-empty list of parameters or groups", 3) end
  local self = setmetatable({ name = name, groups = {}, state = {}, step_count = 0 }, cls)
  local groups = flow.is_tensor(params[1]) and { { params = params } } or params
  local index = 0
  for gi, g in ipairs(groups) do
    local group = { params = {}, first = index + 1, index = gi }
    for k, v in pairs(defaults) do group[k] = v end
    for k, v in pairs(opts or {}) do group[k] = v end
    for k, v in pairs(g) do if k ~= "params" then group[k] = v end end
    for pi, p in ipairs(g.params or error(("%s: group %d has no params list"):format(name, gi), 3)) do
      if not flow.is_tensor(p) then error(("%s: group %d, parameter %d is a %s, not a tensor"):format(name, gi, pi, type(p)), 3) end
      index = index + 1
      group.params[pi] = p
    end
    self.groups[gi] = group
  end
  self.nparams = index
  return self
end

-- Every parameter with its flat index and its group.
function Optimizer:each()
  local gi, pi = 1, 0
  return function()
    while self.groups[gi] do
      pi = pi + 1
      local g = self.groups[gi]
      if g.params[pi] then return g.first + pi - 1, g.params[pi], g end
      gi, pi = gi + 1, 0
    end
  end
end

function Optimizer:zero_grad()
  for _, p in self:each() do p.grad = nil end
end

-- Replace parameters by map[p] (their state stays: it is keyed by position).
function Optimizer:swap_parameters(map)
  for _, g in ipairs(self.groups) do
    for i, p in ipairs(g.params) do g.params[i] = map[p] or p end
  end
end

-- Set the learning rate of every group (what a schedule calls once per step).
function Optimizer:set_lr(lr)
  for _, g in ipairs(self.groups) do g.lr = lr end
end

function Optimizer:step()
  self.step_count = self.step_count + 1
  self:apply()
end

-- The updates of one step, with step_count already advanced. on_group(gi), when given, is told
-- whose updates follow: nn.Graph tags them so that their lr and step are fed at each run.
function Optimizer:apply(on_group)
  flow.no_grad(function()
    for i, p, g in self:each() do
      if on_group then on_group(g.index) end
      local grad = p.grad
      if grad then self:update(i, p, grad, g) end
    end
  end)
end

-- Create every state buffer now (zeros), as a graph needs: it reads and writes the optimizer's
-- state in place, so the state must exist before the trace.
function Optimizer:init_state()
  for i, p, g in self:each() do
    for _, key in ipairs(self:state_keys(g)) do self:buffer(i, key, p) end
  end
end

function Optimizer:state_keys() return {} end

-- A state tensor for parameter i, zeros of p's shape on first use.
function Optimizer:buffer(i, key, p)
  local s = self.state[i]
  if not s then s = {}; self.state[i] = s end
  if not s[key] then s[key] = flow.zeros_like(p) end
  return s[key]
end

-- Flat table for flow.save: "step" and "<buffer>.<i>" tensors (1-based flat parameter index).
function Optimizer:state_dict()
  local sd = { step = self.step_count }
  for i, s in pairs(self.state) do
    for k, t in pairs(s) do sd[k .. "." .. i] = t end
  end
  return sd
end

function Optimizer:load_state_dict(sd)
  local step = math.tointeger(sd.step)
  if not step then error(self.name .. ".load_state_dict: the state has no integer 'step'", 2) end
  local params = {}
  for i, p in self:each() do params[i] = p end
  local state = {}
  local keys = {} -- in one order on every rank: laying state out on global parameters is collective
  for k in pairs(sd) do keys[#keys + 1] = tostring(k) end
  table.sort(keys)
  for _, k in ipairs(keys) do
    local t = sd[k]
    local key, i = k:match("^(.+)%.(%d+)$")
    if key and flow.is_tensor(t) then
      i = tonumber(i)
      local p = params[i]
      if not p then error(("%s.load_state_dict: '%s' refers to parameter %d but there are %d"):format(self.name, k, i, self.nparams), 2) end
      local ps, ts = table.concat(p:shape(), ","), table.concat(t:shape(), ",")
      if ps ~= ts then error(("%s.load_state_dict: '%s' has shape {%s}, parameter %d has {%s}"):format(self.name, k, ts, i, ps), 2) end
      state[i] = state[i] or {}
      local copy = flow.tensor(t, { dtype = p.dtype }) -- a private copy: updates write in place
      if copy.device ~= p.device then copy = copy:to(p.device) end
      if p.is_global then -- the whole value on every rank, laid out as its parameter
        copy = copy:to_global(p.placement, optim.broadcast_sbp(p.placement)):to_global(p.placement, p.sbp)
      end
      state[i][key] = copy
    end
  end
  self.state, self.step_count = state, step
end

-------------------------------------------------------------------------------- SGD

-- PyTorch's SGD: g += wd*p; buf = momentum*buf + (1-dampening)*g (buf = g on the first step);
-- g = g + momentum*buf (nesterov) or buf; p -= lr*g.
local SGD = setmetatable({}, { __index = Optimizer })
SGD.__index = SGD
function optim.SGD(params, opts)
  local self = new_optimizer(SGD, "SGD", params, opts, { lr = 1e-3, momentum = 0, dampening = 0, nesterov = false, weight_decay = 0 })
  for _, g in ipairs(self.groups) do
    if g.nesterov and (g.momentum <= 0 or g.dampening ~= 0) then error("SGD: nesterov needs momentum > 0 and dampening 0", 2) end
  end
  return self
end

function SGD:state_keys(g) return g.momentum ~= 0 and { "momentum_buffer" } or {} end

function SGD:update(i, p, grad, g)
  if g.weight_decay ~= 0 then grad = grad + p * g.weight_decay end
  if g.momentum ~= 0 then
    local s = self.state[i]
    local buf = s and s.momentum_buffer
    if not buf then
      buf = self:buffer(i, "momentum_buffer", p)
      buf:copy_(grad)
    else
      buf:mul_(g.momentum)
      buf:add_(grad * (1 - g.dampening))
    end
    grad = g.nesterov and grad + buf * g.momentum or buf
  end
  p:add_(grad * -g.lr)
end

-------------------------------------------------------------------------------- Adam, AdamW

-- Both run the fused flow.adamw_ kernel: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
-- p -= lr (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd p). Adam's weight decay is L2 instead
-- (added to the gradient), so it calls the same kernel with the decay folded into g.
local Adam = setmetatable({}, { __index = Optimizer })
Adam.__index = Adam
local AdamW = setmetatable({}, { __index = Optimizer })
AdamW.__index = AdamW

local function adam_defaults(wd) return { lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = wd } end

-- opts.betas = {b1, b2} is accepted as in PyTorch.
local function unpack_betas(opts)
  if opts and opts.betas then
    local o = {}
    for k, v in pairs(opts) do o[k] = v end
    o.beta1, o.beta2, o.betas = opts.betas[1], opts.betas[2], nil
    return o
  end
  return opts
end

function optim.Adam(params, opts) return new_optimizer(Adam, "Adam", params, unpack_betas(opts), adam_defaults(0)) end
function optim.AdamW(params, opts) return new_optimizer(AdamW, "AdamW", params, unpack_betas(opts), adam_defaults(0.01)) end

local function adam_update(self, i, p, grad, g, decoupled)
  local m, v = self:buffer(i, "m", p), self:buffer(i, "v", p)
  local wd = g.weight_decay
  if not decoupled and wd ~= 0 then grad, wd = grad + p * wd, 0 end
  flow.adamw_(p, grad, m, v, { lr = g.lr, beta1 = g.beta1, beta2 = g.beta2, eps = g.eps, weight_decay = wd, step = self.step_count })
end

function Adam:update(i, p, grad, g) adam_update(self, i, p, grad, g, false) end
function AdamW:update(i, p, grad, g) adam_update(self, i, p, grad, g, true) end
-- adamw_ reads lr and step from its attrs: a graph feeds them at each run
Adam.fed_lr, AdamW.fed_lr = true, true
function Adam:state_keys() return { "m", "v" } end
AdamW.state_keys = Adam.state_keys

-------------------------------------------------------------------------------- clipping, schedules

-- Scale all gradients so their global L2 norm is at most max_norm; returns the norm before. The
-- norm stays a tensor until the end (in a graph it is one: the scale is min(1, max_norm / norm)
-- computed on the device, never read back), and is returned as a number for real tensors.
function optim.clip_grad_norm(params, max_norm)
  local grads = {}
  for _, p in ipairs(params) do
    if p.grad then grads[#grads + 1] = p.grad end
  end
  return optim.clip_grads(grads, max_norm)
end

-- Broadcast on every axis of a placement's mesh (one SBP, or a list for a 2-D mesh).
function optim.broadcast_sbp(placement)
  if #placement.shape == 1 then return flow.sbp.broadcast end
  local b = {}
  for i = 1, #placement.shape do b[i] = flow.sbp.broadcast end
  return b
end

-- A 0-d global t moved (broadcast) to where `like` lives, when that is another placement
-- (gradients of pipeline stages live on different placements).
local function beside(t, like)
  if not (t.is_global and like.is_global) or t.placement == like.placement then return t end
  return t:to_global(like.placement, optim.broadcast_sbp(like.placement))
end

-- clip_grad_norm on a list of gradient tensors (scaled in place).
-- Gradients on several placements (pipeline stages) are summed per placement first, so one
-- partial norm and one coefficient cross between placements, not one per gradient.
function optim.clip_grads(grads, max_norm)
  local total
  flow.no_grad(function()
    local order, sums = {}, {}
    for _, g in ipairs(grads) do
      local key = g.is_global and tostring(g.placement) or ""
      local gf = g.dtype == "float64" and g or g:cast("float64")
      local sq = flow.sum(gf * gf)
      if not sums[key] then order[#order + 1] = key end
      sums[key] = sums[key] and sums[key] + sq or sq
    end
    for _, key in ipairs(order) do total = total and total + beside(sums[key], total) or sums[key] end
    if not total then return end
    total = flow.sqrt(total)
    local coef = flow.clamp(max_norm / (total + 1e-6), nil, 1)
    local moved = {}
    for _, g in ipairs(grads) do
      local key = g.is_global and tostring(g.placement) or ""
      moved[key] = moved[key] or beside(coef, g)
      local c = moved[key]
      g:mul_(g.dtype == "float64" and c or c:cast(g.dtype))
    end
  end)
  if not total then return 0 end
  return flow._graph.tracing() and total or total:item()
end

-- Linear warmup over `warmup` steps to lr, then cosine decay to min_lr at `steps` (llm.c's
-- schedule). Steps count from 0: step 0 gets lr/warmup. Returns lr_at(step).
function optim.cosine_schedule(o)
  local lr, min_lr, warmup, total = o.lr, o.min_lr or 0, o.warmup or 0, o.steps
  assert(lr and total, "cosine_schedule: needs lr and steps")
  return function(step)
    if step < warmup then return lr * (step + 1) / warmup end
    if step >= total then return min_lr end
    local ratio = (step - warmup) / math.max(1, total - warmup)
    return min_lr + 0.5 * (1 + math.cos(math.pi * ratio)) * (lr - min_lr)
  end
end

return optim
