local flow = require "flow"
local data = require "flow.data"
local gpt = require "flow.gpt"

local script = require "support.train_script"
local TEXT, text_file = script.TEXT, script.text_file

local CFG = { vocab_size = 256, block_size = 16, n_layer = 2, n_head = 2, n_embd = 32 }

-- Train steps [from, to) from the model/optimizer/RNG state; returns the list of losses.
local function train(model, opt, ds, from, to)
  local lr = flow.optim.cosine_schedule({ lr = 1e-2, min_lr = 1e-3, warmup = 2, steps = 12 })
  local losses = {}
  for step = from, to - 1 do
    opt:set_lr(lr(step))
    local x, y = ds:batch("train", 4, 16)
    local _, loss = model(x, y)
    loss:backward()
    flow.optim.clip_grad_norm(model:parameters(), 1.0)
    opt:step()
    opt:zero_grad()
    losses[#losses + 1] = loss:item()
  end
  return losses
end

describe("flow.data", function()
  it("splits a byte file into train and val and draws aligned x, y windows", function()
    local p = text_file()
    local ds = data.load(p, { val_fraction = 0.1 })
    os.remove(p)
    assert.are.equal(256, ds.vocab_size)
    assert.are.equal(#TEXT - math.floor(#TEXT * 0.1), ds.train:len())
    assert.are.equal(math.floor(#TEXT * 0.1), ds.val:len())
    flow.manual_seed(5)
    local x, y = ds:batch("train", 3, 8)
    assert.are.equal("int64", x.dtype)
    assert.are.same({ 3, 8 }, x:shape())
    local xt, yt = x:totable(), y:totable()
    for b = 1, 3 do
      local s = data.decode_bytes(xt[b])
      assert.truthy(TEXT:find(s, 1, true), s)
      for t = 1, 7 do assert.are.equal(xt[b][t + 1], yt[b][t]) end
    end
    -- windows come from flow's RNG: the same seed draws the same batch
    assert.are_not.same(xt, ds:batch("train", 3, 8):totable())
    flow.manual_seed(5)
    assert.are.same(xt, ds:batch("train", 3, 8):totable())
  end)

  it("reads llm.c .bin shards and checks their header", function()
    local p = os.tmpname()
    local toks = {}
    for i = 1, 50 do toks[i] = (i * 1000) % 50257 end
    data.write_shard(p, toks)
    local ds = data.load(p, { val_fraction = 0.2 })
    assert.are.equal(50257, ds.vocab_size)
    assert.are.same({ 1000, 2000, 3000 }, ds.train:slice(0, 3))
    assert.are.same({ 41000, 42000 }, ds.val:slice(0, 2))
    local bin = p .. ".bin"
    local f = assert(io.open(bin, "wb"))
    f:write(string.pack("<i4", 123), string.rep("\0", 1100))
    f:close()
    assert.has_error(function() data.load(bin) end, "data: '" .. bin .. "' has magic 123, expected 20240520 (an llm.c .bin shard)")
    os.remove(p)
    os.remove(bin)
  end)

  it("reads a glob of shards as one stream in name order, uint32 shards, and --val's own files", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local function shard(name, first, n, width)
      local t = {}
      for i = 1, n do t[i] = first + i - 1 end
      data.write_shard(dir .. "/" .. name, t, width)
    end
    shard("train_001.bin", 100, 10)
    shard("train_000.bin", 0, 10)
    shard("val_000.bin", 500, 6)
    local ds = data.load(dir .. "/train_*.bin", { val = dir .. "/val_*.bin" })
    assert.are.equal(20, ds.train:len())
    assert.are.same({ 8, 9, 100, 101 }, ds.train:slice(8, 4)) -- a window across the two shards
    assert.are.same({ 500, 501, 502, 503, 504, 505 }, ds.val:slice(0, 6))
    local x, y = ds:batch("train", 4, 5)
    assert.are.same({ 4, 5 }, x:shape())
    -- without --val the tail of the stream (here inside the last shard) is held out
    ds = data.load(dir .. "/train_00?.bin", { val_fraction = 0.25 })
    assert.are.same({ 15, 5 }, { ds.train:len(), ds.val:len() })
    assert.are.same({ 105, 106, 107, 108, 109 }, ds.val:slice(0, 5))
    -- uint32 tokens (version 2): ids past 65535, and a vocabulary to match
    shard("big.bin", 70000, 8, 4)
    ds = data.load(dir .. "/big.bin", { val_fraction = 0.25 })
    assert.are.same({ 70000, 70001 }, ds.train:slice(0, 2))
    assert.are.equal(128256, ds.vocab_size)
    assert.has_error(function() data.load(dir .. "/nothing_*.bin") end, "data: no file matches '" .. dir .. "/nothing_*.bin'")
    assert.has_error(function() data.load(dir .. "/*.bin") end,
      "data: '" .. dir .. "/*.bin' mixes token widths or text and shards ('" .. dir .. "/train_000.bin')")
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("maps shards in C: flow.open_tokens reads windows of uint16 and uint32 tokens into int64 tensors", function()
    local p = os.tmpname() .. ".bin"
    data.write_shard(p, { 1, 65535, 2, 3 })
    local f = flow.open_tokens(p)
    assert.are.same({ 4, 2, 4 }, { f:len(), f:width(), #f })
    local out = flow.zeros({ 6 }, { dtype = "int64" })
    f:read(1, 3, out, 2)
    assert.are.same({ 0, 0, 65535, 2, 3, 0 }, out:totable())
    assert.has_error(function() f:read(2, 3, out) end, "read: tokens [2, 5) are outside the file's [0, 4)")
    assert.has_error(function() f:read(0, 2, out, 5) end, "read: elements [5, 7) are outside out's 6")
    assert.has_error(function() f:read(0, 1, flow.zeros({ 2 })) end, "read: out must be a contiguous int64 CPU tensor (got float32)")
    f:close()
    assert.has_error(function() f:len() end, "len: the token file is closed")
    data.write_shard(p, { 4294967295, 70000 }, 4)
    f = flow.open_tokens(p)
    f:read(0, 2, out)
    assert.are.same({ 4294967295, 70000 }, { out:totable()[1], out:totable()[2] })
    assert.are.equal(4, f:width())
    os.remove(p)
  end)

  it("names the file and the fault of a bad shard: short header, magic, version, truncated or padded tokens", function()
    local p = os.tmpname() .. ".bin"
    local function write(...)
      local f = assert(io.open(p, "wb"))
      f:write(...)
      f:close()
    end
    local function header(magic, version, count) return string.pack("<i4i4i4", magic, version, count) .. string.rep("\0", 1012) end
    local function fails(msg) assert.has_error(function() data.load(p) end, "data: '" .. p .. "' " .. msg) end
    write(string.rep("\0", 100))
    fails("is too short for an llm.c shard header (100 bytes)")
    write(header(20240520, 3, 0))
    fails("has shard version 3, expected 1 (uint16) or 2 (uint32)")
    write(header(20240801, 1, 0))
    fails("has shard version 1, expected 7")
    write(header(20240520, 1, 10), string.rep("\1", 19))
    fails("says 10 tokens but holds 19 bytes of tokens")
    write(header(20240520, 2, 2), string.rep("\1", 12))
    fails("says 2 tokens but holds 12 bytes of tokens")
    write(header(20240801, 7, 2), string.pack("<I4I4", 128000, 5))
    local ds = data.load(p, { val_fraction = 0.5 })
    assert.are.same({ 128256, { 128000 }, { 5 } }, { ds.vocab_size, ds.train:slice(0, 1), ds.val:slice(0, 1) })
    -- a file not named .bin is a shard when it starts with a shard magic
    local q = os.tmpname()
    data.write_shard(q, { 7, 8, 9, 10 })
    ds = data.load(q, { val_fraction = 0.25 })
    assert.are.same({ 50257, { 7, 8, 9 } }, { ds.vocab_size, ds.train:slice(0, 3) })
    os.remove(p)
    os.remove(q)
    assert.has_error(function() data.load(p) end, "data: cannot open '" .. p .. "': No such file or directory")
  end)

  it("reads llm.c's tokenizer file (versions 1 and 2) and decodes ids to their bytes", function()
    local p = os.tmpname()
    data.write_tokenizer(p, { "a", "", "\0\255", " the", "<|endoftext|>" }, 4)
    local tok = data.read_tokenizer(p)
    assert.are.same({ 5, 4 }, { tok.vocab_size, tok.eot })
    assert.are.equal("a the\0\255a<|endoftext|>", tok:decode({ 0, 3, 1, 2, 0, 4 }))
    assert.has_error(function() tok:decode({ 5 }) end, "tokenizer: token 5 is outside the vocabulary of 5")
    local s = assert(io.open(p, "rb")):read("a")
    local function fails(bytes, msg)
      local f = assert(io.open(p, "wb"))
      f:write(bytes)
      f:close()
      assert.has_error(function() data.read_tokenizer(p) end, "tokenizer: '" .. p .. "' " .. msg)
    end
    fails(s:sub(1, 1020), "is too short for an llm.c tokenizer header (1020 bytes)")
    fails(string.pack("<I4", 20240520) .. s:sub(5), "has magic 20240520, expected 20240328 (llm.c's gpt2_tokenizer.bin)")
    fails(s:sub(1, 4) .. string.pack("<I4", 3) .. s:sub(9), "has version 3, expected 1 or 2")
    fails(s:sub(1, -3), "ends inside token 4 of 5")
    fails(s .. "x", "holds 1 bytes after its 5 tokens")
    -- version 1 has no end-of-text entry: GPT-2's 50256, which must then be in the vocabulary
    fails(s:sub(1, 4) .. string.pack("<I4", 1) .. s:sub(9), "names end-of-text token 50256 in a vocabulary of 5")
    os.remove(p)
  end)

  it("draws batches whose windows cross shard boundaries", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    for s = 0, 2 do -- tokens 0..29 over three shards of 10, uint16 then uint32 widths alike
      local t = {}
      for i = 1, 10 do t[i] = 10 * s + i - 1 end
      data.write_shard(("%s/train_%d.bin"):format(dir, s), t)
    end
    local ds = data.load(dir .. "/train_*.bin", { val = dir .. "/train_2.bin" })
    flow.manual_seed(3)
    local x, y = ds:batch("train", 6, 12) -- 12 + 1 tokens: every window spans two shards
    assert.are.same({ 6, 12 }, x:shape())
    for b, row in ipairs(x:totable()) do
      local yr = y:totable()[b]
      for t = 1, 12 do
        assert.are.equal(row[1] + t - 1, row[t])
        assert.are.equal(row[t] + 1, yr[t])
      end
    end
    os.execute("rm -rf '" .. dir .. "'")
  end)
end)

describe("GPT training", function()
  it("has GPT-2's parameter layout and tied embeddings", function()
    flow.manual_seed(0)
    local m = gpt.GPT(CFG)
    local names = {}
    for i, nt in ipairs(m:named_parameters()) do names[i] = nt[1] end
    assert.are.equal("wte.weight", names[1])
    assert.are.equal("wpe.weight", names[2])
    assert.are.equal("h.0.ln_1.weight", names[3])
    assert.are.equal("h.0.attn.c_attn.weight", names[5])
    assert.are.equal("ln_f.bias", names[#names])
    -- 2 layers * (2*2*32 LN + 32*96+96 + 32*32+32 + 32*128+128 + 128*32+32) + wte + wpe + ln_f
    local per_layer = 4 * 32 + (32 * 96 + 96) + (32 * 32 + 32) + (32 * 128 + 128) + (128 * 32 + 32)
    assert.are.equal(2 * per_layer + 256 * 32 + 16 * 32 + 2 * 32, m:num_parameters())
    local logits = m(flow.tensor({ { 1, 2, 3 } }, { dtype = "int64" }))
    assert.are.same({ 1, 3, 256 }, logits:shape())
  end)

  it("starts near ln(vocab) and the loss falls within a few steps", function()
    local p = text_file()
    local ds = data.load(p)
    os.remove(p)
    flow.manual_seed(1)
    local m = gpt.GPT(CFG)
    local opt = m:configure_optimizer({ lr = 1e-2, weight_decay = 0.1 })
    local losses = train(m, opt, ds, 0, 12)
    assert(math.abs(losses[1] - math.log(256)) < 0.3, "first loss " .. losses[1])
    assert(losses[12] < losses[1] - 1.0, ("loss %.3f -> %.3f"):format(losses[1], losses[12]))
  end)

  it("save and resume reproduce the uninterrupted losses exactly", function()
    local p = text_file()
    local ds = data.load(p)
    os.remove(p)
    flow.manual_seed(2)
    local m = gpt.GPT(CFG)
    local opt = m:configure_optimizer({ lr = 1e-2 })
    local first = train(m, opt, ds, 0, 4)
    local ck = os.tmpname()
    local rng = flow.get_rng_state()
    local state = { rng_seed = rng.seed, rng_offset = rng.offset }
    for k, v in pairs(m:state_dict()) do state["model." .. k] = v end
    for k, v in pairs(opt:state_dict()) do state["optim." .. k] = v end
    flow.save(state, ck)
    local rest = train(m, opt, ds, 4, 8)

    flow.manual_seed(99) -- a different init and RNG state, overwritten by the checkpoint
    local m2 = gpt.GPT(CFG)
    local opt2 = m2:configure_optimizer({ lr = 1e-2 })
    local loaded = flow.load(ck)
    os.remove(ck)
    local msd, osd = {}, {}
    for k, v in pairs(loaded) do
      if k:match("^model%.") then msd[k:sub(7)] = v elseif k:match("^optim%.") then osd[k:sub(7)] = v end
    end
    m2:load_state_dict(msd)
    opt2:load_state_dict(osd)
    flow.set_rng_state({ seed = loaded.rng_seed, offset = loaded.rng_offset })
    local resumed = train(m2, opt2, ds, 4, 8)
    assert.are.equal(4, #first)
    assert.are.same(rest, resumed)
  end)
end)

describe("scripts/train_gpt.lua", function()
  local run, losses = script.run, script.losses

  it("resumes bit for bit (dropout included): the same losses as an uninterrupted run", function()
    local p = text_file()
    local ck = os.tmpname()
    local base = ("--data %s --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --steps 6 --warmup 2 --log-every 1 "
      .. "--eval-every 3 --eval-iters 2 --sample-len 8 --seed 3 --dropout 0.1"):format(p)
    local ok1, full = run(base)
    assert.is_true(ok1, full)
    local ok2, part = run(base .. " --stop-at 3 --save " .. ck)
    assert.is_true(ok2, part)
    local ok3, resumed = run(base .. " --resume " .. ck)
    assert.is_true(ok3, resumed)
    local lf, lp, lr = losses(full), losses(part), losses(resumed)
    for s = 1, 3 do assert.are.equal(lf[s], lp[s]) end
    for s = 4, 6 do assert.are.equal(lf[s], lr[s]) end
    assert.is_nil(lr[3])
    assert.matches("val loss [%d.]+", full)
    assert.matches("sample: The ", full)
    os.remove(p)
    os.remove(ck)
  end)

  it("graph mode: the eager losses, and checkpoints move between eager and graph both ways", function()
    local p = text_file()
    local ck = os.tmpname()
    local base = ("--data %s --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --steps 6 --warmup 2 --log-every 1 "
      .. "--eval-every 3 --eval-iters 2 --sample-len 8 --seed 3 --dropout 0.1"):format(p)
    local ok1, full = run(base)
    assert.is_true(ok1, full)
    local okg, graph = run(base .. " --mode graph")
    assert.is_true(okg, graph)
    local lf, lg = losses(full), losses(graph)
    for s = 1, 6 do assert.are.equal(lf[s], lg[s]) end
    -- autocast reaches the kernels on the actor threads: bf16 in a graph is eager's bf16
    local okb, be = run(base .. " --amp bf16")
    local okc, bg = run(base .. " --amp bf16 --mode graph")
    assert.is_true(okb and okc, be .. bg)
    for s = 1, 6 do assert.are.equal(losses(be)[s], losses(bg)[s]) end
    for _, modes in ipairs({ { "eager", "graph" }, { "graph", "eager" } }) do
      local ok2, part = run(base .. " --stop-at 3 --save " .. ck .. " --mode " .. modes[1])
      assert.is_true(ok2, part)
      local ok3, resumed = run(base .. " --resume " .. ck .. " --mode " .. modes[2])
      assert.is_true(ok3, resumed)
      local lr = losses(resumed)
      for s = 4, 6 do assert.are.equal(lf[s], lr[s]) end
    end
    os.remove(p)
    os.remove(ck)
  end)

  it("--amp bf16 on the CPU learns like float32 (or says it runs float32 without AVX512-BF16)", function()
    local p = text_file()
    local base = ("--data %s --layers 1 --dim 32 --heads 2 --seq 16 --batch 4 --steps 8 --warmup 2 --log-every 1 "
      .. "--eval-every 8 --eval-iters 2 --sample-len 0 --seed 3"):format(p)
    local ok1, f32 = run(base)
    assert.is_true(ok1, f32)
    local ok2, bf16 = run(base .. " --amp bf16")
    assert.is_true(ok2, bf16)
    assert.matches("bf16 autocast", bf16)
    local lf, lb = losses(f32), losses(bf16)
    for s = 1, 8 do assert.is_true(math.abs(lf[s] - lb[s]) < 0.05, ("step %d: %s vs %s"):format(s, lf[s], lb[s])) end
    os.remove(p)
  end)

  it("rejects flags it cannot honour with a clear message", function()
    local cases = {
      { "--dp 2", "%-%-dp 2 x %-%-tp 1 x %-%-pp 1 must equal the number of ranks %(1%)" },
      { "--mode lazy", "%-%-mode lazy: expected eager or graph" },
      { "--batch 0", "%-%-batch 0: expected a positive integer" },
      { "--heads 0", "%-%-heads 0: expected a positive integer" },
      { "--save /nonexistent-dir/ck.st", "%-%-save /nonexistent%-dir/ck.st: cannot write there" },
      { "--pp 2", "%-%-pp 2 needs %-%-mode graph" },
      { "--mode graph --pp 2", "%-%-dp 1 x %-%-tp 1 x %-%-pp 2 must equal the number of ranks %(1%)" },
      { "--mode graph --micro-batches 3 --batch 8", "%-%-micro%-batches 3 must divide %-%-batch 8" },
      { "--mode graph --zero 4", "%-%-zero 4: expected 0, 1, 2 or 3" },
      { "--checkpointing", "%-%-checkpointing true needs %-%-mode graph" },
      { "--layer 2", "unknown flag %-%-layer %(flags: .*%-%-layers" },
      { "--device tpu", "%-%-device tpu: expected cpu or cuda" },
      { "--amp fp8 --device cuda", flow.cuda.is_available() and "%-%-amp fp8: expected off or bf16"
                                     or "%-%-device cuda: cuda is not available %(.+%)" },
    }
    for _, c in ipairs(cases) do
      local ok, out = run(c[1])
      assert.is_false(ok, c[1])
      assert.matches(c[2], out)
    end
  end)

  it("prints samples of token shards through llm.c's tokenizer file next to them, else as token ids", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p '" .. dir .. "'"))
    local toks = {}
    for i = 1, 200 do toks[i] = (i * 7) % 50 end
    data.write_shard(dir .. "/train_000.bin", toks)
    local pieces = {}
    for i = 0, 50256 do pieces[i + 1] = ("[%d]"):format(i) end
    data.write_tokenizer(dir .. "/gpt2_tokenizer.bin", pieces, 50256)
    local base = ("--data %s/train_*.bin --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --steps 2 --warmup 1 "
      .. "--eval-every 0 --sample-len 5"):format(dir)
    local ok, out = run(base)
    assert.is_true(ok, out)
    local sample = out:match("\nsample: ([^\n]*)")
    assert.truthy(sample, out)
    local rest, n = sample:gsub("%[%d+%]", "")
    assert.are.same({ "", 5 }, { rest, n })
    -- the same run with the file named
    local okn, named = run(base .. " --tokenizer " .. dir .. "/gpt2_tokenizer.bin")
    assert.is_true(okn, named)
    assert.are.equal(sample, named:match("\nsample: ([^\n]*)"))
    -- a tokenizer of another vocabulary, a broken one, or one for byte data: said, exit 2
    data.write_tokenizer(dir .. "/small.bin", { "a", "b" }, 1)
    local bad = {
      { " --tokenizer " .. dir .. "/small.bin", "%-%-tokenizer .-small.bin: a vocabulary of 2 tokens, but %-%-data's is 50257" },
      { " --tokenizer " .. dir .. "/train_000.bin", "tokenizer: '.-train_000.bin' has magic 20240520, expected 20240328" },
    }
    for _, c in ipairs(bad) do
      local okb, msg = run(base .. c[1])
      assert.is_false(okb)
      assert.matches(c[2], msg)
    end
    local p = text_file()
    local okt, msg = run("--data " .. p .. " --tokenizer " .. dir .. "/small.bin")
    assert.is_false(okt)
    assert.matches("%-%-tokenizer .-: %-%-data holds bytes, which print as text without one", msg)
    os.remove(p)
    -- without a tokenizer file: ids, said once, after GPT-2's <|endoftext|>
    os.remove(dir .. "/gpt2_tokenizer.bin")
    local oki, ids = run(base)
    assert.is_true(oki, ids)
    assert.matches("\nsample %(token ids after 50256; no %-%-tokenizer, and no gpt2_tokenizer.bin next to %-%-data%): %d+ %d+ %d+ %d+ %d+\n", ids .. "\n")
    os.execute("rm -rf '" .. dir .. "'")
  end)

  it("--help lists every flag with its description and default, and exits 0", function()
    local ok, out = run("--help")
    assert.is_false(ok)
    assert.matches("exit 0$", out)
    assert.matches("Usage: train_gpt.lua", out)
    assert.matches("%-%-steps <n>%s+optimizer steps %(default: 1200%)", out)
    assert.matches("%-%-warmup <n>%s+linear warmup steps %(default: 5%% of %-%-steps", out)
    assert.matches("%-%-data <data>%s+text file.-%(default:%s+/usr/share/doc/jargon%-text/jargon.txt.gz%)", out)
    assert.matches("%-%-mode <mode>%s+eager, or graph", out)
    -- every flag main's graph mode has, switches included
    for _, f in ipairs({ "--pp", "--micro-batches", "--zero", "--checkpointing", "--log", "--resume", "--amp" }) do
      assert.matches("\n%s+" .. f:gsub("%-", "%%-") .. "[ <]", out)
    end
    assert.matches("%-%-checkpointing%s+recompute", out)
  end)

  it("rejects contradictory flags, and a --resume with nothing left to train", function()
    local p = text_file()
    local ck = os.tmpname()
    local base = ("--data %s --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --sample-len 0 --eval-every 0"):format(p)
    local ok, out = run(base .. " --steps 3 --save " .. ck)
    assert.is_true(ok, out)
    local cases = {
      { " --steps 3 --resume " .. ck, "%-%-resume .*: the checkpoint is at step 3, which is not below %-%-steps 3: nothing to train" },
      { " --steps 2 --resume " .. ck, "the checkpoint is at step 3, which is not below %-%-steps 2" },
      { " --steps 9 --stop-at 3 --resume " .. ck, "the checkpoint is at step 3, which is not below %-%-stop%-at 3" },
      { " --graph --mode eager", "%-%-graph contradicts %-%-mode eager" },
      { " --no-eval --eval-every 5", "%-%-no%-eval contradicts %-%-eval%-every 5" },
      { " --steps 5 --warmup 6", "%-%-warmup 6 is past %-%-steps 5" },
      { " --steps 5 --stop-at 6", "%-%-stop%-at 6 is past %-%-steps 5" },
      { " --save-every 2", "%-%-save%-every needs %-%-save FILE" },
      { " --steps 2.5", "flag %-%-steps needs an integer, got '2.5'" },
      { " --lr", "option '%-%-lr' requires an argument" },
      { " stray", "too many arguments" },
      { " --warmupp 3", "unknown flag %-%-warmupp .*did you mean %-%-warmup%?" },
    }
    for _, c in ipairs(cases) do
      local ok_, out_ = run(base .. c[1])
      assert.is_false(ok_, c[1])
      assert.matches("exit 2$", out_)
      assert.matches(c[2], out_)
    end
    -- the warmup default is 5% of --steps: a 40-step run warms up over 2 steps, so the lr is
    -- still rising at step 2 and peaks at step 3
    local ok2, out2 = run(base .. " --steps 40 --stop-at 3 --log-every 1 --lr 0.01")
    assert.is_true(ok2, out2)
    local lrs = {}
    for v in out2:gmatch("| lr ([%d.e+-]+) |") do lrs[#lrs + 1] = tonumber(v) end
    assert.are.same({ 0.005, 0.01 }, { lrs[1], lrs[2] })
    os.remove(p)
    os.remove(ck)
  end)

  it("--log writes one JSON object per step and per evaluation; plot.lua draws them as SVG paths", function()
    local json = require "dkjson"
    local p = text_file()
    local log = os.tmpname()
    os.remove(log) -- the log is appended to: start from no file
    local ok, out = run(("--data %s --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --steps 6 --warmup 2 "
      .. "--eval-every 3 --eval-iters 2 --sample-len 0 --log %s"):format(p, log))
    assert.is_true(ok, out)
    local train, val = {}, {}
    for line in io.lines(log) do
      local obj, _, err = json.decode(line)
      assert.is_table(obj, err)
      if obj.val_loss then
        val[#val + 1] = obj
        assert.are.same({ step = obj.step, val_loss = obj.val_loss }, obj) -- nothing else
      else
        train[#train + 1] = obj
        for _, k in ipairs({ "step", "loss", "lr", "tokens_per_s", "ms" }) do assert.is_number(obj[k], k) end
        assert.is_true(obj.ms > 0 and obj.tokens_per_s > 0)
      end
    end
    assert.are.equal(6, #train)
    for i, t in ipairs(train) do assert.are.equal(i, t.step) end
    assert.are.same({ 3, 6 }, { val[1].step, val[2].step })
    -- the logged loss is the printed one
    assert.matches(("step%%s+6/6 | loss %.6f"):format(train[6].loss):gsub("%.", "%%."), out)
    assert.is_true(train[2].lr > train[6].lr)

    local svg = os.tmpname()
    local ok2, out2 = run(log .. " " .. svg, "scripts/plot.lua")
    assert.is_true(ok2, out2)
    assert.matches("6 train and 2 val points", out2)
    local f = assert(io.open(svg))
    local text = f:read("a")
    f:close()
    assert.matches("^<svg xmlns=\"http://www.w3.org/2000/svg\"", text)
    assert.matches("</svg>\n$", text)
    -- a path per curve, a point per logged value; x grows with the step, y falls with the loss
    local paths = {}
    for id, d in text:gmatch('<path id="(%w+)" d="([^"]*)"') do
      local pts = {}
      for x, y in d:gmatch("[ML]([%d.]+) ([%d.]+)") do pts[#pts + 1] = { tonumber(x), tonumber(y) } end
      paths[id] = pts
    end
    assert.are.equal(6, #paths.train)
    assert.are.equal(2, #paths.val)
    for i = 2, 6 do assert.is_true(paths.train[i][1] > paths.train[i - 1][1]) end
    local lo, hi = 1, 1
    for i = 2, 6 do
      if train[i].loss < train[lo].loss then lo = i end
      if train[i].loss > train[hi].loss then hi = i end
    end
    assert.is_true(paths.train[lo][2] > paths.train[hi][2]) -- SVG's y axis points down
    local ok3, out3 = run(p .. " " .. svg, "scripts/plot.lua")
    assert.is_false(ok3)
    assert.matches("plot: .*:1: not a JSON object", out3)
    for _, f_ in ipairs({ p, log, svg }) do os.remove(f_) end
  end)

  -- on a GPU: the same small run on cuda (float32, then bf16 autocast) learns like the CPU run
  local gpu = flow.cuda.is_available()
  local function git(name, fn)
    if gpu then it(name, fn) else it(name, function() pending("no GPU: " .. tostring(flow.cuda.unavailable_reason())) end) end
  end
  git("--device cuda gives the CPU losses; --amp bf16 stays close", function()
    local p = text_file()
    local base = ("--data %s --layers 1 --dim 16 --heads 2 --seq 8 --batch 2 --steps 4 --warmup 2 --log-every 1 "
      .. "--eval-every 4 --eval-iters 2 --sample-len 8 --seed 3"):format(p)
    local ok1, cpu = run(base)
    assert.is_true(ok1, cpu)
    local ok2, gpu_out = run(base .. " --device cuda")
    assert.is_true(ok2, gpu_out)
    local ok3, amp = run(base .. " --device cuda --amp bf16")
    assert.is_true(ok3, amp)
    local lc, lg, la = losses(cpu), losses(gpu_out), losses(amp)
    for s = 1, 4 do
      assert.is_true(math.abs(tonumber(lc[s]) - tonumber(lg[s])) < 1e-3, ("step %d: %s vs %s"):format(s, lc[s], lg[s]))
      assert.is_true(math.abs(tonumber(lc[s]) - tonumber(la[s])) < 5e-2, ("step %d: %s vs %s (bf16)"):format(s, lc[s], la[s]))
    end
    assert.matches("sample: The ", gpu_out)
    os.remove(p)
  end)
end)
