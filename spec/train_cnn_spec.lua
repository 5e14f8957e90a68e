-- scripts/train_cnn.lua on Fashion-MNIST (Debian: dataset-fashion-mnist): the IDX reader against
-- the files' headers, and a tiny run whose loss falls and whose accuracy clearly beats chance.
local flow = require "flow"
local data = require "flow.data"
local script = require "support.train_script"

local DIR = "/usr/share/datasets/fashion-mnist"
local f = io.open(DIR .. "/train-labels-idx1-ubyte.gz", "rb")
local installed = f ~= nil
if f then f:close() end

describe("Fashion-MNIST", function()
  if not installed then
    pending("needs " .. DIR .. " (Debian: apt install dataset-fashion-mnist; scripts/setup.sh installs it)")
    return
  end

  it("data.read_idx gives uint8 tensors of the shapes the IDX headers state", function()
    for _, c in ipairs({ { "train-images-idx3-ubyte", { 60000, 28, 28 } }, { "train-labels-idx1-ubyte", { 60000 } },
                         { "t10k-images-idx3-ubyte", { 10000, 28, 28 } }, { "t10k-labels-idx1-ubyte", { 10000 } } }) do
      local path = DIR .. "/" .. c[1] .. ".gz"
      -- the header's own counts, read apart from data.read_idx (by gzip: only the header's bytes
      -- are unpacked, not the 47 MB of images)
      local p = assert(io.popen("gzip -dc '" .. path .. "' | head -c 16"))
      local s = p:read("a")
      p:close()
      assert.are.equal(16, #s)
      local ndim = s:byte(4)
      local header = {}
      for d = 1, ndim do header[d] = string.unpack(">I4", s, 1 + 4 * d) end
      assert.are.same(c[2], header)
      local t = data.read_idx(path)
      assert.are.equal("uint8", t.dtype)
      assert.are.same(header, t:shape())
    end
    -- ten classes, labels 0..9, 6,000 training images each
    local y = flow.tensor(data.read_idx(DIR .. "/train-labels-idx1-ubyte.gz"), { dtype = "float32" })
    assert.are.equal(9, y:max():item())
    assert.are.equal(4.5, y:mean():item())
  end)

  it("data.read_idx with a limit reads the first items alone, the same bytes as the whole file's", function()
    local path = DIR .. "/t10k-images-idx3-ubyte.gz"
    local all, n = data.read_idx(path)
    local some, n2 = data.read_idx(path, 37)
    assert.are.same({ 10000, 10000 }, { n, n2 })
    assert.are.same({ 37, 28, 28 }, some:shape())
    local a = flow.tensor(flow.narrow(all, 0, 0, 37), { dtype = "float32" })
    assert.are.equal(0, (a - flow.tensor(some, { dtype = "float32" })):abs():max():item())
    assert.is_true(a:sum():item() > 0)
    assert.are.same({ 10000, 28, 28 }, data.read_idx(path, 20000):shape()) -- past the end: all of them
    assert.are.same({ 0, 28, 28 }, data.read_idx(path, 0):shape())
    assert.has_error(function() data.read_idx(path, -1) end, "data.read_idx: limit must be a non-negative integer (got -1)")
    -- flow.read_file's max: a prefix of the unpacked bytes
    assert.are.equal(16, #flow.read_file(path, 16))
    assert.are.equal(flow.read_file(path, 100):sub(1, 16), flow.read_file(path, 16))
    assert.has_error(function() flow.read_file(path, -2) end, "read_file: max must be a non-negative number of bytes (got -2)")
  end)

  it("data.read_idx names what it expected in a file that is not IDX", function()
    local p = os.tmpname()
    local g = assert(io.open(p, "wb"))
    g:write("not an idx file")
    g:close()
    assert.has_error(function() data.read_idx(p) end,
      ("data: '%s' is not an IDX file of uint8 (expected magic 0x000008NN, got 0x6e6f7420)"):format(p))
    os.remove(p)
  end)

  it("train_cnn.lua: a tiny run's loss falls and its test accuracy beats chance (10%) clearly", function()
    local ck = os.tmpname()
    local ok, out = script.run("--train-limit 512 --test-limit 500 --epochs 2 --batch 32 --lr 0.05 --warmup 4 "
      .. "--width 8 --log-every 4 --save " .. ck, "scripts/train_cnn.lua")
    assert.is_true(ok, out)
    local first, last = out:match("loss ([%d.]+) %-> ([%d.]+)")
    assert.truthy(first, out)
    assert.is_true(tonumber(last) < tonumber(first) - 0.3, out)
    local accs = {}
    for a in out:gmatch("test accuracy ([%d.]+)%%") do accs[#accs + 1] = tonumber(a) end
    assert.is_true(accs[#accs] >= 40, out)
    -- the checkpoint resumes: one more epoch from where the run stopped
    local ok2, out2 = script.run("--train-limit 512 --test-limit 500 --epochs 3 --batch 32 --lr 0.05 --warmup 4 "
      .. "--width 8 --log-every 4 --resume " .. ck, "scripts/train_cnn.lua")
    os.remove(ck)
    assert.is_true(ok2, out2)
    assert.truthy(out2:find("resumed from " .. ck .. " at step 32", 1, true), out2)
    assert.truthy(out2:find("epoch 3/3 | test accuracy", 1, true), out2)
  end)
end)
