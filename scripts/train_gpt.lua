-- Train a small GPT-2 on byte-level text (or llm.c .bin token shards):
--   flowlua scripts/train_gpt.lua [--layers 4 --dim 128 --heads 4 --seq 64 --batch 16 --steps 1200
--                                  --data FILE --save CKPT --resume CKPT --device cuda --amp bf16
--                                  --log run.jsonl ...]      (--help lists every flag)
-- On GPUs: --device cuda (each rank drives flow.cuda.local_device()). --amp bf16 runs the matmuls
-- and attention in bfloat16 with float32 master weights: on cuda, and on CPUs with AVX512-BF16 or
-- AMX through oneDNN (elsewhere it says so and runs float32). --dp/--tp/--pp lay the model out
-- over ranks; --mode graph runs the step as a compiled graph on the actor engine.
-- AdamW with linear warmup and cosine decay, gradient clipping, periodic validation loss, a
-- sampled text at the end, and checkpoints that resume bit for bit.
local flow = require "flow"
local utils = require "flow.utils"
local data = require "flow.data"
local gpt = require "flow.gpt"

local function fail(msg)
  io.stderr:write("train_gpt: ", msg, "\n")
  os.exit(2)
end

-------------------------------------------------------------------------------- flags

-- Flags by lua-argparse (Debian: lua-argparse): "--name value" or "--name=value", dashes in names
-- become underscores in args ("--min-lr" sets args.min_lr), --help lists them with defaults.
local argparse_ok, argparse = pcall(require, "argparse")
if not argparse_ok then fail("needs lua-argparse (Debian: apt install lua-argparse; LuaRocks: luarocks install argparse)") end

-- --help is our own flag, not argparse's: argparse's prints and exits from inside the parser, and
-- the specs run this script in-process with their own print and os.exit.
local parser = argparse("train_gpt.lua", "Train a small GPT-2 on byte-level text or llm.c .bin token shards.")
  :help_max_width(100):add_help(false)
parser:flag("-h --help", "show this help (every flag with its default) and exit")
-- the converter of a flag's value to a number of this math.type ("integer" or "float")
local function number(kind, flag)
  return function(s)
    local n = tonumber(s)
    if kind == "integer" then n = n and math.tointeger(n) end
    if n == nil then return nil, ("flag %s needs %s, got '%s'"):format(flag, kind == "integer" and "an integer" or "a number", s) end
    return n
  end
