-- GFLOP/s of flow.matmul (float32, square) against cblas_sgemm called directly from C on the
-- same tensors in the same run (flow._bench.sgemm), and the ratio between them.
-- Usage: flowlua scripts/bench/matmul.lua [sizes...]   (default 256 512 1024 2048)
local flow = require "flow"

local sizes = {}
for i = 1, #(arg or {}) do sizes[#sizes + 1] = math.tointeger(tonumber(arg[i])) end
if #sizes == 0 then sizes = {256, 512, 1024, 2048} end
local now = flow.now
local REPEATS = 3

-- Enough calls for about 0.2 s of work at ~50 GFLOP/s, at least 2.
local function iterations(n)
  return math.max(2, math.floor(1e10 / (2 * n ^ 3)))
end

print(("matmul float32, min of %d runs (OPENBLAS_NUM_THREADS=%s)")
  :format(REPEATS, os.getenv("OPENBLAS_NUM_THREADS") or "unset"))
print(("  %6s %14s %14s %8s"):format("n", "flow GFLOP/s", "BLAS GFLOP/s", "ratio"))
for _, n in ipairs(sizes) do
  local a = flow.ones({n, n}) * 0.5
  local b = flow.ones({n, n}) * 0.25
  local c = flow.zeros({n, n})
  local iters = iterations(n)
  flow.matmul(a, b)                          -- warm-up: allocator, BLAS threads
  flow._bench.sgemm(a, b, c, 1)
  local flow_s, blas_s = math.huge, math.huge
  for _ = 1, REPEATS do
    local t0 = now()
    for _ = 1, iters do local _ = flow.matmul(a, b) end
    flow_s = math.min(flow_s, (now() - t0) / iters)
    blas_s = math.min(blas_s, flow._bench.sgemm(a, b, c, iters))
    collectgarbage()
  end
  local flop = 2 * n ^ 3
  print(("  %6d %14.1f %14.1f %8.3f"):format(n, flop / flow_s / 1e9, flop / blas_s / 1e9, blas_s / flow_s))
end
