-- Run by spec/threads_spec.lua under FLOW_NUM_THREADS=2 and =4: GEMMs big enough to be cut into one
-- piece per thread (kernels/cpu/onednn.c, split) along each axis it cuts, against the float64
-- reference loop and against the same GEMM run whole on oneDNN's threads. Prints "cut N" (the cases
-- checked) and fails with the first case off.
local flow = require "flow"
local F = flow.nn.functional

local threads = flow._bench.onednn().threads
local bf16 = flow._bench.onednn().bf16

-- max |a - b| / (1 + max |b|)
local function rel_err(a, b)
  local d = (a:double() - b:double()):abs():max():item()
  return d / (1 + b:double():abs():max():item())
end

local function whole(f)
  local was = flow._bench.gemm_whole(true)
  local ok, y = pcall(f)
  flow._bench.gemm_whole(was)
  assert(ok, y)
  return y
end

local checked = 0
-- f() computes op(a) @ op(b) (+ bias) on float32 a, b; ref is the product in float64
local function check(name, f, ref, tol)
  local y = f()
  local e = rel_err(y, ref)
  assert(e < tol, ("%s on %d threads: off the reference by %g (at most %g)"):format(name, threads, e, tol))
  local w = whole(f)
  e = rel_err(y, w)
  assert(e < tol, ("%s on %d threads: off the whole GEMM by %g (at most %g)"):format(name, threads, e, tol))
  checked = checked + 1
end

local function reference(a, b, ta, tb)
  local y = flow.matmul(a, b, { transpose_a = ta, transpose_b = tb })
  local out = flow.zeros(y:shape(), { dtype = flow.float64 })
  flow._bench.matmul_reference(out, a:double(), b:double(), ta, tb)
  return out
end

flow.manual_seed(5)
-- M and N cut into pieces of at least 32 rows (columns) on up to 4 threads, 2^20 or more multiply-adds
local mats = {
  { "M cut", 256, 96, 64 },          -- M >= N
  { "N cut", 64, 96, 256 },          -- M / threads under 32
  { "N cut, M odd", 250, 96, 256 },  -- M does not divide
  { "M > N, K long", 256, 512, 64 },  -- a weight's gradient (A transposed) runs whole on oneDNN's threads
}
for _, m in ipairs(mats) do
  local name, M, K, N = table.unpack(m)
  for _, t in ipairs { { false, false }, { true, false }, { false, true }, { true, true } } do
    local a = flow.randn(t[1] and { K, M } or { M, K })
    local b = flow.randn(t[2] and { N, K } or { K, N })
    local label = ("%s %dx%dx%d transposes %s %s"):format(name, M, K, N, t[1], t[2])
    local ref = reference(a, b, t[1], t[2])
    check(label, function() return flow.matmul(a, b, { transpose_a = t[1], transpose_b = t[2] }) end, ref, 1e-5)
    if bf16 then
      local ra, rb = a:bfloat16():float(), b:bfloat16():float()
      check(label .. " bf16", function()
        return flow.autocast("bfloat16", function() return flow.matmul(a, b, { transpose_a = t[1], transpose_b = t[2] }) end)
      end, reference(ra, rb, t[1], t[2]), 1e-5)
    end
  end
end

-- the bias follows the cut columns
for _, s in ipairs { { 256, 96, 64 }, { 64, 96, 256 } } do
  local M, K, N = s[1], s[2], s[3]
  local x, w, bias = flow.randn({ M, K }), flow.randn({ N, K }), flow.randn({ N })
  local ref = reference(x, w, false, true) + bias:double()
  check(("linear %dx%dx%d with bias"):format(M, K, N), function() return F.linear(x, w, bias) end, ref, 1e-5)
end

-- batch axis 0, also where one side broadcasts it
local batched = {
  { { 4, 2, 64, 48 }, { 4, 2, 48, 64 } },
  { { 8, 64, 48 }, { 48, 64 } },
  { { 48, 64 }, { 8, 64, 48 } },
}
for _, s in ipairs(batched) do
  local a, b = flow.randn(s[1]), flow.randn(s[2])
  check(("batched %s @ %s"):format(table.concat(s[1], "x"), table.concat(s[2], "x")),
        function() return flow.matmul(a, b) end, reference(a, b, false, false), 1e-5)
end

-- bf16: the threads share the rounding of a strided operand (attention's q heads of one qkv, 2^18
-- elements) line by line; its copy must hold the bits of the contiguous operand's
if bf16 then
  local B, T, H, D = 8, 128, 8, 32
  local parts = flow.split(flow.randn({ B, T, 3 * H * D }), H * D, 2)
  local function heads(t) return flow.transpose(flow.reshape(t, { B, T, H, D }), 1, 2) end
  local q, k = heads(parts[1]), heads(parts[2])
  local s, s0 = flow.autocast("bfloat16", function()
    return flow.matmul(q, k, { transpose_b = true }), flow.matmul(q:contiguous(), k:contiguous(), { transpose_b = true })
  end)
  local d = (s - s0):abs():max():item()
  assert(d == 0, ("bf16 q k^T of strided heads on %d threads: off the contiguous operands' by %g"):format(threads, d))
  checked = checked + 1
end

print("cut " .. checked)