end
-- Sections of {name, default, description}. A default of false marks a flag another flag can
-- contradict: argparse leaves it nil when not given (so the contradiction can be told apart from
-- the default) and the description carries the default.
local integer = "integer" -- for a flag whose default is false
local sections = {
  {"Model",
    {"layers", 4, "transformer blocks"}, {"dim", 128, "embedding width"}, {"heads", 4, "attention heads"},
    {"seq", 64, "context length (tokens)"}, {"dropout", 0.0, "dropout probability"}},
  {"Training",
    {"batch", 16, "sequences per step"}, {"steps", 1200, "optimizer steps"},
    {"lr", 3e-3, "peak learning rate (AdamW)"},
    {"warmup", false, "linear warmup steps (default: 5% of --steps, 60 for 1200)", integer},
    {"min_lr", 3e-4, "learning rate at the end of the cosine decay"}, {"weight_decay", 0.1, "AdamW weight decay"},
    {"grad_clip", 1.0, "clip the gradients' global norm to this (0: off)"}, {"seed", 1337, "RNG seed"},
    {"stop_at", 0, "stop after this step (0: at --steps); the schedule still spans --steps"}},
  {"Data, evaluation and logs",
    {"data", "/usr/share/doc/jargon-text/jargon.txt.gz", "text file (bytes), .gz, or llm.c .bin token shards (a glob: 'dir/train_*.bin')"},
    {"val", "", "validation tokens: a file or a glob of shards (default: the last --val-fraction of --data)"},
    {"val_fraction", 0.05, "share of --data held out for validation when there is no --val"},
    {"eval_every", false, "validation loss every this many steps, 0: off (default: 300)", integer},
    {"eval_iters", 10, "batches per validation loss"}, {"log_every", 50, "print a step line every this many steps"},
    {"log", "", "append one JSON object per step and per evaluation to this .jsonl file"},
    {"sample_len", 200, "tokens sampled at the end (0: off)"},
    {"tokenizer", "", "llm.c tokenizer file to print samples of token shards as text (default: gpt2_tokenizer.bin next to --data, if there)"},
    {"temperature", 0.8, "sampling temperature"}},
  {"Checkpoints",
    {"save", "", "write a checkpoint here (at the end, and every --save-every steps)"},
    {"save_every", 0, "checkpoint every this many steps (0: only at the end)"},
    {"resume", "", "continue from this checkpoint (its step must be below --steps)"}},
  {"Parallelism and devices",
    {"dp", 1, "data-parallel ranks"}, {"tp", 1, "tensor-parallel ranks"},
    {"pp", 1, "pipeline stages, each on its own dp x tp ranks (needs --mode graph)"},
    {"mode", false, "eager, or graph: the step traced once and run by the actor engine (default: eager)"},
    {"micro_batches", 1, "split each batch into this many, gradients accumulated (needs --mode graph)"},
    {"zero", 0, "ZeRO stage 0-3: shard optimizer state, gradients, parameters (needs --mode graph)"},
    {"device", "cpu", "cpu, cuda (this rank's GPU) or cuda:N"},
    {"amp", "off", "off, or bf16 (autocast matmuls and attention; on the CPU with AVX512-BF16, else float32)"}},
}
local names = {}
for _, sec in ipairs(sections) do
  local opts = {}
  for i = 2, #sec do
    local name, default, help, convert = table.unpack(sec[i])
    names[#names + 1] = "--" .. name:gsub("_", "-")
    local kind = (convert == integer or math.type(default) == "integer") and "n" or math.type(default) and "x"
      or default == "" and "file" or name
    local o = parser:option(names[#names], help):argname("<" .. kind .. ">")
    if default then o:default(tostring(default)):show_default(default ~= "") end
    if convert or math.type(default) then o:convert(number(convert or math.type(default), names[#names])) end
    opts[#opts + 1] = o
  end
  if sec[1] == "Parallelism and devices" then
    opts[#opts + 1] = parser:flag("--graph", "same as --mode graph")
    opts[#opts + 1] = parser:flag("--checkpointing", "recompute each block's activations in the backward (graph mode)")
    names[#names + 1] = "--graph"
    names[#names + 1] = "--checkpointing"
  elseif sec[1] == "Data, evaluation and logs" then
    opts[#opts + 1] = parser:flag("--no-eval", "no validation loss (same as --eval-every 0)")
    names[#names + 1] = "--no-eval"
  end
  parser:group(sec[1], table.unpack(opts))
end
names[#names + 1] = "--help"
table.sort(names)

local ok, args = parser:pparse(arg)
if not ok then
  -- name the unknown flag and list the known ones, as the other scripts' flags do
  local bad = args:match("^unknown option '%-%-([^']*)'")
  if bad then
    local tip = args:match("Did you mean '([^']*)'")
    fail(("unknown flag --%s (flags: %s)%s"):format(bad, table.concat(names, " "), tip and ("; did you mean %s?"):format(tip) or ""))
  end
  fail(args:gsub("\n", " ") .. " (see --help)")
end
if args.help then
  print(parser:get_help())
  os.exit(0)
end
if args.graph and args.mode and args.mode ~= "graph" then fail(("--graph contradicts --mode %s"):format(args.mode)) end
args.mode = args.mode or (args.graph and "graph" or "eager")
args.checkpointing = args.checkpointing or false
if args.no_eval and args.eval_every and args.eval_every > 0 then
  fail(("--no-eval contradicts --eval-every %d"):format(args.eval_every))
end
args.eval_every = args.no_eval and 0 or args.eval_every or 300
args.warmup = args.warmup or math.max(1, args.steps // 20)
if args.warmup > args.steps then fail(("--warmup %d is past --steps %d"):format(args.warmup, args.steps)) end
if args.stop_at > args.steps then fail(("--stop-at %d is past --steps %d"):format(args.stop_at, args.steps)) end
if args.save_every > 0 and args.save == "" then fail("--save-every needs --save FILE") end

for _, k in ipairs({ "layers", "dim", "heads", "seq", "batch", "steps" }) do
  if args[k] < 1 then fail(("--%s %s: expected a positive integer"):format(k, tostring(args[k]))) end
end
if args.save ~= "" then -- find an unwritable path now, not after the whole run
  local probe = args.save .. ".probe"
  local f, err = io.open(probe, "w")
  if not f then fail(("--save %s: cannot write there (%s)"):format(args.save, err)) end
  f:close()
  os.remove(probe)
end
if args.mode ~= "eager" and args.mode ~= "graph" then fail(("--mode %s: expected eager or graph"):format(args.mode)) end
if args.mode ~= "graph" then
  for _, f in ipairs({ { "pp", 1 }, { "micro_batches", 1 }, { "zero", 0 }, { "checkpointing", false } }) do
    if args[f[1]] ~= f[2] then fail(("--%s %s needs --mode graph"):format(f[1]:gsub("_", "-"), tostring(args[f[1]]))) end
  end
end
if args.zero < 0 or args.zero > 3 then fail(("--zero %s: expected 0, 1, 2 or 3"):format(tostring(args.zero))) end
if args.micro_batches < 1 or args.batch % args.micro_batches ~= 0 then
  fail(("--micro-batches %d must divide --batch %d"):format(args.micro_batches, args.batch))
end
if args.pp < 1 or args.pp > args.layers then fail(("--pp %d: expected 1 to --layers (%d) stages"):format(args.pp, args.layers)) end
if args.dp < 1 or args.tp < 1 or args.dp * args.tp * args.pp ~= flow.world_size() then
  fail(("--dp %d x --tp %d x --pp %d must equal the number of ranks (%d): run under mpirun -np %d"):format(
    args.dp, args.tp, args.pp, flow.world_size(), args.dp * args.tp * args.pp))
end
local parallel = args.dp * args.tp * args.pp > 1
if args.tp > 1 and (args.heads % args.tp ~= 0 or (4 * args.dim) % args.tp ~= 0) then
  fail(("--tp %d must divide --heads %d and 4 x --dim"):format(args.tp, args.heads))
end
if args.device ~= "cpu" and not args.device:match("^cuda") then
  fail(("--device %s: expected cpu or cuda"):format(args.device))
end
local on_gpu = args.device ~= "cpu"
if on_gpu then
  if not flow.cuda.is_available() then fail(("--device %s: cuda is not available (%s)"):format(args.device, flow.cuda.unavailable_reason())) end
  if args.device == "cuda" then args.device = flow.cuda.local_device() end
end
if args.amp ~= "off" and args.amp ~= "bf16" then fail(("--amp %s: expected off or bf16"):format(args.amp)) end
if args.dim % args.heads ~= 0 then fail(("--dim %d must be divisible by --heads %d"):format(args.dim, args.heads)) end

-------------------------------------------------------------------------------- data and model

flow.manual_seed(args.seed)
local ok_data, ds = pcall(data.load, args.data, { val_fraction = args.val_fraction, val = args.val ~= "" and args.val or nil })
if not ok_data then fail(ds) end

-- Samples of token shards print as text through llm.c's tokenizer file: --tokenizer, or
-- gpt2_tokenizer.bin in --data's folder (where llm.c's data scripts write it); without one, as ids.
local tokenizer
if ds.vocab_size == 256 then
  if args.tokenizer ~= "" then fail(("--tokenizer %s: --data holds bytes, which print as text without one"):format(args.tokenizer)) end
else
  local path = args.tokenizer
  if path == "" then
    local nearby = (args.data:match("^(.*)/[^/]*$") or ".") .. "/gpt2_tokenizer.bin"
    local f = io.open(nearby, "rb")
    if f then f:close(); path = nearby end
  end
  if path ~= "" then
    local ok_tok, tok = pcall(data.read_tokenizer, path)
    if not ok_tok then fail(tok) end
    if tok.vocab_size ~= ds.vocab_size then
      fail(("--tokenizer %s: a vocabulary of %d tokens, but --data's is %d"):format(path, tok.vocab_size, ds.vocab_size))
    end
    tokenizer = tok
  end
end

local cfg = { vocab_size = ds.vocab_size, block_size = args.seq, n_layer = args.layers, n_head = args.heads, n_embd = args.dim,
              dropout = args.dropout }
local model = gpt.GPT(cfg)
if on_gpu then model:to(args.device) end

-- Parallel layouts are annotations only: one placement over all ranks (a dp x tp mesh when both
-- are > 1), parameters broadcast over dp and Megatron-split over tp, batches split over dp.
-- Every rank draws the same batch from the same RNG; to_global keeps each rank's slice.
local S, B = flow.sbp.split, flow.sbp.broadcast
-- With --pp P each pipeline stage is such a layout on its own dp x tp ranks (stage s holds ranks
-- s*dp*tp ...); batches live on all ranks (a dp*P x tp mesh), and the graph moves activations
-- between stages.
local place, batch_sbp, replicated
local stage_places = {}
local devtype = on_gpu and "cuda" or "cpu"
if parallel then
  local two_d = args.dp > 1 and args.tp > 1
  -- rows x tp ranks from `first`: a 2-D mesh for dp x tp, else 1-D
  local function layout(first, rows)
    local ranks = {}
    for r = first, first + rows * args.tp - 1 do ranks[#ranks + 1] = r end
    if not two_d then return flow.placement(devtype, ranks) end
    local mesh = {}
    for i = 0, rows - 1 do
      mesh[i + 1] = {}
      for j = 0, args.tp - 1 do mesh[i + 1][j + 1] = ranks[i * args.tp + j + 1] end
    end
    return flow.placement(devtype, mesh)
  end
  for s = 0, args.pp - 1 do stage_places[s + 1] = layout(s * args.dp * args.tp, args.dp) end
  place = args.pp > 1 and layout(0, args.dp * args.pp) or stage_places[1]
  local param_sbp
  if two_d then
    batch_sbp, replicated = { S(0), B }, { B, B }
    param_sbp = function(name) return { B, gpt.tensor_parallel_sbp(name) } end
  elseif args.tp > 1 then
    batch_sbp, replicated, param_sbp = B, B, gpt.tensor_parallel_sbp
  else
    batch_sbp, replicated, param_sbp = S(0), B, B
  end
  model:to_global(stage_places[1], param_sbp)
end
local function get_batch(split)
  local x, y = ds:batch(split, args.batch, args.seq)
  if on_gpu then x, y = x:to(args.device), y:to(args.device) end
  if not parallel then return x, y end
  return x:to_global(place, replicated):to_global(place, batch_sbp), y:to_global(place, replicated):to_global(place, batch_sbp)
end

local opt = model:configure_optimizer({ lr = args.lr, weight_decay = args.weight_decay })
local lr_at = flow.optim.cosine_schedule({ lr = args.lr, min_lr = args.min_lr, warmup = args.warmup, steps = args.steps })

-- The entropy of the train split's token frequencies: what a model that ignores context reaches.
local function unigram_entropy(toks)
  local counts, n = {}, toks:len()
  local chunk = 1 << 16
  for start = 0, n - 1, chunk do
    for _, t in ipairs(toks:slice(start, math.min(chunk, n - start))) do counts[t] = (counts[t] or 0) + 1 end
  end
  local h = 0
  for _, c in pairs(counts) do h = h - c / n * math.log(c / n) end
  return h
end

print(("model: %d layers, dim %d, %d heads, seq %d, vocab %d: %.2fM parameters on %s%s"):format(
  args.layers, args.dim, args.heads, args.seq, cfg.vocab_size, model:num_parameters() / 1e6,
  parallel and tostring(place) or args.device, args.amp == "bf16" and " (bf16 autocast)" or ""))
print(("data: %s: %d train / %d val tokens; unigram baseline %.3f nats; uniform %.3f"):format(
  args.data, ds.train:len(), ds.val:len(), unigram_entropy(ds.train), math.log(cfg.vocab_size)))

-------------------------------------------------------------------------------- checkpoints

-- One flat table: "model.<param>", "optim.<key>", and metadata (step, RNG state, config).
-- A checkpoint holds whole (logical) tensors, whatever the layout: global ones are gathered to
-- every rank (in one order on all ranks: it is collective) and rank 0 writes the file, so a run
-- saved at --dp 2 --pp 2 resumes at 1 rank and the reverse.
local function save_checkpoint(path, next_step)
  local ck = { step = next_step, layers = args.layers, dim = args.dim, heads = args.heads, seq = args.seq,
               vocab = cfg.vocab_size }
  for k, v in pairs(model:state_dict()) do ck["model." .. k] = v end -- flow.save reads device tensors too
  for k, v in pairs(opt:state_dict()) do ck["optim." .. k] = v end
  if parallel then
    local keys = {}
    for k, v in pairs(ck) do if flow.is_tensor(v) and v.is_global then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do ck[k] = ck[k]:to_global(place, flow.optim.broadcast_sbp(place)):to_local() end
  end
  local s = flow.get_rng_state() -- batches and dropout draw from it
  ck.rng_seed, ck.rng_offset = s.seed, s.offset
  if flow.rank() == 0 then flow.save(ck, path) end
end

local function load_checkpoint(path)
  local ck = flow.load(path)
  for _, k in ipairs({ "layers", "dim", "heads", "seq", "vocab" }) do
    local want = k == "vocab" and cfg.vocab_size or args[k]
    if ck[k] ~= want then fail(("--resume %s: the checkpoint has %s %s, this run %s"):format(path, k, tostring(ck[k]), want)) end
  end
  local msd, osd = {}, {}
  for k, v in pairs(ck) do
    local mk = k:match("^model%.(.+)$")
    local ok_ = k:match("^optim%.(.+)$")
    if mk then msd[mk] = v elseif ok_ then osd[ok_] = v end
  end
  model:load_state_dict(msd)
  opt:load_state_dict(osd)
  flow.set_rng_state({ seed = ck.rng_seed, offset = ck.rng_offset })
  return math.tointeger(ck.step)
end

local start = 0
if args.resume ~= "" then
  local ok_ck, step = pcall(load_checkpoint, args.resume)
  if not ok_ck then fail(step) end
  start = step
  local last = args.stop_at > 0 and args.stop_at or args.steps
  if start >= last then
    fail(("--resume %s: the checkpoint is at step %d, which is not below %s %d: nothing to train (raise --steps)"):format(
      args.resume, start, args.stop_at > 0 and "--stop-at" or "--steps", last))
  end
  print(("resumed from %s at step %d"):format(args.resume, start))
end

-- --log FILE.jsonl: one JSON object a line, {"step", "loss", "lr", "tokens_per_s", "ms"} per step
-- and {"step", "val_loss"} per evaluation, written by rank 0 and flushed per line so a run can be
-- watched (scripts/plot.lua draws it). Appended to, so a resumed run continues its log.
local log_file
if args.log ~= "" and flow.rank() == 0 then
  local err
  log_file, err = io.open(args.log, "a")
  if not log_file then fail(("--log %s: %s"):format(args.log, err)) end
end
-- fields: a list of {key, number}, kept in order so the lines read alike
local function log(fields)
  if not log_file then return end
  local parts = {}
  for i, kv in ipairs(fields) do
    local v = kv[2]
    -- %.17g round-trips a double; JSON has no inf or nan
    local text = math.type(v) == "integer" and tostring(v)
      or (v == v and math.abs(v) ~= math.huge) and ("%.17g"):format(v) or "null"
    parts[i] = ('"%s":%s'):format(kv[1], text)
  end
  log_file:write("{", table.concat(parts, ","), "}\n")
  log_file:flush()
end

-------------------------------------------------------------------------------- training

-- fn(...) under bf16 autocast with --amp bf16 (the optimizer step stays outside, in float32)
local function amp(fn, ...)
  if args.amp == "bf16" then return flow.autocast("bfloat16", fn, ...) end
  return fn(...)
end

-- --mode graph: the step (forward, backward, clipping, AdamW) traced once and run by the actor
-- engine; it shares the model's parameters and the optimizer's state with eager code
-- (evaluation, sampling and checkpoints below).
local step_graph
if args.mode == "graph" then
  step_graph = flow.nn.Graph {
    model = model, optimizer = opt, clip_grad_norm = args.grad_clip > 0 and args.grad_clip or nil,
    config = { amp = args.amp, grad_accumulation_steps = args.micro_batches, zero_stage = args.zero },
    build = function(self, x, y)
      local _, l = self.model(x, y)
      l:backward()
      return l
    end,
  }
  if args.pp > 1 then
    for _, st in ipairs(gpt.pipeline_stages(model, stage_places)) do step_graph:set_stage(st[1], st[2]) end
  end
  if args.checkpointing then -- each block keeps only its input; backward recomputes the rest
    for i = 1, #model.h do step_graph:set_activation_checkpointing(model.h[i]) end
  end
end
-- On a pipeline the model's modules live on different placements: its evaluation runs as a
-- forward-only graph with the same stages (traced in eval mode).
local eval_graph
if args.pp > 1 then
  eval_graph = flow.nn.Graph { model = model, config = { amp = args.amp },
    build = function(self, x, y) local _, l = self.model(x, y); return l end }
  for _, st in ipairs(gpt.pipeline_stages(model, stage_places)) do eval_graph:set_stage(st[1], st[2]) end
end

-- Mean loss over eval_iters batches of the val split: always the same batches (drawn at a fixed
-- RNG state), and the training run's RNG state is put back afterwards.
local function evaluate()
  local saved = flow.get_rng_state()
  flow.set_rng_state({ seed = args.seed + 1, offset = 0 })
  local total = 0
  model:eval()
  flow.no_grad(function()
    for _ = 1, args.eval_iters do
      local x, y = get_batch("val")
      local loss
      if eval_graph then loss = eval_graph(x, y)
      else _, loss = amp(function() return model(x, y) end) end
      total = total + loss:item()
    end
  end)
  model:train()
  flow.set_rng_state(saved)
  return total / args.eval_iters
end

local tokens_per_step = args.batch * args.seq
-- Training FLOPs per token (PaLM's estimate): 6 per parameter plus the attention scores.
local flops_per_token = 6 * model:num_parameters() + 12 * args.layers * args.seq * args.dim
local t_begin = utils.now()
local t_last, steps_since = t_begin, 0
local first_loss, last_loss
local last_step = args.stop_at > 0 and math.min(args.stop_at, args.steps) or args.steps
for step = start, last_step - 1 do
  local t_step = utils.now()
  local lr = lr_at(step)
  opt:set_lr(lr)
  local x, y = get_batch("train")
  local loss
  if step_graph then
    loss = step_graph(x, y)
  else
    loss = amp(function()
      local _, l = model(x, y)
      l:backward()
      return l
    end)
    if args.grad_clip > 0 then flow.optim.clip_grad_norm(model:parameters(), args.grad_clip) end
    opt:step()
    opt:zero_grad()
  end
  local l = loss:item()
  -- free this step's tensors now, so the next step reuses their memory (Lua's GC does not see
  -- tensor sizes and would let dead activations pile up)
  collectgarbage()
  first_loss = first_loss or l
  last_loss = l
  steps_since = steps_since + 1
  local done = step + 1
  local now = utils.now()
  log({{"step", done}, {"loss", l}, {"lr", lr}, {"tokens_per_s", tokens_per_step / (now - t_step)}, {"ms", (now - t_step) * 1000}})
  if done % args.log_every == 0 or done == last_step or step == start then
    local dt = (now - t_last) / steps_since
    print(("step %5d/%d | loss %.6f | lr %.3e | %7.0f tok/s | %5.1f GFLOP/s | %7.1f ms/step | ETA %s"):format(
      done, args.steps, l, lr, tokens_per_step / dt, flops_per_token * tokens_per_step / dt / 1e9, dt * 1000,
      utils.format_seconds(dt * (last_step - done))))
    io.stdout:flush()
    t_last, steps_since = now, 0
  end
  if args.eval_every > 0 and (done % args.eval_every == 0 or done == last_step) then
    local val = evaluate()
    log({{"step", done}, {"val_loss", val}})
    print(("step %5d/%d | val loss %.4f"):format(done, args.steps, val))
  end
  if args.save ~= "" and ((args.save_every > 0 and done % args.save_every == 0) or done == last_step) then
    save_checkpoint(args.save, done)
    print(("saved %s at step %d"):format(args.save, done))
  end
end

local elapsed = utils.now() - t_begin
if first_loss then
  print(("done: %d steps in %s, loss %.4f -> %.4f"):format(last_step - start, utils.format_seconds(elapsed), first_loss, last_loss))
end

-- A token model's sample starts from the token its documents start after: the tokenizer's
-- end-of-text, GPT-2's <|endoftext|> or Llama 3's <|begin_of_text|>.
local SAMPLE_START = { [50257] = 50256, [128256] = 128000 }
if args.sample_len > 0 and args.pp > 1 then
  print("sample: skipped (generation runs eagerly, and the model is split into pipeline stages)")
elseif args.sample_len > 0 and ds.vocab_size == 256 then
  local prompt = data.encode_bytes("The ")
  local toks = model:generate(prompt, args.sample_len, args.temperature)
  print("sample: " .. data.decode_bytes(prompt) .. data.decode_bytes(toks))
elseif args.sample_len > 0 then
  local start_tok = tokenizer and tokenizer.eot or SAMPLE_START[ds.vocab_size] or 0
  local toks = model:generate({ start_tok }, args.sample_len, args.temperature)
  if tokenizer then
    print("sample: " .. tokenizer:decode(toks))
  else
    print(("sample (token ids after %d; no --tokenizer, and no gpt2_tokenizer.bin next to --data): %s"):format(
      start_tok, table.concat(toks, " ")))
  end
end
if log_file then log_file:close() end
