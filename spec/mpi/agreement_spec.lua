-- The default cross-rank agreement check (batched): ranks that ran different global ops are told
-- so, every one of them, before data moves between them or a value is read; nothing silently wrong.
local flow = require "flow"
local fails = require("support.global").fails
local S, B = flow.sbp.split, flow.sbp.broadcast
local ws, me = flow.world_size(), flow.rank()

local function all()
  local r = {}
  for i = 0, ws - 1 do r[#r + 1] = i end
  return flow.placement("cpu", r)
end

describe("the default agreement check #mpi", function()
  local P = all()
  local prev
  before_each(function() prev = flow.set_check_consistency(false) end)
  after_each(function() flow.set_check_consistency(prev) end)

  it("different ops on different ranks: an error on every rank when the value is read", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local x = flow.randn({ 4 }):to_global(P, B):to_global(P, S(0))
    local ok, err = pcall(function()
      local y = me == 0 and x + x or x * x -- runs on shards alone: nothing moves yet
      return y:sum():item()
    end)
    assert.is_false(ok)
    assert.matches(("%%[rank %d%%] ranks disagree on the global ops"):format(me), err)
    assert.matches("the last was sum", err)
  end)

  it("different shapes on different ranks: an error before the boxing moves data", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local x = flow.randn({ 4, 2 }):to_global(P, B):to_global(P, S(0))
    local ok, err = pcall(function()
      local y = me == 0 and x:reshape({ 8 }) or x:reshape({ 2, 4 })
      return y:to_global(P, B)
    end)
    assert.is_false(ok)
    assert.matches("ranks disagree on the global ops", err)
  end)

  it("different dtypes on different ranks: an error on every rank, not a wrong sum", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local x = flow.ones({ 2 * ws, 2 }):to_global(P, B):to_global(P, S(0))
    local err = fails(function()
      local y = me == 0 and x or x:double()
      return y:sum():item()
    end)
    assert.matches(("^%%[rank %d%%] ranks disagree on the global ops"):format(me), err)
  end)

  it("different target SBP on different ranks: an error before data moves", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local x = flow.ones({ 2 * ws, 2 * ws }):to_global(P, B):to_global(P, S(0))
    local err = fails(function() return x:to_global(P, me == 0 and B or S(1)) end)
    assert.matches(("^%%[rank %d%%] ranks disagree on the global ops .* the last was to_global"):format(me), err)
  end)

  it("a rank that skips a collective: the next handshake meets the others' and all raise", function()
    if ws < 2 then return pending("needs 2 ranks or more") end
    local x = flow.ones({ 2 * ws }):to_global(P, B):to_global(P, S(0))
    local err = fails(function()
      if me ~= 1 then x:to_global(P, B) end -- rank 1 skips the all-gather
      return flow.barrier()
    end)
    if me == 1 then
      assert.matches("^%[rank 1%] barrier: another rank is at a global op's handshake here", err)
    else
      assert.matches(("^%%[rank %d%%] ranks disagree on the global ops .* the last was to_global"):format(me), err)
    end
  end)

  it("after a disagreement the ranks go on together", function()
    local x = flow.ones({ 2 * ws }):to_global(P, B):to_global(P, S(0))
    assert.equal(4 * ws, (x + x):sum():item())
  end)
end)
