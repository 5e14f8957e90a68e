-- CPU kernel speed of one build against another: ms per call of the loops flowlua runs itself
-- (not oneDNN's), on 1024x1024 float32, one thread; name' is name's gradient kernel. Written for comparing -march choices
-- (FLOW_ARCH) and run-time dispatch: with binaries as arguments it runs itself under each of
-- them in turn, ROUNDS times, and prints every op's best time per build and the ratio to the
-- first. Usage: flowlua scripts/bench/cpu_kernels.lua [BIN1 BIN2 ...]   (no argument: this one)
local flow = require "flow"

local N, ROUNDS = 1024, 5
local OPS = { "softmax", "log_softmax", "sum(-1)", "sum()", "mean(0)", "add", "mul", "exp", "gelu", "tanh",
              "layer_norm", "cross_entropy", "adamw_", "attention", "gelu_tanh", "gelu_tanh'", "silu", "silu'",
              "sigmoid", "erf", "erf'", "softplus", "softplus'", "log1p", "expm1", "sin", "sin'", "cos" }

if arg and #arg > 0 then
  local best = {} -- best[b][op]
  for _ = 1, ROUNDS do
    for b, bin in ipairs(arg) do
      best[b] = best[b] or {}
      local p = assert(io.popen(("FLOW_NUM_THREADS=1 %s %s"):format(bin, arg[0])))
      for line in p:lines() do
        local op, ms = line:match("^(%S+)%s+([%d.]+)$")
        if op then best[b][op] = math.min(best[b][op] or math.huge, tonumber(ms)) end
      end
      p:close()
    end
  end
  for b, bin in ipairs(arg) do print(("(%d) %s"):format(b, bin)) end
  local head = { ("%-18s %9s"):format("ms per call", "(1)") }
  for b = 2, #arg do head[#head + 1] = ("%9s %5s"):format("(" .. b .. ")", "x(1)") end
  print(table.concat(head, " "))
  for _, op in ipairs(OPS) do
    local row = { ("%-18s"):format(op) }
    for b = 1, #arg do
      local t = best[b][op]
      row[#row + 1] = b == 1 and ("%9.3f"):format(t) or ("%9.3f %5.2f"):format(t, t / best[1][op])
    end
    print(table.concat(row, " "))
  end
  return
end

local x = flow.randn(N, N)
local y = flow.randn(N, N)
local xa = x:abs()
local w, bias = flow.ones(N), flow.zeros(N)
local target = flow.randint(0, N, { N })
local p, g, m, v = flow.randn(N, N), flow.randn(N, N), flow.zeros(N, N), flow.zeros(N, N)
local q = flow.randn(1, 8, 256, 64) -- attention: batch 1, 8 heads, 256 tokens, head size 64
local fns = {
  softmax = function() return flow.softmax(x, -1) end,
  log_softmax = function() return flow.log_softmax(x, -1) end,
  ["sum(-1)"] = function() return x:sum(-1) end,
  ["sum()"] = function() return x:sum() end,
  ["mean(0)"] = function() return x:mean(0) end,
  add = function() return x + y end,
  mul = function() return x * y end,
  exp = function() return x:exp() end,
  gelu = function() return flow.gelu(x) end,
  tanh = function() return x:tanh() end,
  layer_norm = function() return flow.layer_norm(x, w, bias) end,
  cross_entropy = function() return flow.cross_entropy(x, target) end,
  adamw_ = function() flow.adamw_(p, g, m, v, { lr = 1e-3, step = 1 }) end,
  attention = function() return flow.scaled_dot_product_attention(q, q, q, { causal = true }) end,
  gelu_tanh = function() return flow.gelu(x, { approximate = "tanh" }) end,
  silu = function() return flow.nn.functional.silu(x) end,
  sigmoid = function() return x:sigmoid() end,
  erf = function() return flow.erf(x) end,
  softplus = function() return flow.nn.functional.softplus(x) end,
  log1p = function() return flow.log1p(xa) end,
  expm1 = function() return flow.expm1(x) end,
  sin = function() return flow.sin(x) end,
  cos = function() return flow.cos(x) end,
}
-- op' : the op's gradient kernel alone (forward + backward, less the forward measured above)
local function with_grad(f)
  return function()
    local a = x:detach():requires_grad_(true)
    f(a):backward(y)
  end
end
local grads = {
  ["gelu_tanh'"] = { "gelu_tanh", with_grad(function(a) return flow.gelu(a, { approximate = "tanh" }) end) },
  ["silu'"] = { "silu", with_grad(flow.nn.functional.silu) },
  ["erf'"] = { "erf", with_grad(flow.erf) },
  ["softplus'"] = { "softplus", with_grad(flow.nn.functional.softplus) },
  ["sin'"] = { "sin", with_grad(flow.sin) },
}
local function best_ms(f)
  local best = math.huge
  for _ = 1, 3 do f() end
  for _ = 1, 7 do
    local t0 = flow.now()
    for _ = 1, 10 do f() end
    best = math.min(best, (flow.now() - t0) / 10)
  end
  return best * 1000
end
local measured = {}
for _, op in ipairs(OPS) do
  local ms = grads[op] and best_ms(grads[op][2]) - measured[grads[op][1]] or best_ms(fns[op])
  measured[op] = ms
  print(("%-18s %.4f"):format(op, ms))
end
