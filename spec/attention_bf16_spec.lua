-- Attention in bf16 on AVX512-BF16 (kernels/cpu/attention_bf16.c): bfloat16 tensors, and float32
-- ones under bf16 autocast. Its products round q, k, v, dO, P and dS to bf16 and sum in float32;
-- the reference is the float64 kernel on the same rounded q, k, v and dO, so what is left is P's and
-- dS's rounding (relative 2^-9 each) and the order of the sums. A misplaced pair, a wrong causal
-- limit or a lost block is off by the size of the values themselves.
local flow = require "flow"
local F = flow.nn.functional

local native = flow._bench.onednn().bf16

local function it_bf16(name, fn)
  it(name, function()
    if not native then
      return pending("this CPU has no AVX512-BF16 (or FLOW_NO_BF16 is set): no bf16 kernel to test")
    end
    fn()
  end)
end

local function rounded(x) return x:bfloat16():double() end
local function maxabs(x) return x:double():abs():max():item() end
local function diff(a, b) return (a:double() - b:double()):abs():max():item() end

-- q as heads of a [B, Tq, H, D] tensor (strided, as a projection's), k dense, v as heads of [B, Tk, H, Dv]
local function inputs(c)
  local q = flow.randn({ c.B, c.Tq, c.H, c.D }):permute(0, 2, 1, 3)
  local k = flow.randn({ c.B, c.H, c.Tk, c.D })
  local v = flow.randn({ c.B, c.Tk, c.H, c.Dv }):permute(0, 2, 1, 3)
  return q, k, v, flow.randn({ c.B, c.H, c.Tq, c.Dv })
end

-- o, dq, dk, dv of sum(o * go), attention run by `call` on q, k, v converted by `to`
local function run(c, q, k, v, go, to, call)
  local qq, kk, vv = to(q):requires_grad_(true), to(k):requires_grad_(true), to(v):requires_grad_(true)
  local o = call(function() return F.scaled_dot_product_attention(qq, kk, vv, { causal = c.causal }) end)
  flow.sum(o:double() * go:double()):backward()
  return { o, qq.grad, kk.grad, vv.grad }
end

local function plain(fn) return fn() end
local function amp(fn) return flow.autocast("bfloat16", fn) end
local function same(x) return x:clone() end
local function bf16(x) return x:bfloat16() end

local cases = {
  { B = 2, H = 3, Tq = 128, Tk = 128, D = 32, Dv = 32, causal = true },   -- the benchmark GPT's heads, 2 blocks
  { B = 1, H = 2, Tq = 67, Tk = 67, D = 17, Dv = 17, causal = true },     -- odd: a lone last row, half a pair
  { B = 2, H = 1, Tq = 5, Tk = 9, D = 8, Dv = 40, causal = false },       -- Dv over one vector, Tq < Tk
  { B = 1, H = 2, Tq = 130, Tk = 77, D = 64, Dv = 3, causal = false },    -- 3 blocks, the last of 2 rows
  { B = 2, H = 2, Tq = 1, Tk = 1, D = 1, Dv = 1, causal = true },
}

describe("bf16 attention on AVX512-BF16", function()
  for _, c in ipairs(cases) do
    local name = ("B%d H%d Tq%d Tk%d D%d Dv%d%s"):format(c.B, c.H, c.Tq, c.Tk, c.D, c.Dv, c.causal and " causal" or "")
    it_bf16("matches float64 on bf16-rounded inputs, forward and backward: " .. name, function()
      flow.manual_seed(c.Tq * 7 + c.D)
      local q, k, v, go = inputs(c)
      local ref = run(c, rounded(q), rounded(k), rounded(v), rounded(go), same, plain)
      for _, mode in ipairs { { "autocast", same, amp }, { "bfloat16", bf16, plain } } do
        local got = run(c, q, k, v, go, mode[2], mode[3])
        for i, what in ipairs { "o", "dq", "dk", "dv" } do
          local tol = 0.012 * maxabs(ref[i]) + 2e-3
          assert.is_true(diff(got[i], ref[i]) <= tol,
            ("%s %s: off by %.3g, tolerance %.3g"):format(mode[1], what, diff(got[i], ref[i]), tol))
        end
        assert.are.equal(mode[1] == "autocast" and "float32" or "bfloat16", got[1].dtype)
      end
    end)
  end

  it_bf16("recomputes P from the saved log-sum-exp exactly enough for bf16: uniform attention over 3 keys", function()
    -- q = 0: every score is 0, P = 1/3 (lse = log 3, from the forward), rounded to bf16 as
    -- 0.333984375 (1/3 lies 1e-3 above the rounding midpoint, far more than exp's and log's error);
    -- dO holds small integers, so dV = 0.333984375 * the column sums of dO, exactly
    local q = flow.zeros({ 1, 1, 3, 2 }):requires_grad_(true)
    local k, v = flow.randn({ 1, 1, 3, 2 }):requires_grad_(true), flow.randn({ 1, 1, 3, 2 }):requires_grad_(true)
    local go = flow.tensor({ { { { 1, 2 }, { 3, 4 }, { 5, 6 } } } })
    amp(function() F.scaled_dot_product_attention(q, k, v):backward(go) end)
    assert.are.same({ { { { 3.005859375, 4.0078125 }, { 3.005859375, 4.0078125 }, { 3.005859375, 4.0078125 } } } },
      v.grad:totable())
  end)

  it_bf16("gives the same bits on 2 threads as on 1 (heads are independent)", function()
    local c = cases[1]
    flow.manual_seed(5)
    local q, k, v, go = inputs(c)
    local threads = flow._bench.set_threads(1)
    local one = run(c, q, k, v, go, same, amp)
    flow._bench.set_threads(2)
    local two = run(c, q, k, v, go, same, amp)
    flow._bench.set_threads(threads)
    for i = 1, 4 do assert.are.equal(0, diff(one[i], two[i])) end
  end)

  it_bf16("sees no key past the diagonal when causal: a huge later key changes no earlier row", function()
    local c = { B = 1, H = 1, Tq = 70, Tk = 70, D = 16, Dv = 16, causal = true }
    flow.manual_seed(9)
    local q, k, v = inputs(c)
    local o0 = amp(function() return F.scaled_dot_product_attention(q, k, v, { causal = true }) end)
    local k2, v2 = k:clone(), v:clone()
    k2:narrow(2, 69, 1):fill_(1e4)
    v2:narrow(2, 69, 1):fill_(1e4)
    local o1 = amp(function() return F.scaled_dot_product_attention(q, k2, v2, { causal = true }) end)
    assert.are.equal(0, diff(o0:narrow(2, 0, 69), o1:narrow(2, 0, 69)))
    assert.is_true(diff(o0:narrow(2, 69, 1), o1:narrow(2, 69, 1)) > 100)
  end)
end)
