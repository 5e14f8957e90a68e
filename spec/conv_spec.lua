-- conv2d, max_pool2d, avg_pool2d and batch_norm against naive Lua loops; the modules; errors.
local flow = require "flow"
local nn = flow.nn

local F64 = { dtype = "float64" }

local function close(a, b, tol)
  tol = tol or 1e-9
  if type(a) == "table" then
    assert.are.equal(#b, #a)
    for i = 1, #a do close(a[i], b[i], tol) end
    return
  end
  assert(math.abs(a - b) <= tol * (1 + math.abs(b)), ("%.12g vs %.12g"):format(a, b))
end

local function pair(v) return type(v) == "table" and v or { v, v } end

-- y[n][o][oh][ow] = b[o] + sum over the group's channels and the (dilated) window, zero padding.
local function conv_by_hand(x, w, b, o)
  o = o or {}
  local s, p, d, G = pair(o.stride or 1), pair(o.padding or 0), pair(o.dilation or 1), o.groups or 1
  local N, C, H, W = #x, #x[1], #x[1][1], #x[1][1][1]
  local O, Cg, kh, kw = #w, #w[1], #w[1][1], #w[1][1][1]
  local OH = (H + 2 * p[1] - d[1] * (kh - 1) - 1) // s[1] + 1
  local OW = (W + 2 * p[2] - d[2] * (kw - 1) - 1) // s[2] + 1
  local Og = O // G
  local y = {}
  for n = 1, N do
    y[n] = {}
    for oc = 1, O do
      y[n][oc] = {}
      local g = (oc - 1) // Og
      for oh = 1, OH do
        y[n][oc][oh] = {}
        for ow = 1, OW do
          local acc = b and b[oc] or 0
          for c = 1, Cg do
            for i = 1, kh do
              for j = 1, kw do
                local ih = (oh - 1) * s[1] - p[1] + (i - 1) * d[1] + 1
                local iw = (ow - 1) * s[2] - p[2] + (j - 1) * d[2] + 1
                if ih >= 1 and ih <= H and iw >= 1 and iw <= W then
                  acc = acc + x[n][g * Cg + c][ih][iw] * w[oc][c][i][j]
                end
              end
            end
          end
          y[n][oc][oh][ow] = acc
        end
      end
    end
  end
  return y
end

local function pool_by_hand(x, k, s, p, max)
  k, s, p = pair(k), pair(s or k), pair(p or 0)
  local H, W = #x[1][1], #x[1][1][1]
  local OH, OW = (H + 2 * p[1] - k[1]) // s[1] + 1, (W + 2 * p[2] - k[2]) // s[2] + 1
  local y = {}
  for n = 1, #x do
    y[n] = {}
    for c = 1, #x[1] do
      y[n][c] = {}
      for oh = 1, OH do
        y[n][c][oh] = {}
        for ow = 1, OW do
          local acc = max and -math.huge or 0
          for i = 1, k[1] do
            for j = 1, k[2] do
              local ih, iw = (oh - 1) * s[1] - p[1] + i, (ow - 1) * s[2] - p[2] + j
              if ih >= 1 and ih <= H and iw >= 1 and iw <= W then
                local v = x[n][c][ih][iw]
                if max then acc = math.max(acc, v) else acc = acc + v end
              end
            end
          end
          y[n][c][oh][ow] = max and acc or acc / (k[1] * k[2])
        end
      end
    end
  end
  return y
end

describe("conv2d", function()
  local cases = {
    { "plain", { 2, 3, 5, 4 }, { 4, 3, 3, 3 }, true, {} },
    { "stride 2, padding 1", { 1, 2, 6, 5 }, { 3, 2, 3, 2 }, true, { stride = 2, padding = 1 } },
    { "stride and padding pairs", { 1, 2, 5, 6 }, { 2, 2, 2, 3 }, false, { stride = { 1, 2 }, padding = { 2, 0 } } },
    { "dilation 2", { 2, 1, 7, 6 }, { 2, 1, 3, 2 }, true, { dilation = { 2, 3 } } },
    { "groups 2", { 2, 4, 4, 4 }, { 6, 2, 2, 2 }, true, { groups = 2, padding = 1 } },
    { "depthwise", { 1, 3, 4, 5 }, { 3, 1, 3, 3 }, false, { groups = 3, stride = 2, padding = 1 } },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " matches the naive loop (float64 and float32)", function()
      local x, w = flow.randn(c[2], F64), flow.randn(c[3], F64)
      local b = c[4] and flow.randn({ c[3][1] }, F64) or nil
      local want = conv_by_hand(x:totable(), w:totable(), b and b:totable(), c[5])
      close(flow.conv2d(x, w, b, c[5]):totable(), want)
      local y32 = flow.conv2d(x:float(), w:float(), b and b:float(), c[5])
      assert.are.equal("float32", y32.dtype)
      close(y32:totable(), want, 1e-4)
    end)
  end

  it("takes a transposed (strided) input", function()
    local x, w = flow.randn({ 1, 2, 4, 5 }, F64), flow.randn({ 2, 2, 2, 2 }, F64)
    local xt = flow.transpose(x, 2, 3)
    close(flow.conv2d(xt, w):totable(), conv_by_hand(xt:contiguous():totable(), w:totable()))
  end)

  it("backward gives dbias = sum of dy and dx, dw of the right shapes", function()
    local x = flow.randn({ 2, 2, 4, 4 }, { dtype = "float64", requires_grad = true })
    local w = flow.randn({ 3, 2, 3, 3 }, { dtype = "float64", requires_grad = true })
    local b = flow.randn({ 3 }, { dtype = "float64", requires_grad = true })
    flow.conv2d(x, w, b, { padding = 1 }):sum():backward()
    close(b.grad:totable(), { 32, 32, 32 })
    assert.are.same({ 2, 2, 4, 4 }, x.grad:shape())
    assert.are.same({ 3, 2, 3, 3 }, w.grad:shape())
    -- a 1x1 kernel of ones: dx = number of output channels everywhere
    local x1 = flow.randn({ 1, 2, 2, 2 }, { dtype = "float64", requires_grad = true })
    flow.conv2d(x1, flow.ones({ 3, 2, 1, 1 }, F64)):sum():backward()
    close(x1.grad:sum():item(), 3 * 8)
  end)

  it("names the op and the shapes on bad input", function()
    local x = flow.randn({ 1, 4, 5, 5 })
    local ok, err = pcall(flow.conv2d, x, flow.randn({ 2, 3, 3, 3 }))
    assert.is_false(ok)
    assert.matches("conv2d: input {1,4,5,5} and weight {2,3,3,3} do not match", err)
    ok, err = pcall(flow.conv2d, x, flow.randn({ 3, 2, 3, 3 }), nil, { groups = 2 })
    assert.is_false(ok)
    assert.matches("conv2d: .*groups = 2", err)
    ok, err = pcall(flow.conv2d, x, flow.randn({ 2, 4, 3, 3 }), flow.randn({ 3 }))
    assert.matches("conv2d: bias must have shape {2}", err)
    ok, err = pcall(flow.conv2d, flow.randn({ 4, 5, 5 }), flow.randn({ 2, 4, 3, 3 }))
    assert.matches("conv2d: input must be 4%-d %[N, C, H, W%], got {4,5,5}", err)
    ok, err = pcall(flow.conv2d, x, flow.randn({ 2, 4, 7, 3 }))
    assert.matches("conv2d: window of 7 .* does not fit the padded input size 5", err)
    ok, err = pcall(flow.conv2d, x, flow.randn({ 2, 4, 3, 3 }, F64))
    assert.matches("conv2d: weight is float64 but the input is float32", err)
    ok, err = pcall(flow.conv2d, x, flow.randn({ 2, 4, 3, 3 }), nil, { stride = 0 })
    assert.matches("conv2d: kernel 3, stride 0", err)
    ok, err = pcall(flow.conv2d, x:long(), flow.randn({ 2, 4, 3, 3 }))
    assert.matches("conv2d: input must be float32 or float64", err)
    ok, err = pcall(flow.conv2d, x, "w")
    assert.matches("conv2d", err)
  end)
end)

describe("pooling", function()
  local cases = {
    { "2x2", { 2, 3, 4, 6 }, 2 },
    { "3x3 stride 1 padding 1", { 1, 2, 5, 4 }, 3, 1, 1 },
    { "3x2 stride {2, 1} padding {1, 0}", { 1, 2, 6, 5 }, { 3, 2 }, { 2, 1 }, { 1, 0 } },
  }
  for _, c in ipairs(cases) do
    it(c[1] .. " matches the naive loop", function()
      local x = flow.randn(c[2], F64)
      local o = { kernel = c[3], stride = c[4], padding = c[5] }
      close(flow.max_pool2d(x, o):totable(), pool_by_hand(x:totable(), c[3], c[4], c[5], true))
      close(flow.avg_pool2d(x, o):totable(), pool_by_hand(x:totable(), c[3], c[4], c[5], false))
    end)
  end

  it("takes the kernel as argument 2", function()
    local x = flow.randn({ 1, 1, 4, 4 }, F64)
    close(flow.max_pool2d(x, 2):totable(), pool_by_hand(x:totable(), 2, 2, 0, true))
    close(flow.avg_pool2d(x, { 2, 1 }, { stride = 1 }):totable(), pool_by_hand(x:totable(), { 2, 1 }, 1, 0, false))
  end)

  it("max_pool2d sends the gradient to the window maximum; avg_pool2d spreads it", function()
    local x = flow.tensor({ { { { 1, 5, 2, 0 }, { 3, 4, 9, 1 } } } }, { dtype = "float64", requires_grad = true })
    flow.max_pool2d(x, 2):sum():backward()
    assert.are.same({ { { { 0, 1, 0, 0 }, { 0, 0, 1, 0 } } } }, x.grad:totable())
    x.grad = nil
    flow.avg_pool2d(x, 2):sum():backward()
    assert.are.same({ { { { 0.25, 0.25, 0.25, 0.25 }, { 0.25, 0.25, 0.25, 0.25 } } } }, x.grad:totable())
  end)

  it("names the op on bad input", function()
    local ok, err = pcall(flow.max_pool2d, flow.randn({ 1, 1, 3, 3 }), 4)
    assert.is_false(ok)
    assert.matches("max_pool2d: window of 4 .* does not fit the padded input size 3", err)
    ok, err = pcall(flow.avg_pool2d, flow.randn({ 3, 3 }), 2)
    assert.matches("avg_pool2d: input must be 4%-d %[N, C, H, W%], got {3,3}", err)
    ok, err = pcall(flow.avg_pool2d, flow.randn({ 1, 1, 3, 3 }), { kernel = 2, padding = 2 })
    assert.matches("avg_pool2d: padding %(2, 2%) must be at most half the kernel", err)
    ok, err = pcall(flow.max_pool2d, flow.randn({ 1, 1, 3, 3 }))
    assert.matches("max_pool2d: kernel size is required", err)
  end)
end)

describe("batch_norm", function()
  -- per channel over N and the spatial axes, in plain Lua
  local function bn_by_hand(x, w, b, mean, var, eps)
    local y = {}
    for n = 1, #x do
      y[n] = {}
      for c = 1, #x[1] do
        y[n][c] = {}
        for k = 1, #x[n][c] do
          y[n][c][k] = (x[n][c][k] - mean[c]) / math.sqrt(var[c] + eps) * w[c] + b[c]
        end
      end
    end
    return y
  end

  it("training: batch statistics, running stats updated with the unbiased variance", function()
    local x = flow.randn({ 3, 2, 4 }, F64)
    local w, b = flow.randn({ 2 }, F64), flow.randn({ 2 }, F64)
    local rm, rv = flow.tensor({ 0.5, -1 }, F64), flow.tensor({ 2, 3 }, F64)
    local y = flow.batch_norm(x, w, b, rm, rv, { training = true, momentum = 0.2, eps = 1e-3 })
    local xt = x:totable()
    local mean, var, uvar = {}, {}, {}
    for c = 1, 2 do
      local s, q, M = 0, 0, 0
      for n = 1, 3 do for k = 1, 4 do s = s + xt[n][c][k]; M = M + 1 end end
      mean[c] = s / M
      for n = 1, 3 do for k = 1, 4 do q = q + (xt[n][c][k] - mean[c]) ^ 2 end end
      var[c], uvar[c] = q / M, q / (M - 1)
    end
    close(y:totable(), bn_by_hand(xt, w:totable(), b:totable(), mean, var, 1e-3))
    close(rm:totable(), { 0.8 * 0.5 + 0.2 * mean[1], 0.8 * -1 + 0.2 * mean[2] })
    close(rv:totable(), { 0.8 * 2 + 0.2 * uvar[1], 0.8 * 3 + 0.2 * uvar[2] })
  end)

  it("eval: running statistics, left unchanged", function()
    local x = flow.randn({ 2, 3, 2, 2 }, F64)
    local w, b = flow.randn({ 3 }, F64), flow.randn({ 3 }, F64)
    local rm, rv = flow.tensor({ 0.1, 0.2, -0.3 }, F64), flow.tensor({ 1, 0.5, 2 }, F64)
    local y = flow.batch_norm(x, w, b, rm, rv)
    local flat = x:reshape({ 2, 3, 4 }):totable()
    close(y:reshape({ 2, 3, 4 }):totable(), bn_by_hand(flat, w:totable(), b:totable(), rm:totable(), rv:totable(), 1e-5))
    close(rm:totable(), { 0.1, 0.2, -0.3 })
    close(rv:totable(), { 1, 0.5, 2 })
  end)

  it("names the op and the shapes on bad input", function()
    local x = flow.randn({ 2, 3, 2, 2 })
    local ok, err = pcall(flow.batch_norm, x, flow.ones({ 4 }), flow.zeros({ 3 }), flow.zeros({ 3 }), flow.ones({ 3 }))
    assert.is_false(ok)
    assert.matches("batch_norm: weight must have shape {3} %(the channels of the input {2,3,2,2}%), got {4}", err)
    ok, err = pcall(flow.batch_norm, x, flow.ones({ 3 }), flow.zeros({ 3 }), flow.zeros({ 3 }, F64), flow.ones({ 3 }))
    assert.matches("batch_norm: running_mean is float64 but the input is float32", err)
    ok, err = pcall(flow.batch_norm, flow.randn({ 3 }), flow.ones({ 3 }), flow.zeros({ 3 }), flow.zeros({ 3 }), flow.ones({ 3 }))
    assert.matches("batch_norm: input must be at least 2%-d", err)
    ok, err = pcall(flow.batch_norm, x, flow.ones({ 3 }))
    assert.matches("batch_norm", err)
  end)
end)

describe("nn modules", function()
  it("Conv2d, MaxPool2d, AvgPool2d, BatchNorm2d compose and train", function()
    flow.manual_seed(1)
    local conv = nn.Conv2d(2, 4, 3, { padding = 1, dtype = "float64" })
    assert.are.same({ 4, 2, 3, 3 }, conv.weight:shape())
    local bn = nn.BatchNorm2d(4, { dtype = "float64" })
    local x = flow.randn({ 2, 2, 4, 4 }, F64)
    local y = nn.MaxPool2d(2)(bn(conv(x)))
    assert.are.same({ 2, 4, 2, 2 }, y:shape())
    close(y:totable(), pool_by_hand(bn(conv(x)):totable(), 2, 2, 0, true))
    assert.are.same({ 2, 4, 1, 1 }, nn.AvgPool2d(2, 2)(y):shape())
    y:sum():backward()
    assert.are.same({ 4, 2, 3, 3 }, conv.weight.grad:shape())
    assert.are.same({ 4 }, bn.weight.grad:shape())
    assert.is_true(bn.running_mean:abs():sum():item() > 0)
    bn:eval()
    local y2 = bn(conv(x))
    assert.are.same({ 2, 4, 4, 4 }, y2:shape())
    local names = {}
    for _, p in ipairs(nn.Sequential(conv, bn):named_parameters()) do names[#names + 1] = p[1] end
    assert.are.equal(4, #names)
  end)
end)
