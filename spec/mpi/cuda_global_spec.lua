-- Global tensors on CUDA placements under mpirun (-np 1, 2, 4): boxing in device memory over NCCL
-- when every rank has a GPU of its own, through the host over MPI when ranks share a GPU
-- (flow.cuda.nccl_usable() says which). Every result must equal the same conversion or op on the
-- CPU placement. Without a GPU each spec is pending with the reason.
local flow = require "flow"
local GL = require "support.global"
local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
local ws, me = flow.world_size(), flow.rank()

local gpu = flow.cuda.is_available()
local reason = gpu and "" or ("no GPU: " .. tostring(flow.cuda.unavailable_reason()))
local function git(name, fn)
  if gpu then it(name, fn) else it(name, function() pending(reason) end) end
end

local ranks = GL.all_ranks()
local PC = flow.placement("cuda", ranks)
local global, whole, full_of = GL.global, GL.whole, GL.full_of
local function host(t) return t:to_local():cpu() end

describe("boxing on CUDA placements", function()
  git("NCCL is used exactly when every rank has a GPU of its own", function()
    local ok, why = flow.cuda.nccl_usable()
    local x = global(full_of({ 4, 4 }):cuda(), PC, S(0))
    local s = flow.explain(x, PC, B)
    if ws == 1 then return end
    if ok then
      assert.matches("over NCCL", s)
    else
      assert.is_string(why)
      assert.matches("through the host", s)
    end
  end)

  local sbps = { S(0), S(1), B, PS }
  for _, shape in ipairs({ { 5, 7 }, { 8, 4 } }) do
    for _, from in ipairs(sbps) do
      for _, to in ipairs(sbps) do
        git(("%s -> %s on {%d,%d}"):format(tostring(from), tostring(to), shape[1], shape[2]), function()
          local full = full_of(shape)
          local y = global(full:cuda(), PC, from):to_global(PC, to)
          assert.equal(tostring(to), tostring(y.sbp))
          assert.matches("^cuda", y.device)
          assert.same(full:totable(), whole(y):cpu():totable())
        end)
      end
    end
  end

  git("S(2) -> S(0) and packed all-to-all on a 3-d tensor", function()
    local full = full_of({ 6, 3, 5 })
    local y = global(full:cuda(), PC, S(2)):to_global(PC, S(0))
    assert.same(full:totable(), whole(y):cpu():totable())
  end)

  git("bfloat16 shards box like float32 ones", function()
    local full = full_of({ 6, 4 })
    local y = global(full:to("bfloat16"):cuda(), PC, S(0)):to_global(PC, S(1))
    assert.same(full:totable(), whole(y):cpu():float():totable())
  end)

  git("a local cuda tensor becomes the shard, broadcast takes rank 0's copy", function()
    local mine = flow.full({ 2, 3 }, me + 1):cuda()
    local g = mine:to_global(PC, B)
    assert.same(flow.full({ 2, 3 }, 1):totable(), host(g):totable())
    local s = flow.full({ 2, 3 }, me):cuda():to_global(PC, S(0))
    assert.same({ 2 * ws, 3 }, s:shape())
  end)

  if ws == 4 then
    git("2-D mesh: (S(0), S(1)) -> (S(1), B) and (P, P) -> (B, B)", function()
      local P2 = flow.placement("cuda", { { 0, 1 }, { 2, 3 } })
      local full = full_of({ 6, 10 })
      local y = global(full:cuda(), P2, { S(0), S(1) }):to_global(P2, { S(1), B })
      assert.same(full:totable(), whole(y):cpu():totable())
      local p = global(full:cuda(), P2, { PS, PS }):to_global(P2, { B, B })
      assert.same(full:totable(), host(p):totable())
    end)
  end

  if ws >= 2 then
    git("between placements: cuda{0} -> every rank, split", function()
      local P0 = flow.placement("cuda", { 0 })
      local full = full_of({ 7, 3 })
      local x = global(full:cuda(), PC, B):to_global(P0, B)
      local y = x:to_global(PC, S(0))
      assert.same(full:totable(), whole(y):cpu():totable())
      local back = y:to_global(P0, B)
      if me == 0 then assert.same(full:totable(), host(back):totable()) end
    end)
  end
end)

describe("global ops on CUDA placements", function()
  git("data-parallel linear layer: outputs and the all-reduced gradient match the CPU", function()
    local PH = flow.placement("cpu", ranks)
    local xs = flow.randn({ 8, 5 }, { seed = 3 })
    local ws_ = flow.randn({ 5, 4 }, { seed = 4 })
    local function step(place, dev)
      local x = global(dev(xs), place, S(0))
      local w = global(dev(ws_), place, B):requires_grad_()
      local loss = flow.matmul(x, w):tanh():sum()
      loss:backward()
      return host(loss:to_global(place, B)), host(w.grad:to_global(place, B))
    end
    local lc, gc = step(PH, function(t) return t end)
    local lg, gg = step(PC, function(t) return t:cuda() end)
    assert.is_true(math.abs(lc:item() - lg:item()) < 1e-4)
    local a, b = gc:totable(), gg:totable()
    for i = 1, #a do
      for j = 1, #a[i] do assert.is_true(math.abs(a[i][j] - b[i][j]) < 1e-4) end
    end
  end)

  git("tensor-parallel matmul: S(1) x S(0) gives P, boxed to B", function()
    local a, w = full_of({ 3, 8 }), full_of({ 8, 2 })
    local h = flow.matmul(global(a:cuda(), PC, S(1)), global(w:cuda(), PC, S(0)))
    if ws > 1 then assert.equal(tostring(PS), tostring(h.sbp)) end
    assert.same(flow.matmul(a, w):totable(), host(h:to_global(PC, B)):totable())
  end)
end)
