-- flow.nn.Graph: lazy mode (DESIGN.md section 6). The first call of a graph traces `build` with
-- lazy tensors: every op appends a node instead of running (the eager-global interpreter has
-- already chosen SBP signatures and inserted boxings, so the graph is this rank's physical
-- program). loss:backward() inside build runs the registered gradient rules on lazy tensors
-- (the autograd pass), then the optimizer's updates are traced (the optimizer pass: lr and step
-- are fed at each run), the dead-node pass prunes, and the plan is compiled: tasks on compute,
-- collective and copy streams, registers with register_num credits, memory packed by lifetime.
-- Later calls with the same input signature only run the plan on the actor runtime.
--
--   local G = flow.nn.Graph { model = model, optimizer = opt, clip_grad_norm = 1.0,
--     build = function(self, x, y) local _, loss = self.model(x, y); loss:backward(); return loss end }
--   local loss = G(x, y)          -- forward, backward and update, in one step
--
-- Parameters and optimizer state are the eager module's and optimizer's own tensors (read and
-- written in place), so eager code sees what the graph trained, and the reverse.
local flow = require "flow"

local M = {}
local Graph = {}
Graph.__index = Graph

local options = { model = "table", optimizer = "table", lr_scheduler = "function", clip_grad_norm = "number",
                  build = "function", config = "table" }
local config_options = { register_num = "number", debug = "number", grad_accumulation_steps = "number", amp = "string",
                         allow_fuse_add_to_output = "boolean", zero_stage = "number", pipeline_buffer = "number" }

