-- bfloat16 (and float16) tensors on the CPU against float32, op by op, in one process: ms per call
-- of each op on 1024x1024 (matmul 1024^3), the dtypes alternating round by round so both see the
-- same machine; the best of the rounds, and the half dtype's time over float32's. matmul and linear
-- run oneDNN's bf16 GEMM; the elementwise ops widen half operands in registers for their float32
-- loops; the rest (reductions, softmax, layer_norm) run their float32 kernels on float32 copies.
--   flowlua scripts/bench/half.lua [--dtype bfloat16|float16 --rounds 5]
local flow = require "flow"
local utils = require "flow.utils"
local F = flow.nn.functional

local args = utils.parse_args(arg, { dtype = "bfloat16", rounds = 5 })
if args.dtype ~= "bfloat16" and args.dtype ~= "float16" then
  error(("--dtype %s: expected bfloat16 or float16"):format(args.dtype), 0)
end
local N = 1024
flow.manual_seed(0)
local inputs = {}
for _, dt in ipairs({ "float32", args.dtype }) do
  local x, y = flow.randn({ N, N }):to(dt), flow.randn({ N, N }):to(dt)
  inputs[dt] = { x = x, y = y, w = flow.ones({ N }):to(dt), b = flow.zeros({ N }):to(dt) }
end
local OPS = { "matmul", "linear", "add", "mul", "exp", "gelu_tanh", "sum(-1)", "softmax", "layer_norm" }
local fns = {
  matmul = function(t) return flow.matmul(t.x, t.y) end,
  linear = function(t) return F.linear(t.x, t.y, t.b) end,
  add = function(t) return t.x + t.y end,
  mul = function(t) return t.x * t.y end,
  exp = function(t) return t.x:exp() end,
  gelu_tanh = function(t) return F.gelu(t.x, { approximate = "tanh" }) end,
  ["sum(-1)"] = function(t) return t.x:sum(-1) end,
  softmax = function(t) return flow.softmax(t.x, -1) end,
  layer_norm = function(t) return flow.layer_norm(t.x, t.w, t.b) end,
}
local function ms_per_call(f, t)
  local calls = 0
  f(t)
  local t0 = utils.now()
  repeat
    f(t)
    calls = calls + 1
  until utils.now() - t0 > 0.05 and calls >= 3
  return (utils.now() - t0) / calls * 1000
end
local best = { float32 = {}, [args.dtype] = {} }
for _ = 1, args.rounds do
  for _, op in ipairs(OPS) do
    for _, dt in ipairs({ "float32", args.dtype }) do
      best[dt][op] = math.min(best[dt][op] or math.huge, ms_per_call(fns[op], inputs[dt]))
    end
  end
end
print(("half: %s against float32 on the CPU, %d thread(s), 1024x1024, best of %d rounds (ms per call)"):format(
  args.dtype, flow._bench.onednn().threads, args.rounds))
print(("%-12s %9s %9s %7s"):format("op", "float32", args.dtype, "ratio"))
for _, op in ipairs(OPS) do
  local a, b = best.float32[op], best[args.dtype][op]
  print(("%-12s %9.3f %9.3f %7.2f"):format(op, a, b, b / a))
end
