-- Train a small ResNet on Fashion-MNIST (Debian: dataset-fashion-mnist), the paper's CNN case on CPU:
--   flowlua scripts/train_cnn.lua [--epochs 3 --batch 128 --lr 0.1 --width 16 --save CKPT --resume CKPT
--                                  --amp bf16 --train-limit N --test-limit N ...]
--   mpirun -np 2 flowlua scripts/train_cnn.lua --dp 2
-- SGD with Nesterov momentum, linear warmup and cosine decay; test accuracy after each epoch;
-- checkpoints that resume mid-epoch. --dp lays the same model out over ranks by SBP annotations
-- only (parameters broadcast, batches split on dim 0); --amp bf16 runs the convolutions and the
-- GEMMs in bfloat16 (CPUs with AVX512-BF16 or AMX; elsewhere flow says so and runs float32).
local flow = require "flow"
local nn = flow.nn
local utils = require "flow.utils"
local data = require "flow.data"
local resnet = require "flow.resnet"

local function fail(msg)
  io.stderr:write("train_cnn: ", msg, "\n")
  os.exit(2)
end

-------------------------------------------------------------------------------- flags

local DEFAULTS = {
  data = "/usr/share/datasets/fashion-mnist", -- a folder with the four IDX files (.gz or not)
  epochs = 3, batch = 128, lr = 0.1, min_lr = 0.0, warmup = 100, momentum = 0.9, weight_decay = 5e-4,
  width = 16,           -- channels of the first stage (doubled at each of the next two)
  seed = 1,
  train_limit = 0,      -- use only the first N training images (0: all 60,000)
  test_limit = 0,       -- evaluate on the first N test images (0: all 10,000)
  log_every = 50,       -- a progress line every this many steps
  save = "", resume = "",
  dp = 1, amp = "off",
  help = false,
}
local ok_args, args = pcall(utils.parse_args, arg, DEFAULTS)
if not ok_args then fail(args) end
if args.help then
  local names = {}
  for k, v in pairs(DEFAULTS) do names[#names + 1] = ("  --%s (default: %s)"):format(k:gsub("_", "-"), tostring(v)) end
  table.sort(names)
  print("train_cnn.lua: a small ResNet on Fashion-MNIST. Flags:\n" .. table.concat(names, "\n"))
  os.exit(0)
end
if args.amp ~= "off" and args.amp ~= "bf16" then fail(("--amp %s: expected off or bf16"):format(args.amp)) end
if args.dp < 1 or args.dp ~= flow.world_size() then
  fail(("--dp %d must equal the number of ranks (%d): run under mpirun -np %d"):format(args.dp, flow.world_size(), args.dp))
end
if args.batch % args.dp ~= 0 then fail(("--dp %d must divide --batch %d"):format(args.dp, args.batch)) end
if args.epochs < 1 or args.batch < 1 or args.width < 1 then fail("--epochs, --batch and --width must be positive") end

-------------------------------------------------------------------------------- data

-- The four IDX files, gzipped as Debian ships them or unpacked: the first `limit` items of each
-- (all with 0), and the file's own count.
local function idx(name, limit)
  for _, p in ipairs({ args.data .. "/" .. name .. ".gz", args.data .. "/" .. name }) do
    local f = io.open(p, "rb")
    if f then f:close(); return data.read_idx(p, limit > 0 and limit or nil) end
  end
  fail(("--data %s: no %s(.gz) there (Debian: apt install dataset-fashion-mnist)"):format(args.data, name))
end
local function split(set, limit)
  local images, count = idx(set .. "-images-idx3-ubyte", limit)
  local labels, nlabels = idx(set .. "-labels-idx1-ubyte", limit)
  if nlabels ~= count then fail(("%d images but %d labels"):format(count, nlabels)) end
  local n = images:shape()[1]
  -- labels as int64 once, for cross_entropy and comparisons; images stay uint8 until batched
  return { x = images, y = flow.tensor(labels, { dtype = "int64" }), n = n }
end
local ok_data, train, test = pcall(function()
  return split("train", args.train_limit), split("t10k", args.test_limit)
end)
if not ok_data then fail(train) end

-- Fashion-MNIST's training-set pixel mean and standard deviation (of x/255)
local MEAN, STD = 0.2860, 0.3530

-------------------------------------------------------------------------------- model

flow.manual_seed(args.seed)
local model = resnet.ResNet(args.width) -- flow.resnet: stem, three basic blocks, pooling, linear
local n_params = 0
for _, nt in ipairs(model:named_parameters()) do
  if not nt[1]:match("running_") then n_params = n_params + nt[2]:numel() end
end

-- --dp N: one placement over the N ranks; parameters (and batch norm's running statistics)
-- broadcast, each batch split on dim 0. Every rank draws the same batch; to_global keeps its slice.
local parallel = args.dp > 1
local place
local S, B = flow.sbp.split, flow.sbp.broadcast
if parallel then
  local ranks = {}
  for r = 0, args.dp - 1 do ranks[#ranks + 1] = r end
  place = flow.placement("cpu", ranks)
  model:to_global(place, B)
end

-- Images [first, first+n) of a set (in `order`, a list of 0-based indices, when given) as a
-- normalized float32 [n,1,28,28] batch and int64 labels.
local function batch(set, first, n, order)
  local ids
  if order then ids = flow.tensor(table.move(order, first + 1, first + n, 1, {}), { dtype = "int64" })
  else ids = flow.arange(first, first + n, 1, { dtype = "int64" }) end
  local x = flow.tensor(flow.index_select(set.x, 0, ids), { dtype = "float32" })
  x = flow.reshape(x, { n, 1, 28, 28 }) * (1 / (255 * STD)) - MEAN / STD
  local y = flow.index_select(set.y, 0, ids)
  if parallel then
    x = x:to_global(place, B):to_global(place, S(0))
    y = y:to_global(place, B):to_global(place, S(0))
  end
  return x, y
end

-- fn(...) under bf16 autocast with --amp bf16 (the optimizer step stays outside, in float32)
local function amp(fn, ...)
  if args.amp == "bf16" then return flow.autocast("bfloat16", fn, ...) end
  return fn(...)
end

-- Test accuracy (%) in eval mode (batch norm on its running statistics), batches of 500.
local function evaluate()
  model:eval()
  local correct, seen = 0, 0
  flow.no_grad(function()
    local step = 500 - 500 % args.dp
    for first = 0, test.n - 1, step do
      local n = math.min(step, test.n - first)
      n = n - n % args.dp -- a tail that does not split evenly is left out under --dp
      if n > 0 then
        local x, y = batch(test, first, n)
        local pred = flow.argmax(amp(function() return model(x) end), 1)
        correct = correct + flow.tensor(flow.eq(pred, y), { dtype = "float32" }):sum():item()
        seen = seen + n
      end
    end
  end)
  model:train()
  return 100 * correct / seen
end

local steps_per_epoch = train.n // args.batch -- the tail of each shuffled epoch is dropped
if steps_per_epoch < 1 then fail(("--batch %d is larger than the %d training images"):format(args.batch, train.n)) end
local total_steps = args.epochs * steps_per_epoch
local trainable = {}
for _, p in ipairs(model:parameters()) do if p.requires_grad then trainable[#trainable + 1] = p end end
local opt = flow.optim.SGD(trainable, { lr = args.lr, momentum = args.momentum, nesterov = true,
                                                 weight_decay = args.weight_decay })
local lr_at = flow.optim.cosine_schedule({ lr = args.lr, min_lr = args.min_lr, steps = total_steps,
                                           warmup = math.min(args.warmup, total_steps) })

-- Epoch e's order of the training images: a shuffle fixed by (seed, e), so a run resumed
-- mid-epoch sees the same batches as one that was not stopped.
local function epoch_order(e)
  local order = {}
  for i = 1, train.n do order[i] = i - 1 end
  local rng = (args.seed * 1000003 + e) % 2147483647
  for i = train.n, 2, -1 do
    rng = rng * 48271 % 2147483647 -- Park and Miller's minimal standard generator
    local j = rng % i + 1
    order[i], order[j] = order[j], order[i]
  end
  return order
end

-------------------------------------------------------------------------------- checkpoints

-- One flat table: "model.<name>" (parameters and running statistics), "optim.<key>", and
-- metadata. Global tensors are gathered to every rank (collective, in one order on all ranks)
-- and rank 0 writes, so a run saved at --dp 2 resumes at 1 rank and the reverse.
local function save_checkpoint(path, next_step)
  local ck = { step = next_step, width = args.width, batch = args.batch, train_n = train.n }
  for k, v in pairs(model:state_dict()) do ck["model." .. k] = v end
  for k, v in pairs(opt:state_dict()) do ck["optim." .. k] = v end
  if parallel then
    local keys = {}
    for k, v in pairs(ck) do if flow.is_tensor(v) and v.is_global then keys[#keys + 1] = k end end
    table.sort(keys)
    for _, k in ipairs(keys) do ck[k] = ck[k]:to_global(place, B):to_local() end
  end
  if flow.rank() == 0 then flow.save(ck, path) end
end

local function load_checkpoint(path)
  local ck = flow.load(path)
  -- the step counts batches of one size over one training set: both must match to resume
  for _, k in ipairs({ "width", "batch", "train_n" }) do
    local want = k == "train_n" and train.n or args[k]
    if ck[k] ~= want then fail(("--resume %s: the checkpoint has %s %s, this run %s"):format(path, k, tostring(ck[k]), want)) end
  end
  local msd, osd = {}, {}
  for k, v in pairs(ck) do
    local mk, ok_ = k:match("^model%.(.+)$"), k:match("^optim%.(.+)$")
    if mk then msd[mk] = v elseif ok_ then osd[ok_] = v end
  end
  model:load_state_dict(msd)
  opt:load_state_dict(osd)
  return math.tointeger(ck.step)
end

local start = 0
if args.resume ~= "" then
  local ok_ck, step = pcall(load_checkpoint, args.resume)
  if not ok_ck then fail(step) end
  if step >= total_steps then
    fail(("--resume %s: the checkpoint is at step %d, not below this run's %d steps (raise --epochs)"):format(
      args.resume, step, total_steps))
  end
  start = step
  print(("resumed from %s at step %d"):format(args.resume, start))
end

print(("model: ResNet (3 basic blocks, width %d), %d parameters on %s%s"):format(args.width, n_params,
  parallel and tostring(place) or "cpu", args.amp == "bf16" and " (bf16 autocast)" or ""))
print(("data: %s: %d train / %d test images, batch %d, %d steps/epoch"):format(args.data, train.n, test.n,
  args.batch, steps_per_epoch))

-------------------------------------------------------------------------------- training

local t_begin = utils.now()
local t_last, steps_since = t_begin, 0
local first_loss, last_loss, acc
local order, order_epoch
for step = start, total_steps - 1 do
  local epoch = step // steps_per_epoch
  if order_epoch ~= epoch then order, order_epoch = epoch_order(epoch), epoch end
  local lr = lr_at(step)
  opt:set_lr(lr)
  local x, y = batch(train, (step % steps_per_epoch) * args.batch, args.batch, order)
  local loss = amp(function()
    local l = nn.functional.cross_entropy(model(x), y)
    l:backward()
    return l
  end)
  opt:step()
  opt:zero_grad()
  local l = loss:item()
  -- free this step's tensors now, so the next step reuses their memory (Lua's GC does not see
  -- tensor sizes and would let dead activations pile up)
  collectgarbage()
  first_loss, last_loss = first_loss or l, l
  steps_since = steps_since + 1
  local done = step + 1
  if done % args.log_every == 0 or done == total_steps or step == start then
    local now = utils.now()
    local dt = (now - t_last) / steps_since
    print(("step %5d/%d | epoch %d | loss %.4f | lr %.3e | %6.0f img/s | ETA %s"):format(done, total_steps,
      epoch + 1, l, lr, args.batch / dt, utils.format_seconds(dt * (total_steps - done))))
    io.stdout:flush()
    t_last, steps_since = now, 0
  end
  if done % steps_per_epoch == 0 then
    acc = evaluate()
    print(("epoch %d/%d | test accuracy %.2f%% | %s elapsed"):format(done // steps_per_epoch, args.epochs, acc,
      utils.format_seconds(utils.now() - t_begin)))
    t_last, steps_since = utils.now(), 0 -- the evaluation's time is not a step's
  end
  if args.save ~= "" and (done % steps_per_epoch == 0 or done == total_steps) then
    save_checkpoint(args.save, done)
  end
end

if first_loss then
  print(("done: %d steps in %s, loss %.4f -> %.4f, test accuracy %.2f%%"):format(total_steps - start,
    utils.format_seconds(utils.now() - t_begin), first_loss, last_loss, acc or evaluate()))
end
