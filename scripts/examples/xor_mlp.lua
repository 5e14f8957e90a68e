-- A two-layer MLP learns XOR: flow.nn modules, cross-entropy, AdamW, and a checkpoint round trip.
--   flowlua scripts/examples/xor_mlp.lua
local flow = require "flow"
local nn, F = flow.nn, flow.nn.functional

flow.manual_seed(0)
local model = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
local opt = flow.optim.AdamW(model:parameters(), { lr = 0.05, weight_decay = 0 })

local x = flow.tensor({ { 0, 0 }, { 0, 1 }, { 1, 0 }, { 1, 1 } }, { dtype = "float32" })
local y = flow.tensor({ 0, 1, 1, 0 }, { dtype = "int64" })

for step = 1, 200 do
  local loss = F.cross_entropy(model(x), y)
  loss:backward()
  opt:step()
  opt:zero_grad()
  if step % 50 == 0 then print(("step %3d  loss %.4f"):format(step, loss:item())) end
end

local path = os.tmpname()
flow.save(model:state_dict(), path)
local copy = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
copy:load_state_dict(flow.load(path))
os.remove(path)

local _, pred = flow.max(copy(x), 1)
print("predictions after reloading:", table.concat(pred:totable(), " "), "(want 0 1 1 0)")
