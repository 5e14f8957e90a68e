-- flow.nn.Graph (lazy mode): a traced step compiled into a plan and run by the actor engine gives
-- eager's numbers; the passes (autograd, optimizer, dead nodes, memory) and the tools each checked.
local flow = require "flow"
local gpt = require "flow.gpt"
local nn, F = flow.nn, flow.nn.functional

local function mlp()
  flow.manual_seed(1)
  return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
end

local function data(n)
  flow.manual_seed(0)
  return flow.randn({ n or 24, 16 }), flow.randint(0, 4, { n or 24 })
end

local function ce_build(self, x, y)
  local l = F.cross_entropy(self.model(x), y)
  l:backward()
  return l
end

-- losses of `steps` eager steps (AdamW, clipping) and of the same steps through a graph
local function eager_losses(model, opt, x, y, steps, clip)
  local out = {}
  for s = 1, steps do
    local l = F.cross_entropy(model(x), y)
    l:backward()
    if clip then flow.optim.clip_grad_norm(model:parameters(), clip) end
    opt:step()
    opt:zero_grad()
    out[s] = l:item()
  end
  return out
end

describe("nn.Graph against eager", function()
  it("an MLP with AdamW and clipping: 10 losses equal eager's", function()
    local x, y = data()
    local m1 = mlp()
    local want = eager_losses(m1, flow.optim.AdamW(m1:parameters(), { lr = 1e-2 }), x, y, 10, 0.5)
    local m2 = mlp()
    local G = nn.Graph { model = m2, optimizer = flow.optim.AdamW(m2:parameters(), { lr = 1e-2 }), clip_grad_norm = 0.5,
                         build = ce_build }
    for s = 1, 10 do assert.near(want[s], G(x, y):item(), 1e-5) end
    assert.is_true(want[10] < want[1] - 0.1)
    assert.equal(1, G.compiles)
  end)

  it("SGD with momentum: equal losses, and a new lr compiles a new plan", function()
    local x, y = data()
    local m1 = mlp()
    local o1 = flow.optim.SGD(m1:parameters(), { lr = 0.1, momentum = 0.9 })
    local m2 = mlp()
    local o2 = flow.optim.SGD(m2:parameters(), { lr = 0.1, momentum = 0.9 })
    local G = nn.Graph { model = m2, optimizer = o2, build = ce_build }
    for s = 1, 6 do
      if s == 4 then o1:set_lr(0.05); o2:set_lr(0.05) end
      local l = F.cross_entropy(m1(x), y)
      l:backward(); o1:step(); o1:zero_grad()
      assert.near(l:item(), G(x, y):item(), 1e-5)
    end
    assert.equal(2, G.compiles)
  end)

  it("a GPT (tied embeddings, attention, layer norm): 10 losses equal eager's within 1e-5", function()
    local cfg = { vocab_size = 32, block_size = 8, n_layer = 2, n_head = 2, n_embd = 16 }
    local function make()
      flow.manual_seed(3)
      local m = gpt.GPT(cfg)
      return m, m:configure_optimizer({ lr = 1e-2, weight_decay = 0.1 })
    end
    flow.manual_seed(4)
    local idx, tgt = flow.randint(0, 32, { 4, 8 }), flow.randint(0, 32, { 4, 8 })
    local m1, o1 = make()
    local m2, o2 = make()
    local G = nn.Graph { model = m2, optimizer = o2, clip_grad_norm = 1.0,
                         build = function(self, x, y) local _, l = self.model(x, y); l:backward(); return l end }
    for s = 1, 10 do
      local _, l = m1(idx, tgt)
      l:backward()
      flow.optim.clip_grad_norm(m1:parameters(), 1.0)
      o1:step(); o1:zero_grad()
      assert.near(l:item(), G(idx, tgt):item(), 1e-5)
    end
  end)

  it("dropout draws fresh masks each step, exactly as eager does (and the generator advances alike)", function()
    local function make()
      flow.manual_seed(1)
      return nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.GELU(), nn.Linear(32, 4))
    end
    local x, y = data()
    local m1, m2 = make(), make()
    local o1, o2 = flow.optim.SGD(m1:parameters(), { lr = 0.1 }), flow.optim.SGD(m2:parameters(), { lr = 0.1 })
    flow.manual_seed(7)
    local want = eager_losses(m1, o1, x, y, 4)
    local after_eager = flow.rand({ 3 }):totable()
    local G = nn.Graph { model = m2, optimizer = o2, build = ce_build }
    flow.manual_seed(7)
    for s = 1, 4 do assert.near(want[s], G(x, y):item(), 1e-6) end
    assert.are.same(after_eager, flow.rand({ 3 }):totable())
    assert.is_true(want[1] ~= want[2])
  end)

  it("shares parameters and optimizer state with eager code, both ways", function()
    local x, y = data()
    local m1, m2 = mlp(), mlp()
    local o1, o2 = flow.optim.AdamW(m1:parameters(), { lr = 1e-2 }), flow.optim.AdamW(m2:parameters(), { lr = 1e-2 })
    local G = nn.Graph { model = m2, optimizer = o2, build = ce_build }
    local want = eager_losses(m1, o1, x, y, 6)
    G(x, y); G(x, y)                              -- graph, then eager steps on the same model,
    local got = eager_losses(m2, o2, x, y, 2)     -- then the graph again
    assert.near(want[3], got[1], 1e-5)
    assert.near(want[4], got[2], 1e-5)
    assert.near(want[5], G(x, y):item(), 1e-5)
    assert.near(want[6], G(x, y):item(), 1e-5)
    assert.equal(6, o2.step_count)
  end)
