local flow = require "flow"

local dir = os.tmpname()
os.remove(dir)
local function path(name) return dir .. "_" .. name end

local function read_all(p)
  local f = assert(io.open(p, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function write_all(p, s)
  local f = assert(io.open(p, "wb"))
  f:write(s)
  f:close()
end

-- A safetensors file built by hand: header JSON + data bytes.
local function raw_file(header, body)
  return string.pack("<I8", #header) .. header .. (body or "")
end

describe("flow.save / flow.load (safetensors)", function()
  it("round-trips every dtype with shape and values", function()
    local p = path("all.safetensors")
    local t = {
      f32 = flow.tensor({ { 1.5, -2.25 }, { 3, 4 } }, { dtype = "float32" }),
      f64 = flow.tensor({ 0.1, 1e300, -7 }, { dtype = "float64" }),
      f16 = flow.tensor({ 1, 0.5, -2 }, { dtype = "float16" }),
      bf16 = flow.tensor({ 1, 0.5, -2 }, { dtype = "bfloat16" }),
      i64 = flow.tensor({ 9007199254740993, -1 }, { dtype = "int64" }),
      i32 = flow.tensor({ { { 7 } } }, { dtype = "int32" }),
      u8 = flow.tensor({ 0, 255, 17 }, { dtype = "uint8" }),
      b = flow.tensor({ true, false, true }),
      scalar = flow.tensor(3.0),
      empty = flow.zeros({ 0, 3 }),
    }
    flow.save(t, p)
    local r = flow.load(p)
    for k, v in pairs(t) do
      assert.are.equal(v.dtype, r[k].dtype, k)
      assert.are.same(v:shape(), r[k]:shape(), k)
      assert.are.same(v:totable(), r[k]:totable(), k)
    end
    assert.are.equal(9007199254740993, r.i64:totable()[1])
    os.remove(p)
  end)

  it("writes the documented layout: u64 header length, JSON header, data at the offsets", function()
    local p = path("layout.safetensors")
    flow.save({ w = flow.tensor({ 1, 2 }, { dtype = "float32" }), step = 7 }, p)
    local s = read_all(p)
    local n = string.unpack("<I8", s)
    local header = s:sub(9, 8 + n)
    assert.are.equal(0, n % 8)
    assert.matches('"w":{"dtype":"F32","shape":%[2%],"data_offsets":%[0,8%]}', header)
    -- values are strings (safetensors); the entries saved from numbers are listed as such
    assert.matches('"__metadata__":{"step":"7","__flowlua_numbers__":"[\\"step\\"]"}', header, 1, true)
    local a, b = string.unpack("<ff", s, 9 + n)
    assert.are.same({ 1, 2 }, { a, b })
    os.remove(p)
  end)

  it("keeps numbers and strings as metadata, numbers coming back as numbers", function()
    local p = path("meta.safetensors")
    flow.save({ step = 42, lr = 0.1, seed = -3, big = 1 << 62, whole = 2.0, note = 'a "quoted"\nline' }, p)
    local r = flow.load(p)
    assert.are.equal(42, r.step)
    assert.are.equal("integer", math.type(r.step))
    assert.are.equal(0.1, r.lr)
    assert.are.equal(-3, r.seed)
    assert.are.equal(1 << 62, r.big)
    assert.are.equal("float", math.type(r.whole))
    assert.are.equal('a "quoted"\nline', r.note)
    os.remove(p)
  end)

  it("keeps strings that read as numbers as strings", function()
    local p = path("strings.safetensors")
    local meta = { version = "1.10", id = "007", hex = "0x10", inf = "inf", empty = "", n = 1.10, z = 7 }
    flow.save(meta, p)
    local r = flow.load(p)
    assert.are.same(meta, r)
    assert.are.equal("string", type(r.version))
    assert.are.equal("float", math.type(r.n))
    assert.is_nil(r.__flowlua_numbers__)
    -- a file without the list (another tool's, or one with only strings) gives only strings
    local q = path("foreign_numbers.safetensors")
    write_all(q, raw_file('{"__metadata__":{"step":"7","lr":"0.5"}}'))
    assert.are.same({ step = "7", lr = "0.5" }, flow.load(q))
    os.remove(p)
    os.remove(q)
  end)

  it("refuses a hostile list of number entries with a message naming it", function()
    local q = path("hostile_numbers.safetensors")
    local cases = {
      { '{"__metadata__":{"a":"1","__flowlua_numbers__":"[\\"b\\"]"}}', "names 'b', which is not a metadata entry" },
      { '{"__metadata__":{"a":"x1","__flowlua_numbers__":"[\\"a\\"]"}}', "metadata 'a' is listed as a number but holds 'x1'" },
      { '{"__metadata__":{"a":"1","__flowlua_numbers__":"a"}}', "__flowlua_numbers__': bad header JSON at byte 0: expected '%['" },
      { '{"__metadata__":{"a":"1","__flowlua_numbers__":"[\\"a\\"] x"}}', "trailing characters after the list of keys" },
      { '{"__metadata__":{"a":"1","__flowlua_numbers__":"[1]"}}', "expected '\"'" },
      { '{"__metadata__":{"a":"1","__flowlua_numbers__":"[]","__flowlua_numbers__":"[]"}}', "appears twice" },
    }
    for _, c in ipairs(cases) do
      write_all(q, raw_file(c[1]))
      local ok, err = pcall(flow.load, q)
      assert.is_false(ok, c[1])
      assert.matches(c[2], err)
    end
    -- many entries, every one listed: still quick (the keys are found by sorting)
    local keys, list = {}, {}
    for i = 1, 20000 do
      keys[#keys + 1] = ('"k%d":"%d"'):format(i, i)
      list[#list + 1] = ('\\"k%d\\"'):format(i)
    end
    write_all(q, raw_file('{"__metadata__":{' .. table.concat(keys, ",") .. ',"__flowlua_numbers__":"['
      .. table.concat(list, ",") .. ']"}}'))
    local t0 = os.clock()
    local r = flow.load(q)
    assert.are.equal(20000, r.k20000)
    assert.is_true(os.clock() - t0 < 5)
    assert.has_error(function() flow.save({ __flowlua_numbers__ = "x" }, q) end,
      "save: the metadata key '__flowlua_numbers__' is reserved")
    os.remove(q)
  end)

  it("saves non-contiguous tensors by their values", function()
    local p = path("view.safetensors")
    local base = flow.tensor({ { 1, 2, 3 }, { 4, 5, 6 } }, { dtype = "float32" })
    flow.save({ t = flow.expand(flow.reshape(base, { 2, 1, 3 }), { 2, 2, 3 }) }, p)
    assert.are.same({ { { 1, 2, 3 }, { 1, 2, 3 } }, { { 4, 5, 6 }, { 4, 5, 6 } } }, flow.load(p).t:totable())
    os.remove(p)
  end)

  it("writes through a temporary file and renames it over the target", function()
    local p = path("atomic.safetensors")
    write_all(p, "old content")
    flow.save({ x = flow.ones({ 2 }) }, p)
    assert.is_nil(io.open(p .. ".tmp", "rb"))
    assert.are.same({ 1, 1 }, flow.load(p).x:totable())
    -- a failed rename (the target is a directory) leaves no temporary file behind
    local d = path("isdir")
    assert(os.execute("mkdir -p '" .. d .. "'"))
    local ok, err = pcall(flow.save, { x = flow.ones({ 2 }) }, d)
    assert.is_false(ok)
    assert.matches("save: cannot rename '.*isdir%.tmp' to '.*isdir'", err)
    assert.is_nil(io.open(d .. ".tmp", "rb"))
    os.remove(d)
    ok, err = pcall(flow.save, { x = flow.ones({ 2 }) }, path("nodir") .. "/x.safetensors")
    assert.is_false(ok)
    assert.matches("save: cannot open '.*x%.safetensors%.tmp' for writing", err)
    os.remove(p)
  end)

  it("rejects bad tables before writing", function()
    local p = path("bad.safetensors")
    assert.has_error(function() flow.save({ [1] = flow.ones({ 1 }) }, p) end, "save: table keys must be strings (got a number key)")
    assert.has_error(function() flow.save({ f = print }, p) end, "save: 'f' is a function (expected a tensor, number or string)")
    assert.has_error(function() flow.save({ __metadata__ = "x" }, p) end, "save: the key '__metadata__' is reserved")
    assert.is_nil(io.open(p, "rb"))
  end)

  it("reports truncated and corrupt files as errors naming the file", function()
    local p = path("src.safetensors")
    flow.save({ a = flow.ones({ 4, 4 }), b = flow.zeros({ 3 }) }, p)
    local good = read_all(p)
    local q = path("corrupt.safetensors")
    local cases = {
      { good:sub(1, 5), "shorter than the 8%-byte header length" },
      { good:sub(1, #good - 1), "outside the %d+ data bytes %(truncated file%?%)" },
      { string.pack("<I8", 1 << 40) .. "{}", "not a valid safetensors file %(header length" },
      { raw_file("{\"a\":"), "bad header JSON at byte 5" },
      { raw_file("[1,2]"), "bad header JSON at byte 0: expected '{'" },
      { raw_file('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x', string.rep("\0", 8)), "trailing characters" },
      { raw_file('{"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}', "\0\0\0\0"), "unsupported dtype 'F99'" },
      { raw_file('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', string.rep("\0", 8)), "needs 12 bytes but data_offsets give 8" },
      { raw_file('{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', "\0\0\0\0"), "expected a non%-negative integer" },
      { raw_file('{"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}}', "\0\0\0\0"), "expected an integer" },
      { raw_file('{"a":{"dtype":"F32","shape":[1]}}', "\0\0\0\0"), "tensor 'a' lacks data_offsets" },
      { raw_file('{"a":{"dtype":"F32","shape":[1099511627776,1099511627776],"data_offsets":[0,4]}}', "\0\0\0\0"), "has shape {1099511627776,1099511627776}, too large" },
      { raw_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}', "\0\0\0\0"), "unknown field 'x'" },
      { raw_file('{"a\\ud800":1}'), "unpaired surrogate" },
      { raw_file('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "\0\0\0\0"), "tensor 'a' appears twice" },
    }
    for _, c in ipairs(cases) do
      write_all(q, c[1])
      local ok, err = pcall(flow.load, q)
      assert.is_false(ok, c[2])
      assert.matches("load: '" .. q:gsub("%p", "%%%0") .. "'", err)
      assert.matches(c[2], err)
    end
    assert.has_error(function() flow.load(path("missing")) end)
    os.remove(p)
    os.remove(q)
  end)

  it("reads files written by other tools: escapes, metadata and padding", function()
    local q = path("foreign.safetensors")
    write_all(q, raw_file('{"__metadata__":{"format":"pt"},"caf\\u00e9\\/x":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}}   ',
      string.pack("<i4i4", -5, 6)))
    local r = flow.load(q)
    assert.are.equal("pt", r.format)
    assert.are.same({ -5, 6 }, r["café/x"]:totable())
    os.remove(q)
  end)
end)

describe("flow.read_file", function()
  it("returns plain and gzip-compressed files alike", function()
    local p = path("plain.txt")
    write_all(p, "hello\0world")
    assert.are.equal("hello\0world", flow.read_file(p))
    local gz = path("comp.txt")
    write_all(gz, "hello gzip\n")
    if os.execute("gzip -f '" .. gz .. "'") then
      assert.are.equal("hello gzip\n", flow.read_file(gz .. ".gz"))
      os.remove(gz .. ".gz")
    end
    os.remove(p)
    assert.has_error(function() flow.read_file(path("nope")) end, "read_file: cannot open '" .. path("nope") .. "': No such file or directory")
  end)
end)
