-- Per-op overhead of small eager ops: µs per `a + b` on 4-element float32 tensors and per
-- flow.matmul on 8x8, against a plain Lua function doing the same table work, measured in the
-- same run. Usage: flowlua scripts/bench/op_overhead.lua [iterations]
local flow = require "flow"

local N = tonumber(arg and arg[1]) or 50000
local REPEATS = 15 -- short runs, many of them: the minimum filters out interference
-- PyTorch's eager overhead, measured in this command when Debian's python3-torch is installed
-- (same loops, one thread, min of repeats); else its typical figure on CPU, as a stated constant.
local TORCH_US, TORCH_MM_US, torch_note = 0.8, 0.8, "stated, not measured"
do
  local py = [[
import time, torch
torch.set_num_threads(1)
a, b, m1, m2 = torch.ones(4), torch.ones(4), torch.ones(8, 8), torch.ones(8, 8)
def best(f, n=50000):
    r = 1e9
    for _ in range(7):
        t0 = time.perf_counter(); f(n); r = min(r, time.perf_counter() - t0)
    return r / n * 1e6
def add(n):
    for _ in range(n): a + b
def mm(n):
    for _ in range(n): torch.matmul(m1, m2)
print("torch %.4f %.4f" % (best(add), best(mm)))
]]
  local p = io.popen("/usr/bin/python3 -c '" .. py .. "' 2>/dev/null")
  local out = p and p:read("a") or ""
  if p then p:close() end
  local add_t, mm_t = out:match("torch ([%d.]+) ([%d.]+)")
  if add_t then TORCH_US, TORCH_MM_US, torch_note = tonumber(add_t), tonumber(mm_t), "measured now" end
end
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

local a = flow.tensor({1, 2, 3, 4}, {dtype = "float32"})
local b = flow.tensor({5, 6, 7, 8}, {dtype = "float32"})
local add_us = per_call_us(function(n)
  for _ = 1, n do local _ = a + b end
end, N)

local m1, m2 = flow.ones({8, 8}), flow.ones({8, 8})
local matmul_us = per_call_us(function(n)
  for _ = 1, n do local _ = flow.matmul(m1, m2) end
end, N // 2)

-- What of the matmul figure is the GEMM itself: oneDNN's matmul primitive on the same 8x8 data, called from C.
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

print(("op overhead (min of %d runs, %d iterations; %d oneDNN thread(s))")
  :format(REPEATS, N, flow._bench.onednn().threads))
print(("  %-34s %8.3f µs"):format("Lua function + 4-element table", lua_us))
print(("  %-34s %8.3f µs   %6.1fx Lua   %5.2fx PyTorch (%.3f µs, %s)")
  :format("a + b, float32 [4]", add_us, add_us / lua_us, add_us / TORCH_US, TORCH_US, torch_note))
print(("  %-34s %8.3f µs   %6.1fx Lua   %5.2fx PyTorch (%.3f µs, %s)")
  :format("flow.matmul float32 [8,8]x[8,8]", matmul_us, matmul_us / lua_us, matmul_us / TORCH_MM_US, TORCH_MM_US, torch_note))
print(("  %-34s %8.3f µs   (flow.matmul overhead over the GEMM: %.3f µs)")
  :format("oneDNN matmul [8,8]x[8,8] from C", sgemm_us, matmul_us - sgemm_us))
