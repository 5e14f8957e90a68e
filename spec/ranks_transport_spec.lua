-- The transport of `flowlua --ranks N` (core/comm_local.c over core/comm_ring.c): messages travel
-- through a 1 MB ring in shared memory per ordered pair of ranks. Larger messages stream through
-- in chunks (into a message buffer, or straight into a receive that waits for them), many small
-- ones wrap the ring, the graph runtime's two comm channels share it, and a peer killed in the
-- middle of a transfer ends the job with an error instead of a hang.
local flow = require "flow"

local function needs_bin()
  if not os.getenv("FLOW_BIN") then pending("FLOW_BIN is not set (scripts/test.sh exports the flowlua path)") end
  return os.getenv("FLOW_BIN") ~= nil
end

describe("--ranks shared-memory transport", function()
  it("tensors of several MB (messages larger than a ring) arrive whole through all-gather, all-reduce and all-to-all",
    function()
      if not needs_bin() then return end
      for _, n in ipairs({ 2, 3 }) do
        flow.run_ranks(n, function()
          local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
          local ws, r = flow.world_size(), {}
          for i = 0, ws - 1 do r[#r + 1] = i end
          local P = flow.placement("cpu", r)
          -- odd sizes: chunks end mid-element and mid-header; 6 MB: every message crosses the ring
          for _, shape in ipairs({ { 6, 1 }, { 6, 4097 }, { 6 * 1021, 257 } }) do
            local x = flow.arange(shape[1] * shape[2], { dtype = flow.float32 }):reshape(shape)
            local g = x:to_global(P, B)
            local cases = {
              { "S(0)->B", g:to_global(P, S(0)):to_global(P, B) },
              { "P->B", g:to_global(P, PS):to_global(P, B) },
              { "S(0)->S(1)->B", g:to_global(P, S(0)):to_global(P, S(1)):to_global(P, B) },
            }
            for _, c in ipairs(cases) do
              local diff = (c[2]:to_local() - x):abs():max():item()
              if diff ~= 0 then
                error(("[rank %d] %s of %dx%d on %d ranks: off by %g"):format(flow.rank(), c[1], shape[1], shape[2], ws, diff))
              end
            end
          end
        end)
      end
    end)

  it("a 12 MB transfer between placements arrives whole, however the receiver and the sender meet", function()
    if not needs_bin() then return end
    flow.run_ranks(2, function()
      local B = flow.sbp.broadcast
      local P0, P1 = flow.placement("cpu", { 0 }), flow.placement("cpu", { 1 })
      local x = flow.arange(3 * 1024 * 1024, { dtype = flow.float32 })
      for i = 1, 6 do
        -- the sender late, then early
        if flow.rank() == (i <= 3 and 0 or 1) then os.execute("sleep 0.05") end
        local y = x:to_global(P0, B):to_global(P1, B)
        if flow.rank() == 1 then
          local diff = (y:to_local() - x):abs():max():item()
          if diff ~= 0 then error(("[rank 1] transfer %d: off by %g"):format(i, diff)) end
        end
      end
    end)
  end)

  it("thousands of small messages arrive in order, wrapping the ring many times", function()
    if not needs_bin() then return end
    flow.run_ranks(3, function()
      local B, PS = flow.sbp.broadcast, flow.sbp.partial_sum
      local P = flow.placement("cpu", { 0, 1, 2 })
      for i = 1, 1500 do
        -- each rank adds its own value: the sum tells a lost, repeated or reordered message
        local v = flow.full({ 3 }, (flow.rank() + 1) * i, { dtype = flow.float32 })
        local s = v:to_global(P, PS):to_global(P, B):to_local()
        local got = s:sum():item()
        if got ~= 18 * i then error(("[rank %d] all-reduce %d: sums to %g, want %g"):format(flow.rank(), i, got, 18 * i)) end
        if i % 100 == 0 then flow.barrier() end
      end
    end)
  end)

  it("a graph's forward and backward collectives (two comm channels) move messages larger than a ring at once",
    function()
      if not needs_bin() then return end
      flow.run_ranks(2, function()
        local nn, S, B = flow.nn, flow.sbp.split, flow.sbp.broadcast
        local C, H, ROWS, STEPS = 1100, 32, 1024, 2
        -- two tensor-parallel blocks: each forward ends in an all-reduce of ROWS/4 x C floats (a
        -- micro-batch: 1.1 MB per rank and message), each backward starts with one
        local function model()
          flow.manual_seed(0)
          return nn.Sequential(nn.Linear(C, H), nn.ReLU(), nn.Linear(H, C), nn.Linear(C, H), nn.ReLU(), nn.Linear(H, C))
        end
        flow.manual_seed(1)
        local x, t = flow.randn({ ROWS, C }), flow.randn({ ROWS, C })
        local want = {}
        local m = model()
        local opt = flow.optim.SGD(m:parameters(), { lr = 0.1 })
        for step = 1, STEPS do
          local loss = nn.functional.mse_loss(m(x), t)
          loss:backward()
          opt:step()
          opt:zero_grad()
          want[step] = loss:item()
        end
        local P = flow.placement("cpu", { 0, 1 })
        local g = model():to_global(P, function(name)
          if name:match("^[03]%.") then return S(0) end      -- column-parallel: weight and bias split
          if name:match("^[25]%.weight") then return S(1) end -- row-parallel: partial sums out
          return B
        end)
        local gopt = flow.optim.SGD(g:parameters(), { lr = 0.1 })
        local G = nn.Graph { model = g, optimizer = gopt, config = { grad_accumulation_steps = 4 },
          build = function(self, a, b) local l = nn.functional.mse_loss(self.model(a), b); l:backward(); return l end }
        local gx, gt = x:to_global(P, B), t:to_global(P, B)
        for step = 1, STEPS do
          local got = G(gx, gt):item()
          if math.abs(got - want[step]) > 1e-4 * math.max(1, math.abs(want[step])) then
            error(("[rank %d] step %d: graph loss %.7g, eager %.7g"):format(flow.rank(), step, got, want[step]))
          end
        end
      end)
    end)

  it("a rank killed in the middle of large transfers ends the job with an error, not a hang", function()
    if not needs_bin() then return end
    local t0 = flow.now()
    local ok, err = pcall(flow.run_ranks, 2, function()
      local S, B = flow.sbp.split, flow.sbp.broadcast
      local P = flow.placement("cpu", { 0, 1 })
      local g = flow.ones({ 2048, 1024 }):to_global(P, S(0))
      if flow.rank() == 1 then
        local f = assert(io.open("/proc/self/stat"))
        local pid = f:read("a"):match("^(%d+)")
        f:close()
        os.execute(("(sleep 0.5; kill -9 %s) &"):format(pid))
      end
      local t = flow.now()
      while flow.now() - t < 60 do g:to_global(P, B):free() end
    end)
    assert.is_false(ok)
    assert.matches("rank 1 was killed by signal 9", err, 1, true)
    assert.is_true(flow.now() - t0 < 30, ("took %.1f s"):format(flow.now() - t0))
  end)
end)
