-- Causal attention of the benchmark GPT (q, k, v as head views of one [B, T, 3 H D] projection, as
-- nn.CausalSelfAttention makes them), forward and backward, in three settings in one process:
-- float32 (oneDNN's batched GEMMs), bf16 autocast on float32 tensors, and bfloat16 tensors (both
-- attention_bf16.c's kernels on AVX512-BF16). The settings alternate round by round so all see the
-- same machine; ms per call, the best of the rounds, and each setting's time over float32's.
--   flowlua scripts/bench/attention.lua [--batch 8 --heads 8 --seq 128 --dim 32 --rounds 7]
local flow = require "flow"
local utils = require "flow.utils"
local F = flow.nn.functional

local args = utils.parse_args(arg, { batch = 8, heads = 8, seq = 128, dim = 32, rounds = 7 })
local B, H, T, D = args.batch, args.heads, args.seq, args.dim
if not flow._bench.onednn().bf16 then print("attention: this CPU has no AVX512-BF16: bf16 runs on float32 copies") end
flow.manual_seed(0)
local function inputs(dtype)
  local parts = flow.split(flow.randn({ B, T, 3 * H * D }):to(dtype), H * D, 2)
  local t = {}
  for i = 1, 3 do t[i] = flow.transpose(flow.reshape(parts[i], { B, T, H, D }), 1, 2):detach():requires_grad_(true) end
  return t, flow.randn({ B, H, T, D }):to(dtype)
end
local settings = {
  { "float32", "float32", false },
  { "bf16 autocast", "float32", true },
  { "bfloat16", "bfloat16", false },
}
for _, s in ipairs(settings) do s.qkv, s.go = inputs(s[2]) end

-- ms of one forward and of one backward (inside the autocast region when the setting has one)
local function once(s)
  local fwd, bwd
  local function run()
    local t0 = utils.now()
    local o = F.scaled_dot_product_attention(s.qkv[1], s.qkv[2], s.qkv[3], { causal = true })
    local t1 = utils.now()
    o:backward(s.go)
    fwd, bwd = t1 - t0, utils.now() - t1
  end
  if s[3] then flow.autocast("bfloat16", run) else run() end
  for i = 1, 3 do s.qkv[i].grad = nil end
  return fwd * 1e3, bwd * 1e3
end

for _, s in ipairs(settings) do
  once(s)
  s.fwd, s.bwd = math.huge, math.huge
end
for _ = 1, args.rounds do
  for _, s in ipairs(settings) do
    for _ = 1, 5 do
      local f, b = once(s)
      s.fwd, s.bwd = math.min(s.fwd, f), math.min(s.bwd, b)
    end
  end
end
print(("attention: B%d H%d T%d D%d causal, %d thread(s), best of %d rounds of 5 (ms per call)"):format(B, H, T, D,
  flow._bench.onednn().threads, args.rounds))
print(("%-14s %9s %9s %9s %7s"):format("setting", "forward", "backward", "total", "ratio"))
local ref = settings[1].fwd + settings[1].bwd
for _, s in ipairs(settings) do
  print(("%-14s %9.3f %9.3f %9.3f %7.2f"):format(s[1], s.fwd, s.bwd, s.fwd + s.bwd, (s.fwd + s.bwd) / ref))
end
