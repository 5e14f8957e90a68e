-- Bad input never crashes: the issue-13 reproducers, hostile safetensors files, and a seeded
-- random-API fuzzer (spec/support/fuzz.lua) run in a child flowlua under a 256 MiB allocation cap.
local flow = require "flow"

local function err_of(f, ...)
  local ok, e = pcall(f, ...)
  assert.is_false(ok)
  return tostring(e)
end

describe("bad sizes", function()
  it("are errors naming the op and the shape, not crashes or garbage", function()
    assert.matches("zeros: shape {4294967296,4294967296} of float32 is too large",
      err_of(function() return flow.zeros({ 1 << 32, 1 << 32 }):select(0, 1):sum() end), 1, true)
    assert.matches("zeros: shape {4611686018427387904}", err_of(flow.zeros, { 1 << 62 }), 1, true)
    assert.matches("expand: shape", err_of(function() return flow.ones({ 1 }):expand({ 1 << 62 }):contiguous() end), 1, true)
    assert.matches("eye: shape {2147483648,2147483648}", err_of(flow.eye, 1 << 31), 1, true)
    assert.matches("linspace: shape", err_of(flow.linspace, 0, 1, 1 << 62), 1, true)
    assert.matches("zeros: shape {9223372036854775807}", err_of(flow.zeros, { math.maxinteger }), 1, true)
    assert.matches("nn.Linear: a", err_of(flow.nn.Linear, 1 << 40, 1 << 40), 1, true)
    assert.matches("nn.Embedding: num_embeddings", err_of(flow.nn.Embedding, -1, 2), 1, true)
  end)
end)

describe("other bad input", function()
  it("reduces a 0-d tensor over axis -1", function()
    for _, op in ipairs({ "sum", "mean", "var" }) do
      local ok = pcall(function() return flow.zeros({})[op](flow.zeros({}), -1) end)
      assert.is_boolean(ok)
    end
  end)
  it("checks list lengths, keys with zero bytes and boxing targets", function()
    local bad = setmetatable({}, { __len = function() return -1 end })
    assert.matches("permute: a list of %-1 elements", err_of(function() return flow.ones({ 2 }):permute(bad) end))
    assert.matches("save: a key contains a zero byte", err_of(flow.save, { ["a\0b"] = flow.ones({ 2 }) }, os.tmpname()))
    assert.matches("to_global: no boxing target", err_of(flow._call, "to_global", {}, flow.ones({ 2 })))
  end)
  it("names the function in argument errors, however it is called", function()
    local t = flow.ones({ 2, 2 })
    local chunk = t.chunk
    assert.matches("^chunk: bad argument #2 %(number expected, got nil%)", err_of(chunk, t, nil))
    assert.matches("fuzz_spec.lua:%d+: transpose: bad argument #3 %(number expected, got table%)", err_of(function() return t[("transpose")](t, 0, {}) end))
    assert.matches("^cast: unknown dtype 'x'", err_of(flow.cast, t, "x"))
    assert.matches("^autocast: a dtype is a string", err_of(flow.autocast, 1))
    assert.matches("^to: unknown device 'tpu'", err_of(t.to, t, { device = "tpu" }))
  end)
  it("checks the nn layers' arguments", function()
    local nn = flow.nn
    assert.matches("^nn.Conv2d: in_channels must be a positive integer %(got nil%)", err_of(nn.Conv2d, nil, 4, 3))
    assert.matches("^nn.Conv2d: groups %(3%) must divide", err_of(nn.Conv2d, 4, 4, 3, { groups = 3 }))
    assert.matches("^nn.Conv2d: unknown option 'strides'", err_of(nn.Conv2d, 4, 4, 3, { strides = 2 }))
    assert.matches("^nn.LayerNorm: normalized_shape must be a non%-negative integer", err_of(nn.LayerNorm, "x"))
    assert.matches("^nn.LayerNorm: ones: shape {4611686018427387904}", err_of(nn.LayerNorm, 1 << 62))
    assert.matches("^nn.Linear: unknown option 'dtyp'", err_of(nn.Linear, 2, 3, { dtyp = "float64" }))
    assert.matches("^linear: shape: argument 1 is a freed tensor", err_of(function()
      local x = flow.ones({ 2, 2 }); x:free(); return flow.nn.functional.linear(x, flow.ones({ 2, 2 }))
    end))
    local l = nn.Linear(2, 3, { bias = false, dtype = "float64" }) -- options in the bias table
    assert.is_nil(l.bias)
    assert.equal("float64", l.weight.dtype)
  end)
  it("names the op in its errors", function()
    assert.matches("item: the tensor has 2 elements", err_of(function() return flow.ones({ 2 }):item() end))
    assert.matches("tensor: bad nesting", err_of(flow.tensor, { { 1, 2 }, { 3 } }))
    assert.matches("^ones: negative size", err_of(flow.ones, { -1 }))
    assert.matches("^full_like: the fill value must be a number", err_of(flow.full_like, flow.ones({ 2 }), nil))
    assert.are.same({ 2, 0, 2 }, flow.nn.functional.linear(flow.ones({ 2, 0, 3 }), flow.ones({ 2, 3 })):shape())
    assert.are.equal("float64", flow.eye(2, nil, { dtype = "float64" }).dtype)
  end)
end)

