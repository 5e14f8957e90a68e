-- flow.data: token streams for language-model training, and IDX image/label files (MNIST's
-- format: data.read_idx). Byte-level tokens from a text file (plain or gzip), or llm.c .bin
-- shards (a header of 256 int32: magic 20240520, version 1, token count; then uint16 tokens).
-- Batches are random windows drawn from flow's RNG, so they are fixed by flow.manual_seed and a
-- checkpoint of flow.get_rng_state() resumes them exactly.
local flow = require "flow"

local data = {}

local SHARD_MAGIC, SHARD_HEADER = 20240520, 256 * 4

-- A token sequence over a Lua string: 1 byte a token (text) or 2 little-endian bytes (shards).
local Tokens = {}
Tokens.__index = Tokens

local function tokens(bytes, width, first, count)
  return setmetatable({ bytes = bytes, width = width, first = first, n = count }, Tokens)
end

function Tokens:len() return self.n end

-- Tokens [start, start+len) (0-based) as a Lua list.
function Tokens:slice(start, len)
  local out = {}
  if self.width == 1 then
    local b = self.first + start
    local k = 1
    -- string.byte returns at most a few thousand values at once on the C stack: chunk it
    while k <= len do
      local n = math.min(4096, len - k + 1)
      local t = { self.bytes:byte(b + k - 1, b + k + n - 2) }
      table.move(t, 1, n, k, out)
      k = k + n
    end
  else
    local pos = self.first + 2 * start
    for k = 1, len do
      out[k] = string.unpack("<I2", self.bytes, pos)
      pos = pos + 2
    end
  end
  return out
end

-- Check an llm.c shard held in s (the bytes of path); returns its token count.
local function check_shard(path, s)
  if #s < SHARD_HEADER then error(("data: '%s' is too short for an llm.c shard header (%d bytes)"):format(path, #s), 0) end
  local magic, version, count = string.unpack("<i4i4i4", s)
  if magic ~= SHARD_MAGIC then error(("data: '%s' has magic %d, expected %d (an llm.c .bin shard)"):format(path, magic, SHARD_MAGIC), 0) end
  if version ~= 1 then error(("data: '%s' has shard version %d, expected 1"):format(path, version), 0) end
  if #s ~= SHARD_HEADER + 2 * count then
    error(("data: '%s' says %d tokens but holds %d bytes of tokens"):format(path, count, #s - SHARD_HEADER), 0)
  end
  return count
end

-- Dataset: data.load(path, {val_fraction = 0.1}) splits one file into train (the first part) and
-- val (the tail). An llm.c shard (vocab 50257, GPT-2's) is read as tokens; anything else as
-- bytes (vocab 256), gunzipped when compressed. opts.val may name a separate validation file.
local Dataset = {}
Dataset.__index = Dataset

-- A file is a shard when it is named .bin or starts with the shard magic; else it is bytes.
local function open_stream(path)
  local s = flow.read_file(path)
  if path:match("%.bin$") or (#s >= 4 and string.unpack("<i4", s) == SHARD_MAGIC) then
    return tokens(s, 2, SHARD_HEADER + 1, check_shard(path, s)), 50257
  end
  return tokens(s, 1, 1, #s), 256
end

function data.load(path, opts)
  opts = opts or {}
  local all, vocab = open_stream(path)
  local self = setmetatable({ vocab_size = opts.vocab_size or vocab, path = path }, Dataset)
  if opts.val then
    self.train, self.val = all, open_stream(opts.val)
  else
    local frac = opts.val_fraction or 0.1
    local nval = math.floor(all.n * frac)
    self.train = tokens(all.bytes, all.width, all.first, all.n - nval)
    self.val = tokens(all.bytes, all.width, all.first + all.width * (all.n - nval), nval)
  end
  return self
end

-- Random windows: x, y int64 [B, T] with y the next token after each x (targets), windows
-- starting at positions of the split ("train" or "val") drawn with flow.randint.
function Dataset:batch(split, B, T)
  local toks = self[split] or error(("Dataset:batch: unknown split '%s' (train or val)"):format(tostring(split)), 2)
  local span = toks.n - T - 1
  if span < 0 then error(("Dataset:batch: the %s split has %d tokens, fewer than seq+1 = %d"):format(split, toks.n, T + 1), 2) end
  local starts = flow.randint(0, span + 1, { B }):totable()
  local xs, ys = {}, {}
  for b = 1, B do
    local w = toks:slice(starts[b], T + 1)
    xs[b] = table.move(w, 1, T, 1, {})
    ys[b] = table.move(w, 2, T + 1, 1, {})
  end
  return flow.tensor(xs, { dtype = "int64" }), flow.tensor(ys, { dtype = "int64" })
end

-- IDX files (LeCun's MNIST format, as Fashion-MNIST ships them; plain or gzip): a big-endian
-- header of magic 0x0000 0803 (uint8 data, 3 dims) or 0x0000 0801 (1 dim) and one uint32 size per
-- dim, then the bytes row-major. Returns a uint8 tensor of that shape.
local IDX_UINT8 = 0x08
function data.read_idx(path)
  local s = flow.read_file(path)
  if #s < 4 then error(("data: '%s' is too short for an IDX header (%d bytes)"):format(path, #s), 0) end
  local zero, dtype, ndim = string.unpack(">I2BB", s)
  if zero ~= 0 or dtype ~= IDX_UINT8 or ndim < 1 or #s < 4 + 4 * ndim then
    error(("data: '%s' is not an IDX file of uint8 (expected magic 0x000008NN, got 0x%08x)"):format(
      path, string.unpack(">I4", s)), 0)
  end
  local shape, numel = {}, 1
  for d = 1, ndim do
    shape[d] = string.unpack(">I4", s, 1 + 4 * d)
    numel = numel * shape[d]
  end
  local first = 4 + 4 * ndim
  if #s - first ~= numel then
    error(("data: '%s' says %s = %d bytes of data but holds %d"):format(path, table.concat(shape, "x"), numel, #s - first), 0)
  end
  -- flow has no tensor-from-bytes constructor; a safetensors file is the same bytes behind a JSON
  -- header, and flow.load reads it in one copy (a Lua list of 47M numbers would take gigabytes).
  local header = ('{"idx":{"dtype":"U8","shape":[%s],"data_offsets":[0,%d]}}'):format(table.concat(shape, ","), numel)
  local tmp = os.tmpname()
  local f = assert(io.open(tmp, "wb"))
  local ok, err = f:write(string.pack("<I8", #header), header, s:sub(first + 1))
  f:close()
  if not ok then os.remove(tmp); error(("data: writing '%s' for '%s': %s"):format(tmp, path, err), 0) end
  local loaded, t = pcall(flow.load, tmp)
  os.remove(tmp)
  if not loaded then error(t, 0) end
  return t.idx
end

-- Bytes as text (for printing samples of a byte-level model).
function data.decode_bytes(list)
  local out = {}
  for i, c in ipairs(list) do out[i] = string.char(c) end
  return table.concat(out)
end

function data.encode_bytes(s)
  return { s:byte(1, -1) }
end

-- Write tokens (a Lua list of integers < 65536) as an llm.c shard: for tests and converters.
function data.write_shard(path, toks)
  local parts = { string.pack("<i4i4i4", SHARD_MAGIC, 1, #toks), string.rep("\0", SHARD_HEADER - 12) }
  for i = 1, #toks do parts[#parts + 1] = string.pack("<I2", toks[i]) end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(parts))
  f:close()
end

return data