end)

describe("nn.Graph plan cache", function()
  it("a new input shape compiles a new plan; a known one reuses its plan", function()
    local m = mlp()
    local G = nn.Graph { model = m, build = function(self, x) return self.model(x):sum() end }
    local a, b = flow.randn({ 8, 16 }), flow.randn({ 3, 16 })
    assert.near(m(a):sum():item(), G(a):item(), 1e-5)
    assert.near(m(b):sum():item(), G(b):item(), 1e-5)
    assert.near(m(a):sum():item(), G(a):item(), 1e-5)
    assert.equal(2, G.compiles)
    G(a:cast("float64"):cast("float32"))
    assert.equal(2, G.compiles)
  end)

  it("non-contiguous inputs are fed as contiguous copies", function()
    local m = mlp()
    local G = nn.Graph { model = m, build = function(self, x) return self.model(x) end }
    local t = flow.randn({ 16, 5 }):permute({ 1, 0 })
    assert.is_false(t:is_contiguous())
    local got, want = G(t), m(t)
    assert.near(0, (got - want):abs():max():item(), 1e-6)
  end)
end)

describe("nn.Graph passes", function()
  it("autograd: the gradients build returns equal eager's", function()
    local x, y = data()
    local m = mlp()
    local l = F.cross_entropy(m(x), y)
    l:backward()
    local want = {}
    for i, p in ipairs(m:parameters()) do want[i] = p.grad; p.grad = nil end
    local G = nn.Graph { model = m, build = function(self, x, y)
      local loss = F.cross_entropy(self.model(x), y)
      loss:backward()
      local grads = {}
      for i, p in ipairs(self.model:parameters()) do grads[i] = p.grad end
      return table.unpack(grads)
    end }
    local got = table.pack(G(x, y))
    assert.equal(#want, got.n)
    for i = 1, got.n do assert.near(0, (got[i] - want[i]):abs():max():item(), 1e-6) end
    for _, p in ipairs(m:parameters()) do assert.is_nil(p.grad) end -- lazy grads never leak out
  end)

  it("dead nodes: work that reaches no output and writes no state is pruned", function()
    local with = nn.Graph { build = function(self, x)
      local _ = flow.exp(x) * 3 -- never returned
      return x + 1
    end }
    local without = nn.Graph { build = function(self, x) return x + 1 end }
    local x = flow.randn({ 4 })
    assert.near(0, (with(x) - (x + 1)):abs():max():item(), 0)
    without(x)
    local a, b = with:stats(), without:stats()
    assert.is_true(a.nodes >= b.nodes + 2) -- exp, mul (and the constant 3)
    assert.equal(b.live, a.live)
    assert.equal(b.tasks.compute, a.tasks.compute)
  end)

  it("memory: lifetimes pack into an arena smaller than the registers laid end to end", function()
    local m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 8))
    local G = nn.Graph { model = m, optimizer = flow.optim.AdamW(m:parameters(), { lr = 1e-3 }), build = function(self, x, y)
      local l = F.cross_entropy(self.model(x), y); l:backward(); return l end }
    G(flow.randn({ 64, 64 }), flow.randint(0, 8, { 64 }))
    local mem = G:memory()
    assert.is_true(mem.arena > 0)
    assert.is_true(mem.arena < 0.7 * mem.unpacked, ("arena %d vs unpacked %d"):format(mem.arena, mem.unpacked))
    assert.is_true(mem.captured >= 3 * 4 * (64 * 256 + 256 * 256 + 256 * 8)) -- parameters, m and v
    assert.is_true(mem.measured_peak >= mem.planned)
  end)

  it("fusion: a residual add writes into its dying input's buffer, with the same numbers", function()
    local m = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 16))
    local fused = nn.Graph { model = m, build = function(self, x) return (self.model(x) + x):sum() end }
    local plain = nn.Graph { model = m, config = { allow_fuse_add_to_output = false },
                             build = function(self, x) return (self.model(x) + x):sum() end }
    local keep = nn.Graph { model = m, build = function(self, x)
      local h = self.model(x)
      return h + x, h -- h is returned: its buffer must stay
    end }
    local x = flow.randn({ 8, 16 })
    assert.equal(plain(x):item(), fused(x):item())
    assert.is_true(fused:stats().fused >= 1)
    assert.equal(0, plain:stats().fused)
    local s, h = keep(x)
    assert.equal(0, keep:stats().fused)
    assert.near(0, (s - (m(x) + x)):abs():max():item(), 1e-6)
    assert.near(0, (h - m(x)):abs():max():item(), 1e-6)
  end)

  it("activation checkpointing: the same losses, blocks recomputed, activation memory halved", function()
    local cfg = { vocab_size = 32, block_size = 32, n_layer = 3, n_head = 2, n_embd = 64 }
    local function run(ckpt)
      flow.manual_seed(3)
      local m = gpt.GPT(cfg)
      local G = nn.Graph { model = m, optimizer = m:configure_optimizer({ lr = 1e-2 }),
        build = function(self, x, y) local _, l = self.model(x, y); l:backward(); return l end }
      if ckpt then for i = 1, #m.h do G:set_activation_checkpointing(m.h[i]) end end
      flow.manual_seed(4)
      local idx, tgt = flow.randint(0, 32, { 8, 32 }), flow.randint(0, 32, { 8, 32 })
      local losses = {}
      for s = 1, 4 do losses[s] = G(idx, tgt):item() end
      return losses, G
    end
    local plain, g1 = run(false)
    local ckpt, g2 = run(true)
    for s = 1, 4 do assert.equal(plain[s], ckpt[s]) end
    assert.equal(0, g1:stats().recomputed)
    assert.is_true(g2:stats().recomputed > 10)
    assert.is_true(g2:memory().arena < 0.6 * g1:memory().arena,
      ("arena %d with checkpointing, %d without"):format(g2:memory().arena, g1:memory().arena))
  end)

  it("optimizer: one AdamW update per call, lr and step fed at each run", function()
    local w = flow.tensor({ 1.0, -2.0 })
    w.requires_grad = true
    local opt = flow.optim.AdamW({ w }, { lr = 0.1, weight_decay = 0 })
    local G = nn.Graph { optimizer = opt, build = function(self) local l = (w * w):sum(); l:backward(); return l end }
    G()
    -- Adam's first step moves each weight by lr against its gradient's sign
    assert.near(0.9, w:totable()[1], 1e-6)
    assert.near(-1.9, w:totable()[2], 1e-6)
    opt:set_lr(0.01)
    G()
    assert.near(0.89, w:totable()[1], 1e-4)
    assert.equal(2, opt.step_count)
  end)