describe("hostile files", function()
  local p = os.tmpname()
  local function file(header, body)
    local f = assert(io.open(p, "wb"))
    f:write(string.pack("<I8", #header) .. header .. (body or ""))
    f:close()
  end
  it("refuses aliased data ranges before allocating", function()
    file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}',
      string.rep("\0", 12))
    assert.matches("overlap", err_of(flow.load, p))
  end)
  it("refuses truncated, oversized and malformed headers", function()
    file('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', string.rep("\0", 8))
    assert.matches("load:", err_of(flow.load, p))
    file('{"a":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}}')
    assert.matches("load:", err_of(flow.load, p))
    for _, h in ipairs({ "{", '{"a":}', '{"a":{"dtype":"F32"}}', '{"a":{"dtype":"X","shape":[],"data_offsets":[0,0]}}', "[]" }) do
      file(h)
      assert.matches("load:", err_of(flow.load, p))
    end
    local f = assert(io.open(p, "wb")); f:write(string.pack("<I8", 1 << 62)); f:close()
    assert.matches("not a valid safetensors file", err_of(flow.load, p))
  end)
  it("loads 20000 entries in near-linear time", function()
    local parts, t0 = {}, flow.now()
    for i = 1, 20000 do parts[i] = ('"t%d":{"dtype":"U8","shape":[1],"data_offsets":[%d,%d]}'):format(i, i - 1, i) end
    file("{" .. table.concat(parts, ",") .. "}", string.rep("\1", 20000))
    local r = flow.load(p)
    assert.are.equal(1, r.t20000:item())
    assert.is_true(flow.now() - t0 < 20)
  end)
  it("refuses devices and FIFOs without blocking", function()
    assert.matches("not a regular file", err_of(flow.read_file, "/dev/zero"))
    local fifo = os.tmpname(); os.remove(fifo)
    if os.execute("mkfifo '" .. fifo .. "'") then
      assert.matches("not a regular file", err_of(flow.read_file, fifo))
      assert.matches("not a regular file", err_of(flow.load, fifo))
      os.remove(fifo)
    end
  end)
end)

describe("the random-API fuzzer", function()
  local bin = os.getenv("FLOW_BIN")
  if not bin then
    it("needs the binary", function() pending("FLOW_BIN is not set (scripts/test.sh exports the flowlua path)") end)
    return
  end
  -- Errors that do not name their function, at seed 1 and 3000 calls (182 before the bindings'
  -- argument checks named their function and the nn layers checked their arguments).
  local UNNAMED_MAX = 0
  it("makes 3000 calls with 0 crashes and no more errors without the op's name", function()
    local h = io.popen("FLOW_MAX_ALLOC_BYTES=268435456 timeout 300 '" .. bin .. "' spec/support/fuzz.lua 1 3000 2>&1")
    local out = h:read("a")
    local ok, how, code = h:close()
    assert(ok, ("fuzzer died (%s %s):\n%s"):format(how, code, out:sub(-3000)))
    local calls = tonumber(out:match("calls (%d+)"))
    local unnamed = tonumber(out:match("unnamed (%d+)"))
    assert.are.equal(3000, calls)
    assert(unnamed <= UNNAMED_MAX, ("%d errors do not name their op (at most %d):\n%s"):format(unnamed, UNNAMED_MAX, out))
  end)
end)
