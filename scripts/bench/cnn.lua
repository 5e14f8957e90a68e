-- One training step of train_cnn.lua's ResNet (forward + backward + SGD with Nesterov momentum) in
-- images/s, against PyTorch on the same model, batch and optimizer in the same command:
--   FLOW_NUM_THREADS=1 flowlua scripts/bench/cnn.lua [--batch 128 --width 16 --steps 10 --amp bf16
--                                                     --torch off]
-- Random 28x28 one-channel images and labels; the first steps are warm-up and not timed. PyTorch
-- runs twice: as configured, and with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that one
-- command (its OpenBLAS then picks its own kernel); the faster is the anchor.
local flow = require "flow"
local utils = require "flow.utils"
local resnet = require "flow.resnet"
package.path = (arg[0]:match("^(.*)/[^/]*$") or ".") .. "/?.lua;" .. package.path
local step_timer = require "step_timer"

local args = utils.parse_args(arg, { batch = 128, width = 16, steps = 10, warmup = 2, amp = "off", torch = "on" })
if args.amp ~= "off" and args.amp ~= "bf16" then error(("--amp %s: expected off or bf16"):format(args.amp), 0) end
flow.manual_seed(0)
local model = resnet.ResNet(args.width)
local opt = flow.optim.SGD(model:parameters(), { lr = 0.01, momentum = 0.9, nesterov = true, weight_decay = 5e-4 })
local x = flow.randn({ args.batch, 1, 28, 28 })
local y = flow.randint(0, 10, { args.batch })

local step = step_timer.train_step(function() return flow.nn.functional.cross_entropy(model(x), y) end, opt,
  args.amp)

local times = step_timer.times(step, args.warmup, args.steps)
local median = step_timer.median(times)
local threads = flow._bench.onednn().threads
print(("cnn_step: ResNet width %d, batch %d, %s, %d thread(s)"):format(args.width, args.batch,
  args.amp == "bf16" and "bf16 autocast" or "float32", threads))
print(("ms/step: median %.1f  min %.1f  (%d steps) = %.0f images/s"):format(median, times[1], #times,
  args.batch / median * 1000))

if args.torch == "off" then return end -- our own figures only (comparing two builds)

-- The reference: the same model in PyTorch (Debian's python3-torch), same thread count, twice.
local configured, unset = step_timer.torch_ms("cnn_torch.py", ("%d %d %d %s"):format(args.batch, args.width,
  args.steps, args.amp), threads)
if configured or unset then
  local best = math.min(configured or math.huge, unset or math.huge)
  local function ips(ms) return ms and ("%.0f"):format(args.batch / ms * 1000) or "-" end
  print(("PyTorch same model%s: %s images/s as configured, %s with OPENBLAS_CORETYPE/L2_SIZE unset"):format(
    args.amp == "bf16" and " (bf16 autocast)" or "", ips(configured), ips(unset)))
  print(("-> flowlua images/s %.2fx PyTorch's faster"):format(best / median))
else
  print("PyTorch reference: not run (/usr/bin/python3 with torch not found)")
end