end)

describe("nn.Graph micro-batches (pieces of a run)", function()
  it("4 micro-batches of 6 rows give the losses of one batch of 24, traced once", function()
    local x, y = data()
    local m1 = mlp()
    local want = eager_losses(m1, flow.optim.AdamW(m1:parameters(), { lr = 1e-2 }), x, y, 10, 0.5)
    local m2 = mlp()
    local G = nn.Graph { model = m2, optimizer = flow.optim.AdamW(m2:parameters(), { lr = 1e-2 }), clip_grad_norm = 0.5,
                         config = { grad_accumulation_steps = 4 }, build = ce_build }
    for s = 1, 10 do assert.near(want[s], G(x, y):item(), 1e-5) end
    -- one micro-batch's nodes: backward on its own streams, one acc task per parameter and output
    local st = G:stats()
    assert.is_true(st.tasks.compute > 0 and st.tasks.compute_backward > 0)
    local accs = select(2, G:dot():gsub('label="acc ', ""))
    assert.equal(#m2:parameters() + 1, accs)
  end)

  it("the optimizer acts once per run, on the accumulated gradient", function()
    local w = flow.tensor({ 1.0, -2.0 })
    w.requires_grad = true
    local opt = flow.optim.SGD({ w }, { lr = 0.1 })
    local G = nn.Graph { optimizer = opt, config = { grad_accumulation_steps = 2 },
      build = function(self, x) local l = (w * x):sum(); l:backward(); return l end }
    -- micro-batches {1, 1} and {3, 3}: seeds 1/2 each, so the gradient is (1 + 3) / 2 = 2 per weight
    local l = G(flow.tensor({ { 1.0, 1.0 }, { 3.0, 3.0 } }))
    assert.near(0.8, w:totable()[1], 1e-6)
    assert.near(-2.2, w:totable()[2], 1e-6)
    assert.near(((1 - 2) + (3 - 6)) / 2, l:item(), 1e-6) -- the outputs are averaged
  end)

  it("checkpointing and the pipeline buffer change memory and schedule, not numbers", function()
    local cfg = { vocab_size = 32, block_size = 16, n_layer = 2, n_head = 2, n_embd = 32 }
    local function run(config, ckpt)
      flow.manual_seed(3)
      local m = gpt.GPT(cfg)
      local G = nn.Graph { model = m, optimizer = m:configure_optimizer({ lr = 1e-2 }), config = config,
        build = function(self, x, y) local _, l = self.model(x, y); l:backward(); return l end }
      if ckpt then for i = 1, #m.h do G:set_activation_checkpointing(m.h[i]) end end
      flow.manual_seed(4)
      local idx, tgt = flow.randint(0, 32, { 8, 16 }), flow.randint(0, 32, { 8, 16 })
      local losses = {}
      for s = 1, 3 do losses[s] = G(idx, tgt):item() end
      return losses
    end
    local want = run({ grad_accumulation_steps = 4 })
    for _, got in ipairs({ run({ grad_accumulation_steps = 4 }, true), run({ grad_accumulation_steps = 4, pipeline_buffer = 4 }),
                           run({ grad_accumulation_steps = 4, register_num = 2 }) }) do
      for s = 1, 3 do assert.equal(want[s], got[s]) end
    end
  end)

  it("bad micro-batch settings are clear errors", function()
    local x, y = data(24)
    local G = nn.Graph { model = mlp(), config = { grad_accumulation_steps = 5 }, build = ce_build }
    assert.error_matches(function() G(x, y) end, "grad_accumulation_steps = 5 does not divide the batch: 24 rows")
    assert.error_matches(function() nn.Graph { build = ce_build, config = { pipeline_buffer = 0 } } end,
      "pipeline_buffer must be an integer >= 1")
  end)
end)

describe("nn.Graph errors", function()
  it("data-dependent control flow in build is a clear error", function()
    local G = nn.Graph { build = function(self, x) if x:sum():item() > 0 then return x end return -x end }
    local ok, err = pcall(G, flow.randn({ 3 }))
    assert.is_false(ok)
    assert.matches("data%-dependent control flow", err)
  end)

  it("unknown options and config keys name the key", function()
    assert.has_error(function() nn.Graph { build = function() end, modle = {} } end,
      "nn.Graph: unknown option 'modle' (expected one of: build, clip_grad_norm, config, lr_scheduler, model, optimizer)")
    local ok, err = pcall(nn.Graph, { build = function() end, config = { register_nums = 2 } })
    assert.is_false(ok)
    assert.matches("nn.Graph config: unknown option 'register_nums'", err)
    assert.has_error(function() nn.Graph { model = {} } end)
  end)

  it("a kernel error inside the plan is a Lua error naming the op; the graph runs again afterwards", function()
    local wt = flow.randn({ 10, 4 })
    local G = nn.Graph { build = function(self, ids) return flow.embedding(ids, wt):sum() end }
    local good, bad = flow.tensor({ 1, 2, 3 }, { dtype = "int64" }), flow.tensor({ 1, 12, 3 }, { dtype = "int64" })
    assert.near(flow.embedding(good, wt):sum():item(), G(good):item(), 1e-5)
    local ok, err = pcall(G, bad)
    assert.is_false(ok)
    assert.matches("embedding", err)
    assert.matches("rank 0", err)
    assert.near(flow.embedding(good, wt):sum():item(), G(good):item(), 1e-5)
  end)

  it("build must return tensors", function()
    local G = nn.Graph { build = function() return 3 end }
    local ok, err = pcall(G)
    assert.is_false(ok)
    assert.matches("build must return tensors; result 1 is a number", err)
  end)
end)

describe("nn.Graph tools", function()
  local x, y = data()
  local m = mlp()
  local G = nn.Graph { model = m, optimizer = flow.optim.AdamW(m:parameters(), { lr = 1e-3 }), build = ce_build }
  G(x, y)

  it("dot draws tasks coloured by stream and registers with their register_num", function()
    local path = os.tmpname()
    local s = G:dot(path)
    local f = assert(io.open(path))
    assert.equal(s, f:read("a"))
    f:close()
    os.remove(path)
    assert.matches("^digraph plan", s)
    assert.matches("matmul", s)
    assert.matches("adamw_", s)
    assert.matches("label=\"r%d+ x1\"", s)
    assert.matches("fillcolor=lightblue", s)
  end)

  it("trace writes every act as Chrome trace events", function()
    local path = os.tmpname()
    G:trace(path, function() G(x, y) end)
    local f = assert(io.open(path))
    local s = f:read("a")
    f:close()
    os.remove(path)
    assert.matches("^{\"traceEvents\":%[", s)
    local n = 0
    for _ in s:gmatch("\"ph\":\"X\"") do n = n + 1 end
    assert.equal(G:stats().tasks.compute + G:stats().tasks.copy, n)
    assert.matches("\"name\":\"adamw_\"", s)
  end)
end)
