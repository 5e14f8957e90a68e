-- A failure on one rank is an error on every rank, never a hang: the handshake that precedes every
-- data movement carries a failing rank's message to the others, and gives up after FLOW_TIMEOUT
-- naming the ranks that did not arrive. After each case the ranks go on together.
local flow = require "flow"
local GL = require "support.global"
local S, B = flow.sbp.split, flow.sbp.broadcast
local ws, me = flow.world_size(), flow.rank()

local fails = GL.fails

describe("a failure on one rank #mpi", function()
  local P = flow.placement("cpu", GL.all_ranks())
  local x = flow.ones({ 2 * ws, 3 }):to_global(P, B):to_global(P, S(0))
  local prev, strict
  before_each(function()
    prev = flow._set_timeout(2)
    strict = flow.set_check_consistency(false) -- the default, batched check
  end)
  after_each(function()
    flow._set_timeout(prev)
    flow.set_check_consistency(strict)
    assert.equal(12 * ws, (x + x):sum():item()) -- the ranks go on together
  end)

  -- every rank boxes x, `rank` only after delay() returns, with FLOW_TIMEOUT 1 s: the error, seconds
  local function late(rank, delay)
    flow._set_timeout(1)
    return fails(function()
      if me == rank then delay() end
      return x:to_global(P, B)
    end)
  end
  -- rank 1 came late: the others gave up after FLOW_TIMEOUT naming it, and it heard of it
  local function rank1_was_late(err)
    if me == 1 then
      assert.matches("^%[rank 1%] to_global: rank %d+ gave up waiting", err)
    else
      assert.matches(("^%%[rank %d%%] to_global: .*waited %%d+ s %%(FLOW_TIMEOUT%%) for rank 1, which did not arrive")
        :format(me), err)
    end
  end
  local function busy(seconds)
    return function()
      local t0 = flow.now()
      while flow.now() - t0 < seconds do end
    end
  end

  it("inside a global op (bad input on one rank) reaches every rank with its message", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local err, took = fails(function()
      local ids = flow.tensor({ me == 1 and 99 or 0 }, { dtype = flow.int64 }):to_global(P, S(0))
      return flow.nn.functional.embedding(ids, x:to_global(P, B)):sum():item()
    end)
    if me == 1 then
      assert.matches("^%[rank 1%] embedding: index 99 out of range", err)
    else
      assert.matches(("^%%[rank %d%%] %%a+: rank 1 failed: embedding: index 99 out of range"):format(me), err)
    end
    assert.is_true(took < 1, "the others did not wait for a timeout")
  end)

  it("in Lua before a global op: its next handshake meets the others' and both raise", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local err = fails(function()
      if me == 1 then error("boom on rank 1") end
      return x:to_global(P, B)
    end)
    if me == 1 then
      assert.matches("boom on rank 1", err)
      err = fails(flow.barrier) -- rank 1's next handshake: the others are still in to_global's
      assert.matches("^%[rank 1%] barrier: another rank is at a global op's handshake", err)
    else
      assert.matches(("^%%[rank %d%%] ranks disagree on the global ops .* the last was to_global"):format(me), err)
    end
  end)

  it("a rank that does not arrive (busy in Lua): the others raise after FLOW_TIMEOUT naming it", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local err, took = late(1, busy(2.5))
    rank1_was_late(err)
    if me ~= 1 then
      if ws > 2 then assert.matches("rank %d is at to_global", err) end
      assert.is_true(took >= 0.5 and took < 2.5, "gave up after FLOW_TIMEOUT")
    end
  end)

  it("rank 0 late (it leads the handshakes): the others give up 2 s later and it hears of it", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local err = late(0, busy(4.5))
    if me == 0 then
      assert.matches("^%[rank 0%] to_global: rank %d+ gave up waiting for this rank, the handshake's leader", err)
    else
      assert.matches(("^%%[rank %d%%] to_global: waited %%d+ s %%(FLOW_TIMEOUT %%+ 2 s%%) for rank 0, which leads"):format(me), err)
    end
  end)

  -- every rank boxes x onto its own list of the ranks: the error on every rank, and the seconds
  local function onto(ranks)
    local Q = flow.placement("cpu", ranks)
    return fails(function() return x:to_global(Q, B):sum():item() end)
  end
  local function reversed(t)
    local r = {}
    for i = #t, 1, -1 do r[#r + 1] = t[i] end
    return r
  end

  it("ranks that list a placement in another order: an error on every rank, no data moved", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local ranks = reversed(GL.all_ranks())
    if me == ws - 1 then ranks[#ranks], ranks[#ranks - 1] = ranks[#ranks - 1], ranks[#ranks] end
    -- a global tensor moved there: the source placement's ranks find that they disagree
    local err, took = onto(ranks)
    assert.matches(("^%%[rank %d%%] ranks disagree on the global ops .* the last was to_global"):format(me), err)
    assert.is_true(took < 1, "no rank waited for a timeout")
    -- a local tensor made global there: the members of the placement's communicator disagree on it
    if ws == 2 then return end -- rank 1 names the world itself, which needs no new communicator
    err, took = fails(function() return flow.ones({ 2 * ws, 3 }):to_global(flow.placement("cpu", ranks), S(0)) end)
    assert.matches(("^%%[rank %d%%] to_global: communicator: the ranks name different groups %%(a placement "
      .. "listed in another order, or another placement%%): rank 0 has %%[3, 2, 1, 0%%], rank 3 has "
      .. "%%[3, 2, 0, 1%%]"):format(me), err)
    assert.is_true(took < 1, "no rank waited for a timeout")
  end)

  it("a different placement per rank: an error on every rank at once", function()
    if ws < 4 then return pending("needs 4 ranks") end
    local err, took = onto(me < 2 and { 0, 1 } or GL.all_ranks())
    assert.matches(("^%%[rank %d%%] ranks disagree on the global ops .* the last was "):format(me), err)
    assert.is_true(took < 1, "no rank waited for a timeout")
  end)

  it("a rank outside a placement that skips a local tensor's to_global there: an error on every rank", function()
    if ws < 4 then return pending("needs 4 ranks") end
    local err, took = fails(function()
      if me == 3 then return flow.barrier() end
      return flow.ones({ 2, 3 }):to_global(flow.placement("cpu", { 0, 1 }), S(0))
    end)
    if me == 3 then
      assert.matches("^%[rank 3%] barrier: another rank is at a global op's handshake here", err)
    else
      assert.matches(("^%%[rank %d%%] to_global: a rank is not at this to_global onto"):format(me), err)
    end
    assert.is_true(took < 1, "no rank waited for a timeout")
  end)

  it("a 2-D mesh listed in another order on one rank: an error on every rank at once", function()
    if ws ~= 4 then return pending("needs 4 ranks") end
    local Q = flow.placement("cpu", me == 2 and { { 0, 2 }, { 1, 3 } } or { { 0, 1 }, { 2, 3 } })
    local err, took = fails(function() return x:to_global(Q, { B, S(0) }):sum():item() end)
    assert.matches(("^%%[rank %d%%] "):format(me), err)
    assert.matches("disagree", err)
    assert.is_true(took < 1, "no rank waited for a timeout")
  end)

  it("a stopped rank (SIGSTOP): the others raise after FLOW_TIMEOUT; continued, it raises too", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local pids = flow._allgather_strings(assert(io.open("/proc/self/stat")):read("l"):match("^(%d+)"))
    local err = late(1, function() os.execute("kill -STOP " .. pids[2]) end)
    if me == 0 then os.execute("kill -CONT " .. pids[2]) end
    rank1_was_late(err)
  end)
end)
