-- GFLOP/s of flow.matmul (float32, square) against oneDNN's matmul primitive called directly from C
-- on the same tensors in the same run (flow._bench.sgemm), and the ratio between them; then the
-- op overhead of a small (8x8) matmul: µs per flow.matmul minus µs per direct call.
-- Usage: flowlua scripts/bench/matmul.lua [sizes...]   (default 256 512 1024 2048)
-- Threads: FLOW_NUM_THREADS (else OMP_NUM_THREADS, else every core; 1 per rank under mpirun).
local flow = require "flow"

local sizes = {}
for i = 1, #(arg or {}) do sizes[#sizes + 1] = math.tointeger(tonumber(arg[i])) end
if #sizes == 0 then sizes = {256, 512, 1024, 2048} end
local now = flow.now
local REPEATS = 3

-- Enough calls for about 0.2 s of work at ~100 GFLOP/s, at least 2.
local function iterations(n)
  return math.max(2, math.floor(2e10 / (2 * n ^ 3)))
end

print(("matmul float32, min of %d runs, %d oneDNN thread(s)"):format(REPEATS, flow._bench.onednn().threads))
print(("  %6s %14s %14s %8s"):format("n", "flow GFLOP/s", "oneDNN GFLOP/s", "ratio"))
for _, n in ipairs(sizes) do
  local a = flow.ones({n, n}) * 0.5
  local b = flow.ones({n, n}) * 0.25
  local c = flow.zeros({n, n})
  local iters = iterations(n)
  flow.matmul(a, b)                          -- warm-up: allocator, primitive cache
  flow._bench.sgemm(a, b, c, 1)
  local flow_s, ref_s = math.huge, math.huge
  for _ = 1, REPEATS do
    local t0 = now()
    for _ = 1, iters do local _ = flow.matmul(a, b) end
    flow_s = math.min(flow_s, (now() - t0) / iters)
    ref_s = math.min(ref_s, flow._bench.sgemm(a, b, c, iters))
    collectgarbage()
  end
  local flop = 2 * n ^ 3
  print(("  %6d %14.1f %14.1f %8.3f"):format(n, flop / flow_s / 1e9, flop / ref_s / 1e9, ref_s / flow_s))
end

-- 8x8: the op around the GEMM (dispatch, output allocation) is what costs
local a, b, c = flow.ones({8, 8}), flow.ones({8, 8}), flow.zeros({8, 8})
local N = 20000
local op_s, ref_s = math.huge, math.huge
for _ = 1, REPEATS do
  local t0 = now()
  for _ = 1, N do local _ = flow.matmul(a, b) end
  op_s = math.min(op_s, (now() - t0) / N)
  ref_s = math.min(ref_s, flow._bench.sgemm(a, b, c, N))
  collectgarbage()
end
print(("8x8: flow.matmul %.2f µs, oneDNN directly %.2f µs: op overhead %.2f µs"):format(
  op_s * 1e6, ref_s * 1e6, (op_s - ref_s) * 1e6))
