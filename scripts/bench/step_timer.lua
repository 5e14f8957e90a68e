-- What the training-step benchmarks (gpt_step.lua, gpt_ab.lua, cnn.lua) share: the benchmark GPT,
-- timing a step after warm-up, and running their PyTorch reference twice in the same command, as
-- configured and with
-- OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset for that command (its OpenBLAS then picks its own
-- kernel), so the ratio is against the faster.
local flow = require "flow"
local utils = require "flow.utils"

local step_timer = {}

-- The benchmark GPT's options with their defaults (L4 D256 H8 T128 B8, byte vocabulary), and a
-- script's own: the table utils.parse_args takes.
function step_timer.gpt_options(own)
  local t = { layers = 4, dim = 256, heads = 8, seq = 128, batch = 8, vocab = 256 }
  for k, v in pairs(own) do t[k] = v end
  return t
end

-- The model (seed 0), its AdamW and a loss function on one fixed random batch, from parsed options.
function step_timer.gpt(args)
  local gpt = require "flow.gpt"
  flow.manual_seed(0)
  local model = gpt.GPT({ vocab_size = args.vocab, block_size = args.seq, n_layer = args.layers,
                          n_head = args.heads, n_embd = args.dim })
  local opt = model:configure_optimizer({ lr = 1e-4, weight_decay = 0.1 })
  local x = flow.randint(0, args.vocab, { args.batch, args.seq })
  local y = flow.randint(0, args.vocab, { args.batch, args.seq })
  return model, opt, function()
    local _, l = model(x, y)
    return l
  end
end

-- One training step: loss_fn() and its backward under bf16 autocast when amp is "bf16", then the
-- optimizer (outside autocast, in float32); returns the loss as a number.
function step_timer.train_step(loss_fn, opt, amp)
  local function forward_backward()
    local l = loss_fn()
    l:backward()
    return l
  end
  return function()
    local loss = amp == "bf16" and flow.autocast("bfloat16", forward_backward) or forward_backward()
    opt:step()
    opt:zero_grad()
    local l = loss:item()
    collectgarbage() -- free the step's tensors now, as the training scripts do
    return l
  end
end

-- ms of each of `steps` calls of step() after `warmup` untimed ones, sorted, and the process's CPU
-- ms per step (all threads: above the wall time means threads, below it load from others).
function step_timer.times(step, warmup, steps)
  for _ = 1, warmup do step() end
  local times = {}
  local cpu0 = os.clock()
  for i = 1, steps do
    local t0 = utils.now()
    step()
    times[i] = (utils.now() - t0) * 1000
  end
  local cpu_ms = (os.clock() - cpu0) * 1000 / steps
  table.sort(times)
  return times, cpu_ms
end

function step_timer.median(times) return times[(#times + 1) // 2] end

-- PyTorch's median ms per step from `script` (next to the running benchmark, printing
-- `torch_ms <median> <min>`) with `args` and `threads` OpenMP threads: as configured and with the
-- OPENBLAS_* variables unset; nil where it did not run.
function step_timer.torch_ms(script, args, threads)
  local path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/" .. script
  local function run(prefix)
    local p = io.popen(("%sOMP_NUM_THREADS=%d /usr/bin/python3 %s %s 2>/dev/null"):format(prefix, threads, path, args))
    local out = p and p:read("a") or ""
    if p then p:close() end
    return tonumber(out:match("torch_ms ([%d.]+)"))
  end
  return run(""), run("env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ")
end

return step_timer
