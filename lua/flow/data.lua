-- flow.data: token streams for language-model training, and IDX image/label files (MNIST's
-- format: data.read_idx). Byte-level tokens from a text file (plain or gzip), or llm.c .bin
-- shards, one file or a glob of them (a header of 256 int32: magic, version, token count; then
-- the tokens: magic 20240520 version 1 holds uint16 (GPT-2), version 2 uint32; llm.c's Llama 3
-- shards, magic 20240801 version 7, uint32). Shards are mapped by flow.open_tokens (C, core/io.c)
-- and batches copied from them straight into int64 tensors: a shard is never a Lua string.
-- Batches are random windows drawn from flow's RNG, so they are fixed by flow.manual_seed and a
-- checkpoint of flow.get_rng_state() resumes them exactly. data.read_tokenizer reads llm.c's
-- GPT-2 tokenizer file (gpt2_tokenizer.bin), to print samples of a token model as text.
local flow = require "flow"

local data = {}

local SHARD_MAGIC, SHARD_HEADER = 20240520, 256 * 4

-- Tokens [first, first+n) of a token file (flow.open_tokens; src is nil when n is 0).
local Tokens = {}
Tokens.__index = Tokens

local function tokens(src, first, count)
  return setmetatable({ src = src, first = first, n = count }, Tokens)
end

function Tokens:len() return self.n end

-- Tokens [start, start+len) (0-based) into the int64 tensor out, from element offset on.
function Tokens:read(start, len, out, offset)
  if len > 0 then self.src:read(self.first + start, len, out, offset) end
end

-- Several token sequences as one (the shards of a glob, in name order).
local Concat = {}
Concat.__index = Concat

local function concat(parts)
  if #parts == 1 then return parts[1] end
  local n = 0
  for _, p in ipairs(parts) do n = n + p.n end
  return setmetatable({ parts = parts, n = n }, Concat)
end

function Concat:len() return self.n end

-- A window across shard boundaries reads the end of one and the start of the next.
function Concat:read(start, len, out, offset)
  for _, p in ipairs(self.parts) do
    if len == 0 then break end
    if start < p.n then
      local k = math.min(len, p.n - start)
      p:read(start, k, out, offset)
      start, len, offset = 0, len - k, offset + k
    else
      start = start - p.n
    end
  end
end

-- Tokens [start, start+len) (0-based) of a Tokens or a Concat as a Lua list.
local function slice(t, start, len)
  local out = flow.zeros({ len }, { dtype = "int64" })
  t:read(start, len, out, 0)
  return out:totable()
end
Tokens.slice, Concat.slice = slice, slice

