-- Eager memory reuse without free(): (1) `for i = 1, 12 do local c = flow.matmul(a, b) end` against
-- oneDNN called directly on the same tensors in the same run (flow._bench.sgemm), at 512..2048:
-- dead outputs must come back to the caching allocator before fresh pages are needed; (2) the
-- peak RSS growth of a 10,000-iteration loop of 4 MB ops (`c = a + b`) against its live set.
-- Usage: FLOW_NUM_THREADS=1 flowlua scripts/bench/eager_memory.lua
local flow = require "flow"
local now = flow.now

-- kB of a /proc/self/status field (VmRSS now, VmHWM the peak so far)
local function status_kb(field)
  local f = io.open("/proc/self/status")
  if not f then return nil end
  local kb = tonumber(f:read("a"):match(field .. ":%s*(%d+)"))
  f:close()
  return kb
end

collectgarbage()
local x, y = flow.randn({ 1024, 1024 }), flow.randn({ 1024, 1024 })   -- 4 MB each
local c = x + y
local base = status_kb("VmRSS")
print(("eager memory, %d oneDNN thread(s)"):format(flow._bench.onednn().threads))
if base then
  local live = 3 * 4 * 1024                                           -- x, y and c, in kB
  for _ = 1, 10000 do c = x + y end
  local growth = status_kb("VmHWM") - base
  print(("10,000 x (4 MB add): peak RSS %.1f MB above the start, with a %.0f MB live set: peak %.2fx the live set"):format(
    growth / 1024, live / 1024, (live + growth) / live))
else
  print("peak RSS: /proc/self/status not readable here")
end
x, y, c = nil, nil, nil
collectgarbage()

print(("  %6s %14s"):format("n", "loop / direct"))
for _, n in ipairs { 512, 1024, 2048 } do
  local a, b, c = flow.randn({ n, n }), flow.randn({ n, n }), flow.zeros({ n, n })
  local op_s, ref_s = math.huge, math.huge
  for _ = 1, 3 do
    local t0 = now()
    for _ = 1, 12 do local _ = flow.matmul(a, b) end
    op_s = math.min(op_s, (now() - t0) / 12)
    ref_s = math.min(ref_s, flow._bench.sgemm(a, b, c, 12))
  end
  print(("  %6d %14.3f"):format(n, ref_s / op_s))
end
