-- flow.matmul on the GPU against cuBLAS called directly (flow.cuda._bench_gemm) on the same
-- tensors, at N x N x N (default 8192), bf16 and float32 with tf32; prints TFLOP/s and the ratio.
--   flowlua scripts/bench/gpu_matmul.lua [N] [iters]
local flow = require "flow"

if not flow.cuda.is_available() then
  print("gpu_matmul: skipped (no GPU: " .. tostring(flow.cuda.unavailable_reason()) .. ")")
  return
end

local N = tonumber(arg and arg[1]) or 8192
local iters = tonumber(arg and arg[2]) or 20

local function time_flow(a, b)
  local c = flow.matmul(a, b) -- warm-up (cuBLAS heuristics, allocator)
  c = nil
  collectgarbage()
  flow.cuda.synchronize()
  local t0 = flow.now()
  for _ = 1, iters do
    c = flow.matmul(a, b)
    c:free() -- hand the block back to the caching allocator at once
  end
  flow.cuda.synchronize()
  return (flow.now() - t0) / iters
end

for _, case in ipairs({ { "bf16", "bfloat16", false }, { "tf32", "float32", true } }) do
  local label, dtype, tf32 = case[1], case[2], case[3]
  flow.backends.allow_tf32 = tf32
  local a = flow.randn({ N, N }):to({ device = "cuda", dtype = dtype })
  local b = flow.randn({ N, N }):to({ device = "cuda", dtype = dtype })
  local c = flow.zeros({ N, N }, { device = "cuda", dtype = dtype })
  local t_flow = time_flow(a, b)
  local t_ref = flow.cuda._bench_gemm(a, b, c, iters)
  local tflops = function(t) return 2 * N ^ 3 / t / 1e12 end
  print(("gpu_matmul %s N=%d: flow %.1f TFLOP/s (%.3f ms), cuBLAS %.1f TFLOP/s (%.3f ms), ratio flow/cuBLAS %.3f")
    :format(label, N, tflops(t_flow), t_flow * 1e3, tflops(t_ref), t_ref * 1e3, t_ref / t_flow))
  a, b, c = nil, nil, nil
  collectgarbage()
  flow.cuda.empty_cache()
end
flow.backends.allow_tf32 = false