local function check_options(t, known, what)
  for k, v in pairs(t) do
    local want = known[k]
    if not want then
      local names = {}
      for name in pairs(known) do names[#names + 1] = name end
      table.sort(names)
      error(("%s: unknown option '%s' (expected one of: %s)"):format(what, tostring(k), table.concat(names, ", ")), 3)
    end
    if type(v) ~= want then error(("%s: option '%s' must be a %s (got %s)"):format(what, k, want, type(v)), 3) end
  end
end

function M.new(opts)
  if type(opts) ~= "table" then error("nn.Graph: expected an options table {model=, optimizer=, build=, config=}", 2) end
  check_options(opts, options, "nn.Graph")
  if not opts.build then error("nn.Graph: needs build = function(self, ...) ... end (the step to trace)", 2) end
  local config = opts.config or {}
  check_options(config, config_options, "nn.Graph config")
  local rn = config.register_num or 1
  if rn < 1 or math.type(rn) ~= "integer" then error(("nn.Graph config: register_num must be an integer >= 1 (got %s)"):format(rn), 2) end
  local acc = config.grad_accumulation_steps or 1
  if math.type(acc) ~= "integer" or acc < 1 then
    error(("nn.Graph config: grad_accumulation_steps must be an integer >= 1 (got %s)"):format(tostring(acc)), 2)
  end
  local zero = config.zero_stage or 0
  if math.type(zero) ~= "integer" or zero < 0 or zero > 3 then
    error(("nn.Graph config: zero_stage must be 0, 1, 2 or 3 (got %s)"):format(tostring(zero)), 2)
  end
  local buffer = config.pipeline_buffer
  if buffer and (math.type(buffer) ~= "integer" or buffer < 1) then
    error(("nn.Graph config: pipeline_buffer must be an integer >= 1 (got %s)"):format(tostring(buffer)), 2)
  end
  if zero > 0 and not opts.optimizer then error("nn.Graph config: zero_stage needs an optimizer", 2) end
  if config.amp and config.amp ~= "bf16" and config.amp ~= "off" then
    error(("nn.Graph config: amp must be \"bf16\" or \"off\" (got %q)"):format(config.amp), 2)
  end
  local self = setmetatable({
    model = opts.model, optimizer = opts.optimizer, lr_scheduler = opts.lr_scheduler, clip = opts.clip_grad_norm,
    build = opts.build, config = config, register_num = rn, accumulation = acc, plans = {}, compiles = 0, last = nil,
  }, Graph)
  return self
end

-- The input signature a plan is compiled for: shapes, dtypes, devices, placements and SBP. An
-- optimizer whose lr is not fed (SGD folds it into its arithmetic) adds its lrs.
local function signature(self, args)
  local parts = {}
  for i = 1, args.n do
    local a = args[i]
    if flow.is_tensor(a) then
      local s = ("%s:%s:%s"):format(table.concat(a:shape(), "x"), a.dtype, a.device)
      if a.is_global then s = s .. ":" .. tostring(a.placement) .. ":" .. tostring(a.sbp) end
      parts[i] = s
    else
      parts[i] = type(a) .. ":" .. tostring(a)
    end
  end
  local opt = self.optimizer
  if opt and not opt.fed_lr then
    for _, g in ipairs(opt.groups) do parts[#parts + 1] = "lr=" .. tostring(g.lr) end
  end
  return table.concat(parts, "|")
end

local function params_of(self)
  if self.model then return self.model:parameters() end
  local out = {}
  if self.optimizer then for _, p in self.optimizer:each() do out[#out + 1] = p end end
  return out
end

-- Micro-batches (config.grad_accumulation_steps = M) are the pieces of a run, as OneFlow's unpack,
-- repeat and acc actors: the step is traced once, for one micro-batch; each input is unpacked
-- along axis 0 into M pieces (a tensor split over ranks on axis 0 shard by shard, so no data
-- moves); the variables are the same tensors at every piece; each backward is seeded with 1/M and
-- every leaf gradient is accumulated over the pieces (acc nodes), so the optimizer pass, traced in
-- the step phase, runs once per run on the whole batch's gradient. Outputs are averaged.
local function check_micro_batches(t, i, M)
  local s = t:shape()
  if #s == 0 then error(("nn.Graph: grad_accumulation_steps needs batch tensors (axis 0); input %d is 0-d"):format(i), 0) end
  local ways = flow._split_ways(t, 0)
  local rows = s[1] // ways
  if s[1] % ways ~= 0 or rows % M ~= 0 then
    error(("nn.Graph: grad_accumulation_steps = %d does not divide the batch: %d rows%s"):format(M, s[1],
      ways > 1 and (" split over %d ranks (%d each)"):format(ways, rows) or ""), 0)
  end
end

-- Trace the step: build on the (micro-batch) inputs, then, with pieces, the deferred backward in
-- the backward phase, the accumulation, and the step phase for what follows (the optimizer pass).
function Graph:_trace_step(g, lazy, n, params)
  local M = self.accumulation
  local function amp(fn, ...)
    if self.config.amp == "bf16" then return flow.autocast("bfloat16", fn, ...) end
    return fn(...)
  end
  local function run() return table.pack(self.build(self, table.unpack(lazy, 1, n))) end
  if M == 1 then return amp(run) end
  local defer, scale = flow._defer_backward(true), flow._seed_scale(1 / M)
  local ok, outs = pcall(amp, run)
  flow._seed_scale(scale)
  flow._defer_backward(defer)
  g:phase("backward")
  if not ok then pcall(flow._run_deferred_backward); error(outs, 0) end
  amp(flow._run_deferred_backward)
  for _, p in ipairs(params) do if p.grad then p.grad = g:acc(p.grad) end end
  for i = 1, outs.n do if flow.is_tensor(outs[i]) then outs[i] = g:acc(outs[i]) end end
  g:phase("step")
  for i = 1, outs.n do if flow.is_tensor(outs[i]) then outs[i] = outs[i] / M end end
  -- the accumulated gradients were kept partial over the data-parallel ranks: reduced once here
  if not self.zero then
    flow.no_grad(function()
      for _, p in ipairs(params) do
        if p.grad and p.is_global then p.grad = p.grad:to_global(p.placement, p.sbp) end
      end
    end)
  end
  return outs
end

-- The pipeline buffer of this rank's stage: how many micro-batches its forward may run ahead of
-- its backward. S - s for stage s of S gives 1F1B's memory; the credits do the scheduling.
function Graph:_pipeline_buffer()
  if self.config.pipeline_buffer then return self.config.pipeline_buffer end
  if not self.stages then return 1 end
  local me = flow.rank()
  for s, st in ipairs(self.stages) do
    for _, r in ipairs(st.placement.ranks) do if r == me then return #self.stages - s + 1 end end
  end
  return 1
end

-------------------------------------------------------------------------------- pipeline stages

-- Put a module's computation on `placement` (a pipeline stage): its parameters move there now
-- (in the model and the optimizer; a tensor tied to an earlier stage's module stays there), and
-- in the trace its tensor inputs are boxed to that placement (send/recv between placements).
function Graph:set_stage(module, placement)
  if type(module) ~= "table" or not module._order then error("nn.Graph:set_stage: expected a module", 2) end
  if type(placement) ~= "userdata" or not pcall(function() return placement.ranks end) or not placement.ranks then
    error(("nn.Graph:set_stage: expected a placement (got %s)"):format(tostring(placement)), 2)
  end
  if next(self.plans) then error("nn.Graph:set_stage: stages must be set before the first call", 2) end
  self.stages = self.stages or {}
  self.staged = self.staged or {}
  self.stages[#self.stages + 1] = { module = module, placement = placement }
  local map = {}
  flow.no_grad(function()
    for _, p in ipairs(module:parameters()) do
      if not self.staged[p] and not (p.is_global and p.placement == placement) then
        local q = p:to_global(placement, p.is_global and p.sbp or flow.sbp.broadcast):detach()
        q:requires_grad_(true)
        map[p] = q
        self.staged[q] = true
      end
      self.staged[p] = true
    end
  end)
  if self.model then self.model:swap_parameters(map) else module:swap_parameters(map) end
  local opt = self.optimizer
  if opt then
    opt:swap_parameters(map)
    for i, p in opt:each() do -- state made before the move follows its parameter
      for key, t in pairs(opt.state[i] or {}) do
        if p.is_global and t.placement ~= p.placement then opt.state[i][key] = t:to_global(p.placement, p.sbp) end
      end
    end
  end
  return self
end

-- Activation checkpointing per module: in the trace its forward is a segment, and the recompute
-- pass rebuilds the activations backward reads from the module's inputs just before backward
-- needs them, so only the inputs (and results) stay alive in between.
function Graph:set_activation_checkpointing(module, on)
  if type(module) ~= "table" or not module._order then error("nn.Graph:set_activation_checkpointing: expected a module", 2) end
  if next(self.plans) then error("nn.Graph:set_activation_checkpointing: set it before the first call", 2) end
  self.checkpointed = self.checkpointed or {}
  self.checkpointed[module] = on ~= false or nil
  return self
end

-- While tracing, a staged module boxes its inputs to its placement, and a checkpointed module's
-- forward is bracketed as a segment. Returns the function that undoes the wrapping.
function Graph:_enter_modules(g)
  local wrapped = {}
  local placement_of = {}
  for _, st in ipairs(self.stages or {}) do placement_of[st.module] = st.placement end
  local function wrap(module)
    if wrapped[module] then return end
    wrapped[module] = true
    local P, ckpt, forward = placement_of[module], self.checkpointed and self.checkpointed[module], module.forward
    rawset(module, "forward", function(m, ...)
      local args = table.pack(...)
      if P then
        for i = 1, args.n do
          local a = args[i]
          if flow.is_tensor(a) and a.is_global and a.placement ~= P then args[i] = a:to_global(P, a.sbp) end
        end
      end
      if not ckpt then return forward(m, table.unpack(args, 1, args.n)) end
      local mark = g:segment_begin()
      local outs = table.pack(forward(m, table.unpack(args, 1, args.n)))
      g:segment_end(mark, table.unpack(outs, 1, outs.n))
      return table.unpack(outs, 1, outs.n)
    end)
  end
  for module in pairs(placement_of) do wrap(module) end
  for module in pairs(self.checkpointed or {}) do wrap(module) end
  return function()
    for module in pairs(wrapped) do rawset(module, "forward", nil) end
  end
end

-------------------------------------------------------------------------------- ZeRO

-- ZeRO over the data-parallel axis (mesh axis 0, where the parameters are broadcast), as SBP:
-- stage 1 keeps the optimizer state split S(0) there; stage 2 also reduce-scatters the gradients
-- (P -> S(0)) instead of all-reducing them; stage 3 also stores the parameters split and the
-- trace all-gathers each (S(0) -> B) before use, its gradient coming back by reduce-scatter.
local function sharded(sbp)
  if type(sbp) ~= "table" then return flow.sbp.split(0) end
  local z = {}
  for i, v in ipairs(sbp) do z[i] = v end
  z[1] = flow.sbp.split(0)
  return z
end

local function broadcast_on_axis0(sbp)
  return (type(sbp) == "table" and sbp[1] or sbp) == flow.sbp.broadcast
end

function Graph:_setup_zero()
  local stage = self.config.zero_stage or 0
  if self.zero ~= nil or stage == 0 then return end
  self.zero = false
  local params = params_of(self)
  local P = params[1] and params[1].is_global and params[1].placement
  if not P or P.shape[1] == 1 then
    io.stderr:write(("nn.Graph: warning: zero_stage = %d with data parallelism 1 (%s): nothing to shard, running without ZeRO\n"):format(
      stage, P and "mesh axis 0 has one rank" or "local parameters"))
    return
  end
  local z = { stage = stage, placement = P, shard = {}, full = {} }
  for _, p in ipairs(params) do
    if not p.is_global or p.placement ~= P or not broadcast_on_axis0(p.sbp) then
      error(("nn.Graph: zero_stage needs every parameter broadcast over mesh axis 0 (the data-parallel axis) of %s; "
        .. "a parameter of shape {%s} has sbp %s"):format(tostring(P), table.concat(p:shape(), ","), tostring(p.sbp)), 0)
    end
    z.shard[p], z.full[p] = sharded(p.sbp), p.sbp
  end
  local opt = self.optimizer
  opt:init_state()
  flow.no_grad(function()
    for i, p in opt:each() do
      for key, t in pairs(opt.state[i] or {}) do opt.state[i][key] = t:to_global(P, z.shard[p]) end
    end
    if stage == 3 then
      local map = {}
      for _, p in ipairs(params) do
        local s = p:to_global(P, z.shard[p]):detach()
        s:requires_grad_(true)
        map[p] = s
        z.shard[s], z.full[s] = z.shard[p], z.full[p]
      end
      if self.model then self.model:swap_parameters(map) end
      opt:swap_parameters(map)
    end
  end)
  self.zero = z
end

-- The optimizer pass under ZeRO: every update runs on this rank's shard of the parameter, its
-- gradient and its state; stages 1-2 all-gather the updated shards into the parameter.
function Graph:_zero_updates(g)
  local z, opt = self.zero, self.optimizer
  local P = z.placement
  local work, grads = {}, {}
  flow.no_grad(function()
    for i, p, grp in opt:each() do
      if p.grad then
        local gs = p.grad:to_global(P, z.shard[p]) -- B -> S(0) a local slice; P -> S(0) a reduce-scatter
        work[#work + 1] = { i, p, gs, grp }
        grads[#grads + 1] = gs
      end
    end
    if self.clip then flow.optim.clip_grads(grads, self.clip) end
    for _, w in ipairs(work) do
      local i, p, gs, grp = w[1], w[2], w[3], w[4]
      g:tag(grp.index)
      if z.stage == 3 then
        opt:update(i, p, gs, grp)
      else
        local ps = p:to_global(P, z.shard[p])
        opt:update(i, ps, gs, grp)
        p:copy_(ps:to_global(P, z.full[p]))
      end
    end
    g:tag(0)
  end)
end

-- Every rank the inputs live on must hold a stage: a rank left out would idle while the others
-- wait on it in a collective over the inputs' placement.
function Graph:_check_stages(args)
  if not self.stages then return end
  local covered = {}
  for _, st in ipairs(self.stages) do for _, r in ipairs(st.placement.ranks) do covered[r] = true end end
  for i = 1, args.n do
    local a = args[i]
    if flow.is_tensor(a) and a.is_global then
      local missing = {}
      for _, r in ipairs(a.placement.ranks) do if not covered[r] then missing[#missing + 1] = r end end
      if #missing > 0 then
        error(("nn.Graph: the pipeline stages do not cover the mesh of input %d (%s): ranks %s hold no stage"):format(
          i, tostring(a.placement), table.concat(missing, ", ")), 0)
      end
    end
  end
end

function Graph:_compile(args)
  self:_check_stages(args)
  local M = self.accumulation
  for i = 1, args.n do if M > 1 and flow.is_tensor(args[i]) then check_micro_batches(args[i], i, M) end end
  self:_setup_zero()
  local g = flow._graph.new()
  local opt = self.optimizer
  local params = params_of(self)
  if opt then opt:init_state() end
  local z = self.zero
  -- ZeRO-3: the trace sees each parameter all-gathered where the model reads it
  local restore_params = function() end
  -- ZeRO-2/3 reduce-scatter the partial gradients in the optimizer pass; with micro-batches they
  -- are accumulated partial and reduced once
  local use_partial = (z and z.stage >= 2) or M > 1
  g:begin(M)
  local partial = use_partial and flow._partial_leaf_grads(true)
  local saved = {}
  for i, p in ipairs(params) do saved[i] = p.grad; p.grad = nil end
  -- debug >= 2: trace errors carry the Lua traceback of the build code that raised them
  local handler = (self.config.debug or 0) >= 2 and debug.traceback or function(e) return e end
  local ok, err = xpcall(function()
    local lazy = {}
    for i = 1, args.n do
      local a = args[i]
      lazy[i] = flow.is_tensor(a) and g:input(a) or a
    end
    if z and z.stage == 3 and self.model then
      local gathered = {}
      for _, p in ipairs(params) do gathered[p] = p:to_global(z.placement, z.full[p]) end
      restore_params = self.model:swap_parameters(gathered)
    end
    local leave = self:_enter_modules(g)
    local ok_trace, outs = pcall(self._trace_step, self, g, lazy, args.n, params)
    leave()
    if not ok_trace then error(outs, 0) end
    restore_params()
    if self.stages then -- results come back to where the inputs live, so every rank can read them
      local home
      for i = 1, args.n do if flow.is_tensor(args[i]) and args[i].is_global then home = home or args[i].placement end end
      for i = 1, outs.n do
        local o = outs[i]
        if home and flow.is_tensor(o) and o.is_global and o.placement ~= home then outs[i] = o:to_global(home, o.sbp) end
      end
    end
    if z then
      self:_zero_updates(g)
    elseif opt then
      if self.clip then flow.optim.clip_grad_norm(params, self.clip) end
      opt:apply(function(gi) g:tag(gi) end)
      g:tag(0)
    end
    for i = 1, outs.n do
      if not flow.is_tensor(outs[i]) then
        error(("nn.Graph: build must return tensors; result %d is a %s"):format(i, type(outs[i])), 0)
      end
      g:output(outs[i])
    end
  end, handler)
  g:finish()
  restore_params()
  if use_partial then flow._partial_leaf_grads(partial) end
  for i, p in ipairs(params) do p.grad = saved[i] end
  if not ok then error(err, 0) end
  g:compile(self.register_num, self.config.allow_fuse_add_to_output ~= false, self:_pipeline_buffer())
  self.compiles = self.compiles + 1
  if (self.config.debug or 0) > 0 then
    local st = g:stats()
    print(("nn.Graph: compiled plan %d: %d nodes traced, %d live, %d boxings, %d adds fused, %d recomputed; tasks %d compute, %d collective, %d copy"):format(
      self.compiles, st.nodes, st.live, st.boxings, st.fused, st.recomputed, st.tasks.compute, st.tasks.collective, st.tasks.copy))
  end
  return g
end

function Graph:__call(...)
  local args = table.pack(...)
  local opt = self.optimizer
  if opt then -- the step being taken (1-based, as the optimizer's updates read it)
    opt.step_count = opt.step_count + 1
    if self.lr_scheduler then opt:set_lr(self.lr_scheduler(opt.step_count - 1)) end
  end
  local key = signature(self, args)
  local g = self.plans[key]
  if not g then
    local ok, res = pcall(self._compile, self, args)
    if not ok then
      if opt then opt.step_count = opt.step_count - 1 end
      error(res, 2)
    end
    g = res
    self.plans[key] = g
  end
  self.last = g
  if opt and opt.fed_lr then
    for _, grp in ipairs(opt.groups) do g:feed(grp.index, grp.lr, opt.step_count) end
  end
  local inputs = {}
  for i = 1, args.n do
    local a = args[i]
    if flow.is_tensor(a) then inputs[#inputs + 1] = a:is_contiguous() and a or a:contiguous() end
  end
  local ok, outs = pcall(g.run, g, inputs)
  if not ok then
    if opt then opt.step_count = opt.step_count - 1 end
    error(outs, 2)
  end
  return table.unpack(outs)
end

local function last_plan(self, what)
  if not self.last then error(("nn.Graph:%s: the graph has not run yet (call it first)"):format(what), 3) end
  return self.last
end

-- The plan as Graphviz: tasks coloured by stream (compute, collective, copy), registers and
-- their register_num on the edges, control edges dotted. Returns the text; writes it to path.
function Graph:dot(path)
  local s = last_plan(self, "dot"):dot()
  if path then
    local f = assert(io.open(path, "w"))
    f:write(s)
    f:close()
  end
  return s
end

-- Record every act of the graph's runs inside fn as a Chrome/Perfetto trace, every rank's merged
-- into one file (written by rank 0; pid = rank, tid = stream). Returns each rank's events.
-- G:trace(path, function() G(x, y) end)
function Graph:trace(path, fn)
  if type(fn) ~= "function" then
    error("nn.Graph:trace: expected a function running the graph, as in G:trace(path, function() G(x, y) end)", 2)
  end
  local g = last_plan(self, "trace")
  g:trace(true)
  local ok, err = pcall(fn)
  g:trace(false)
  if not ok then error(err, 2) end
  local mine = g:events()
  local all = flow.world_size() > 1 and flow._allgather_strings(mine) or { mine }
  if flow.rank() == 0 and path then
    local parts = {}
    for _, s in ipairs(all) do if #s > 0 then parts[#parts + 1] = s end end
    local f = assert(io.open(path, "w"))
    f:write("{\"traceEvents\":[\n", table.concat(parts, ",\n"), "\n],\"displayTimeUnit\":\"ms\"}\n")
    f:close()
  end
  return all
end

-- Planned and measured bytes of the last plan on this rank: arena (packed by lifetime), what the
-- same registers take unpacked, dedicated buffers, captured tensors (parameters, state), and the
-- storage high-water mark of the last run.
function Graph:memory() return last_plan(self, "memory"):memory() end

function Graph:stats() return last_plan(self, "stats"):stats() end

Graph.__name = "nn.Graph"
return M
