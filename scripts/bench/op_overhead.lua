-- Per-op overhead of small eager ops: µs per `a + b` on 4-element float32 tensors and per
-- flow.matmul on 8x8, against a plain Lua function doing the same table work, measured in the
-- same run. Usage: flowlua scripts/bench/op_overhead.lua [iterations]
local flow = require "flow"

local N = tonumber(arg and arg[1]) or 50000
local REPEATS = 15 -- short runs, many of them: the minimum filters out interference
local TORCH_US = 0.8 -- PyTorch's typical eager op overhead on CPU (stated, not measured here)
local now = flow.now

-- Best (smallest) µs per call of fn over REPEATS runs of `n` calls. No collectgarbage() between
-- runs: the steady state of the generational collector is what a training loop sees, and a forced
-- full collection measurably slows the small-op loop that follows it.
local function per_call_us(fn, n)
  local best = math.huge
  for _ = 1, REPEATS do
    local t0 = now()
    fn(n)
    best = math.min(best, now() - t0)
  end
  return best / n * 1e6
end

local a = flow.tensor({1, 2, 3, 4})
local b = flow.tensor({5, 6, 7, 8})
local add_us = per_call_us(function(n)
  for _ = 1, n do local _ = a + b end
end, N)

local m1, m2 = flow.ones({8, 8}), flow.ones({8, 8})
local matmul_us = per_call_us(function(n)
  for _ = 1, n do local _ = flow.matmul(m1, m2) end
end, N // 2)

-- What of the matmul figure is BLAS itself: cblas_sgemm on the same 8x8 data, called from C.
local c8 = flow.zeros({8, 8})
local sgemm_us = math.huge
for _ = 1, REPEATS do sgemm_us = math.min(sgemm_us, flow._bench.sgemm(m1, m2, c8, N // 2) * 1e6) end

-- The reference: a Lua function call that builds the result table of a 4-element add.
local function lua_add(x, y)
  return {x[1] + y[1], x[2] + y[2], x[3] + y[3], x[4] + y[4]}
end
local la, lb = {1, 2, 3, 4}, {5, 6, 7, 8}
local lua_us = per_call_us(function(n)
  for _ = 1, n do local _ = lua_add(la, lb) end
end, N)

print(("op overhead (min of %d runs, %d iterations; OPENBLAS_NUM_THREADS=%s)")
  :format(REPEATS, N, os.getenv("OPENBLAS_NUM_THREADS") or "unset"))
print(("  %-34s %8.3f µs"):format("Lua function + 4-element table", lua_us))
print(("  %-34s %8.3f µs   %6.1fx Lua   %5.2fx PyTorch (%.1f µs)")
  :format("a + b, float32 [4]", add_us, add_us / lua_us, add_us / TORCH_US, TORCH_US))
print(("  %-34s %8.3f µs   %6.1fx Lua   %5.2fx PyTorch (%.1f µs)")
  :format("flow.matmul float32 [8,8]x[8,8]", matmul_us, matmul_us / lua_us, matmul_us / TORCH_US, TORCH_US))
print(("  %-34s %8.3f µs   (flow.matmul overhead over BLAS: %.3f µs)")
  :format("cblas_sgemm [8,8]x[8,8] from C", sgemm_us, matmul_us - sgemm_us))
