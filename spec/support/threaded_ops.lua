-- Run by spec/threads_spec.lua under FLOW_NUM_THREADS=1 and =2: prints the thread count, then a
-- hash of the exact bits of each result of the CPU kernels that go parallel (every input is
-- above their size thresholds), one "name hash" line each.
local flow = require "flow"
local F = flow.nn.functional

print("threads", flow._bench.onednn().threads)

local function hash(name, t)
  local v = t:detach():double():reshape({ -1 }):totable()
  local h = #v
  for i = 1, #v do h = ((h ~ string.unpack("<i8", string.pack("<d", v[i]))) * 0x100000001b3) ~ (h >> 29) end
  print(name, h)
end

flow.manual_seed(7)
local R, C = 256, 576 -- 147456 elements: over two grains of the cheapest op (iter.h)
local x, y = flow.randn({ R, C }), flow.randn({ R, C })
local up = flow.randn({ R, C }) -- upstream gradient, so no backward sees a broadcast ones

hash("add", x + y)
hash("mul", x * y)
hash("pow", x:abs() ^ 1.5)
hash("exp", x:exp())
hash("tanh", x:tanh())
hash("copy of a transpose", x:transpose(0, 1):contiguous())
hash("where", flow.where(x:gt(0), x, y))

local function backward(name, f, ...)
  local inputs = { ... }
  for i, t in ipairs(inputs) do inputs[i] = t:detach():requires_grad_(true) end
  local out = f(table.unpack(inputs))
  hash(name, out)
  local s = (out * up:reshape(out:shape())):sum()
  s:backward()
  for i, t in ipairs(inputs) do hash(name .. " grad " .. i, t.grad) end
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
hash("cross_entropy", loss)
loss:backward()
hash("cross_entropy grad", xl.grad)

hash("sum()", x:sum())
hash("sum(0)", x:sum(0))
hash("sum(-1)", x:sum(-1))
hash("mean(0)", x:mean(0))
hash("var(0)", x:var(0))
hash("var()", x:var())

local p, g, m, v = flow.randn({ R, C }), flow.randn({ R, C }), flow.randn({ R, C }):abs(), flow.randn({ R, C }):abs()
flow.adamw_(p, g, m, v, { lr = 1e-3, step = 3, weight_decay = 0.1 })
hash("adamw p", p)
hash("adamw m", m)
hash("adamw v", v)

hash("embedding", F.embedding(flow.randint(0, 1000, { 32, 64 }), flow.randn({ 1000, 128 })))