-- The last `count` tokens of t (a Tokens or a Concat), and the ones before.
local function split_tail(t, count)
  if getmetatable(t) == Tokens then
    return tokens(t.src, t.first, t.n - count), tokens(t.src, t.first + t.n - count, count)
  end
  local head, tail, left = {}, {}, t.n - count
  for _, p in ipairs(t.parts) do
    if left >= p.n then head[#head + 1] = p
    elseif left <= 0 then tail[#tail + 1] = p
    else
      local a, b = split_tail(p, p.n - left)
      head[#head + 1], tail[#tail + 1] = a, b
    end
    left = left - p.n
  end
  if #head == 0 then head[1] = tokens(nil, 0, 0) end
  if #tail == 0 then tail[1] = tokens(nil, 0, 0) end
  return concat(head), concat(tail)
end

-- The files a pattern names, sorted: the pattern itself when it has no * ? or [ (it need not
-- exist yet: reading it reports that), else the files of its folder whose names match (wildcards
-- in the file name only, as the shell reads them).
local function expand(pattern)
  if not pattern:find("[%*%?%[]") then return { pattern } end
  local dir, name = pattern:match("^(.*)/([^/]*)$")
  if not dir then dir, name = ".", pattern end
  if dir:find("[%*%?%[]") then error(("data: '%s': wildcards only in the file name, not in its folder"):format(pattern), 0) end
  local lua_pat = "^" .. name:gsub("[%^%$%(%)%%%.%]%+%-]", "%%%0"):gsub("%*", ".*"):gsub("%?", ".")
    :gsub("%%%]", "]") .. "$"
  local files = {}
  local ls = io.popen("ls -1A -- '" .. dir:gsub("'", "'\\''") .. "' 2>/dev/null")
  for f in ls:lines() do
    if f:match(lua_pat) then files[#files + 1] = (dir == "." and pattern:sub(1, 2) ~= "./") and f or dir .. "/" .. f end
  end
  ls:close()
  table.sort(files)
  if #files == 0 then error(("data: no file matches '%s'"):format(pattern), 0) end
  return files
end

-- Dataset: data.load(path, {val_fraction = 0.1}) splits one file into train (the first part) and
-- val (the tail). An llm.c shard (vocab 50257, GPT-2's) is read as tokens; anything else as
-- bytes (vocab 256), gunzipped when compressed. opts.val may name a separate validation file.
local Dataset = {}
Dataset.__index = Dataset

-- A file is a shard when it is named .bin or starts with a shard magic; else it is bytes. The
-- vocabulary: GPT-2's for uint16 shards, Llama 3's for uint32 ones, 256 for bytes.
local VOCAB_BY_WIDTH = { [1] = 256, [2] = 50257, [4] = 128256 }
local function open_file(path)
  local ok, src = pcall(flow.open_tokens, path)
  if not ok then error((tostring(src):gsub("^open_tokens: ", "data: ")), 0) end
  return tokens(src, 0, src:len()), VOCAB_BY_WIDTH[src:width()]
end

-- Every file a pattern names, as one stream (all shards, or one text file).
local function open_stream(pattern)
  local parts, vocab = {}, nil
  for _, path in ipairs(expand(pattern)) do
    local t, v = open_file(path)
    if vocab and v ~= vocab then
      error(("data: '%s' mixes token widths or text and shards ('%s')"):format(pattern, path), 0)
    end
    parts[#parts + 1], vocab = t, v
  end
  return concat(parts), vocab
end

-- data.load(path, {val_fraction =, val =, vocab_size =}): path and val may be globs of shards
-- ("data/fineweb_train_*.bin"); without val the tail of path's tokens is held out.
function data.load(path, opts)
  opts = opts or {}
  local all, vocab = open_stream(path)
  local self = setmetatable({ vocab_size = opts.vocab_size or vocab, path = path }, Dataset)
  if opts.val then
    local val, vval = open_stream(opts.val)
    if vval ~= vocab then error(("data: --val '%s' and '%s' hold different kinds of tokens"):format(opts.val, path), 0) end
    self.train, self.val = all, val
  else
    self.train, self.val = split_tail(all, math.floor(all.n * (opts.val_fraction or 0.1)))
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
  local x, y = flow.zeros({ B, T }, { dtype = "int64" }), flow.zeros({ B, T }, { dtype = "int64" })
  for b = 1, B do
    toks:read(starts[b], T, x, (b - 1) * T)
    toks:read(starts[b] + 1, T, y, (b - 1) * T)
  end
  return x, y
end

-- IDX files (LeCun's MNIST format, as Fashion-MNIST ships them; plain or gzip): a big-endian
-- header of magic 0x0000 0803 (uint8 data, 3 dims) or 0x0000 0801 (1 dim) and one uint32 size per
-- dim, then the bytes row-major. Returns a uint8 tensor of that shape, and the file's count of
-- items (its first dim). With limit, only the first `limit` items are read (and unpacked): the
-- tensor's first dim is then the smaller of limit and the file's count.
local IDX_UINT8 = 0x08
function data.read_idx(path, limit)
  if limit ~= nil and (math.type(limit) ~= "integer" or limit < 0) then
    error(("data.read_idx: limit must be a non-negative integer (got %s)"):format(tostring(limit)), 2)
  end
  local s = flow.read_file(path, limit and 4 + 4 * 255) -- with a limit: the header first
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
  local first, count = 4 + 4 * ndim, shape[1]
  if limit and limit < count then
    numel = count > 0 and numel // count * limit or 0
    shape[1] = limit
    s = flow.read_file(path, first + numel)
    if #s < first + numel then
      error(("data: '%s' ends after %d bytes, inside its first %d items"):format(path, #s, limit), 0)
    end
  elseif limit then
    s = flow.read_file(path)
  end
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
  return t.idx, count
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

-- llm.c's tokenizer file: a header of 256 uint32 (magic 20240328; version 1 or 2; the vocabulary
-- size; in version 2 the end-of-text token, in version 1 GPT-2's 50256), then for each token a
-- uint8 length and that many bytes. Read whole (GPT-2's is 0.5 MB). tokenizer:decode(ids) joins
-- the tokens' bytes.
local TOKENIZER_MAGIC, TOKENIZER_HEADER = 20240328, 256 * 4
local Tokenizer = {}
Tokenizer.__index = Tokenizer

function data.read_tokenizer(path)
  local s = flow.read_file(path)
  local function bad(fmt, ...) error(("tokenizer: '%s' "):format(path) .. fmt:format(...), 0) end
  if #s < TOKENIZER_HEADER then bad("is too short for an llm.c tokenizer header (%d bytes)", #s) end
  local magic, version, vocab, eot = string.unpack("<I4I4I4I4", s)
  if magic ~= TOKENIZER_MAGIC then bad("has magic %d, expected %d (llm.c's gpt2_tokenizer.bin)", magic, TOKENIZER_MAGIC) end
  if version ~= 1 and version ~= 2 then bad("has version %d, expected 1 or 2", version) end
  if version == 1 then eot = 50256 end
  if eot >= vocab then bad("names end-of-text token %d in a vocabulary of %d", eot, vocab) end
  local pieces, pos = {}, TOKENIZER_HEADER + 1
  for i = 1, vocab do
    local len = s:byte(pos)
    if not len or pos + len > #s then bad("ends inside token %d of %d", i - 1, vocab) end
    pieces[i] = s:sub(pos + 1, pos + len)
    pos = pos + 1 + len
  end
  if pos <= #s then bad("holds %d bytes after its %d tokens", #s - pos + 1, vocab) end
  return setmetatable({ vocab_size = vocab, eot = eot, pieces = pieces }, Tokenizer)
end

function Tokenizer:decode(ids)
  local out = {}
  for i, id in ipairs(ids) do
    out[i] = self.pieces[id + 1] or error(("tokenizer: token %d is outside the vocabulary of %d"):format(id, self.vocab_size), 2)
  end
  return table.concat(out)
end

-- Write a tokenizer file (version 2) from a list of byte strings, token 0 first: for tests.
function data.write_tokenizer(path, pieces, eot)
  local parts = { string.pack("<I4I4I4I4", TOKENIZER_MAGIC, 2, #pieces, eot), string.rep("\0", TOKENIZER_HEADER - 16) }
  for i, p in ipairs(pieces) do parts[i + 2] = string.pack("<s1", p) end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(parts))
  f:close()
end

-- Write tokens (a Lua list of integers) as an llm.c shard, uint16 (version 1) or with
-- width = 4 uint32 (version 2): for tests and converters.
function data.write_shard(path, toks, width)
  width = width or 2
  local parts = { string.pack("<i4i4i4", SHARD_MAGIC, width == 2 and 1 or 2, #toks), string.rep("\0", SHARD_HEADER - 12) }
  for i = 1, #toks do parts[#parts + 1] = string.pack("<I" .. width, toks[i]) end
  local f = assert(io.open(path, "wb"))
  f:write(table.concat(parts))
  f:close()
end

return data
