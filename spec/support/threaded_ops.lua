-- Run by spec/threads_spec.lua under FLOW_NUM_THREADS=1 and =2 as `threaded_ops.lua FILE`: prints
-- the thread count and saves to FILE (safetensors) every result of the CPU kernels that go
-- parallel, each input above their size thresholds (kernels/cpu/iter.h).
local flow = require "flow"
local F = flow.nn.functional

print("threads", flow._bench.onednn().threads)

local results = {}
local function keep(name, t) results[name] = t:detach():contiguous() end

flow.manual_seed(7)
local R, C = 512, 1024 -- two grains of the cheapest op (iter.h)
local x, y = flow.randn({ R, C }), flow.randn({ R, C })
local up = flow.randn({ R, C }) -- upstream gradient, so no backward sees a broadcast ones

keep("add", x + y)
keep("mul", x * y)
keep("pow", x:abs() ^ 1.5)
keep("exp", x:exp())
keep("tanh", x:tanh())
keep("copy of a transpose", x:transpose(0, 1):contiguous())
keep("where", flow.where(x:gt(0), x, y))

local function backward(name, f, ...)
  local inputs = { ... }
  for i, t in ipairs(inputs) do inputs[i] = t:detach():requires_grad_(true) end
  local out = f(table.unpack(inputs))
  keep(name, out)
  local s = (out * up:reshape(out:shape())):sum()
  s:backward()
  for i, t in ipairs(inputs) do keep(name .. " grad " .. i, t.grad) end
end

backward("gelu", F.gelu, x)
backward("gelu tanh", function(a) return F.gelu(a, { approximate = "tanh" }) end, x)
backward("softmax(-1)", function(a) return flow.softmax(a, -1) end, x)
backward("log_softmax(-1)", function(a) return flow.log_softmax(a, -1) end, x)
backward("softmax(0)", function(a) return flow.softmax(a, 0) end, x)
backward("layer_norm", function(a, w, b) return flow.layer_norm(a, w, b, 1e-5) end, x, flow.randn({ C }),
         flow.randn({ C }))

local target = flow.randint(0, C, { R })
local xl = x:detach():requires_grad_(true)
local loss = F.cross_entropy(xl, target)
keep("cross_entropy", loss)
loss:backward()
keep("cross_entropy grad", xl.grad)

keep("sum()", x:sum())
keep("sum(0)", x:sum(0))
keep("sum(-1)", x:sum(-1))
keep("mean(0)", x:mean(0))
keep("var(0)", x:var(0))
keep("var()", x:var())

local p, g, m, v = flow.randn({ R, C }), flow.randn({ R, C }), flow.randn({ R, C }):abs(), flow.randn({ R, C }):abs()
flow.adamw_(p, g, m, v, { lr = 1e-3, step = 3, weight_decay = 0.1 })
keep("adamw p", p)
keep("adamw m", m)
keep("adamw v", v)

keep("embedding", F.embedding(flow.randint(0, 1000, { 64, 64 }), flow.randn({ 1000, 128 })))

-- attention: a team of threads takes the batch items (two blocks of query rows each), GEMMs and
-- all, in float32 and under bf16 autocast
local qa, ka, va = flow.randn({ 4, 4, 70, 16 }), flow.randn({ 4, 4, 70, 16 }), flow.randn({ 4, 4, 70, 16 })
local ua = flow.randn({ 4, 4, 70, 16 }) -- upstream gradient
local function attention(name, causal)
  local q, k, v = qa:clone():requires_grad_(true), ka:clone():requires_grad_(true), va:clone():requires_grad_(true)
  local y = F.scaled_dot_product_attention(q, k, v, { causal = causal })
  y:backward(ua)
  keep(name, y)
  keep(name .. " dq", q.grad)
  keep(name .. " dk", k.grad)
  keep(name .. " dv", v.grad)
end
for _, causal in ipairs({ false, true }) do
  attention(("attention causal=%s"):format(causal), causal)
  if flow._bench.onednn().bf16 then
    flow.autocast("bfloat16", function() attention(("attention bf16 causal=%s"):format(causal), causal) end)
  end
end

flow.save(results, assert(arg[1], "usage: threaded_ops.lua FILE"))
