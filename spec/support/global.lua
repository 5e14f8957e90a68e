-- Helpers for global-tensor specs: a global tensor made from a full local tensor (the same on
-- every rank), and a global tensor read back whole on every rank.
local flow = require "flow"

local B = flow.sbp.broadcast
local M = {}

-- broadcast on every mesh axis of the placement
local function all_broadcast(place)
  if #place.shape == 1 then return B end
  local bb = {}
  for i = 1, #place.shape do bb[i] = B end
  return bb
end

-- a local tensor given to to_global is this rank's shard: make the whole tensor global first
function M.global(full, place, sbp)
  return full:to_global(place, all_broadcast(place)):to_global(place, sbp)
end

-- the ranks 0 .. world_size - 1
function M.all_ranks()
  local r = {}
  for i = 0, flow.world_size() - 1 do r[#r + 1] = i end
  return r
end

-- 0, 1, 2, ... as a float32 tensor of this shape (every element tells where it came from)
function M.full_of(shape)
  local n = 1
  for _, s in ipairs(shape) do n = n * s end
  return flow.arange(0, n):float():view(shape)
end

function M.whole(g)
  return g:to_global(g.placement, all_broadcast(g.placement)):to_local()
end

-- f's error message on this rank (f must fail on every rank), and the seconds it took
function M.fails(f)
  local t0 = flow.now()
  local ok, err = pcall(f)
  assert(not ok, "expected an error on rank " .. flow.rank())
  return tostring(err), flow.now() - t0
end

return M
