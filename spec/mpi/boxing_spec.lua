-- Boxing under mpirun (-np 2 and 4; also valid on 1 rank): every SBP conversion on 1-D and 2-D
-- meshes gives back the same logical tensor, shards hold the slices DESIGN.md section 4 names.
local flow = require "flow"
local GL = require "support.global"
local S, B, PS = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
local ws, me = flow.world_size(), flow.rank()
flow.set_check_consistency(true)

local all_ranks, full_of = GL.all_ranks, GL.full_of
local P = flow.placement("cpu", all_ranks())

local global, whole = GL.global, GL.whole
-- first n % p parts get one more
local function range(n, p, i)
  local base, extra = n // p, n % p
  local len = base + (i < extra and 1 or 0)
  return i * base + math.min(i, extra), len
end

describe("ranks", function()
  it("rank is in [0, world_size) and barrier returns", function()
    assert.is_true(me >= 0 and me < ws)
    flow.barrier()
  end)
end)

describe("1-D boxing", function()
  local sbps = { S(0), S(1), B, PS }
  for _, shape in ipairs({ { 5, 7 }, { 8, 4 }, { 3, 2 } }) do
    for _, from in ipairs(sbps) do
      for _, to in ipairs(sbps) do
        it(("%s -> %s on {%d,%d}"):format(tostring(from), tostring(to), shape[1], shape[2]), function()
          local full = full_of(shape)
          local x = global(full, P, from)
          local y = x:to_global(P, to)
          assert.equal(tostring(to), tostring(y.sbp))
          assert.same(shape, y:shape())
          assert.same(full:totable(), whole(y):totable())
        end)
      end
    end
  end

  it("S(2) -> S(0) on a 3-d tensor keeps every value", function()
    local full = full_of({ 6, 3, 5 })
    local y = global(full, P, S(2)):to_global(P, S(0))
    assert.same(full:totable(), whole(y):totable())
  end)

  it("shards follow the uneven split rule", function()
    local full = full_of({ 5, 2 })
    local local_ = global(full, P, S(0)):to_local()
    local start, len = range(5, ws, me)
    assert.same({ len, 2 }, local_:shape())
    if len > 0 then assert.same(full:narrow(0, start, len):totable(), local_:totable()) end
  end)

  it("partial_sum shards sum to the logical value", function()
    local full = full_of({ 3, 4 })
    local mine = global(full, P, PS):to_local()
    local total = flow.tensor(mine:totable()):to_global(P, PS):to_global(P, B):to_local()
    assert.same(full:totable(), total:totable())
  end)

  it("a local tensor becomes this rank's shard: the logical shape sums the shards", function()
    local mine = flow.full({ me + 1, 3 }, me)
    if ws > 1 then
      assert.has_error(function() mine:to_global(P, S(0)) end)
    end
    local rows = math.max(1, 2)
    local g = flow.full({ rows, 3 }, me):to_global(P, S(0))
    assert.same({ rows * ws, 3 }, g:shape())
    local w = whole(g):totable()
    for r = 0, ws - 1 do assert.equal(r, w[r * rows + 1][1]) end
  end)

  it("ranks disagreeing on a broadcast local tensor's shape get an error everywhere", function()
    if ws == 1 then return end
    local ok, err = pcall(function() return flow.zeros({ me + 1 }):to_global(P, B) end)
    assert.is_false(ok)
    assert.matches("to_global: the local shards do not form one tensor", err)
  end)

  it("a local tensor on a placement that leaves ranks out: the outsiders get an empty shard", function()
    local P0 = flow.placement("cpu", { 0 })
    local full = full_of({ 3, 4 })
    local g = (me == 0 and full or flow.zeros({ 1 }, { dtype = "int64" })):to_global(P0, B)
    assert.same({ 3, 4 }, g:shape())
    assert.equal("float32", g.dtype) -- the members' dtype
    assert.same(me == 0 and { 3, 4 } or { 0, 0 }, g:to_local():shape())
    assert.same(full:totable(), whole(g:to_global(P, B)):totable())
    if ws >= 2 then -- a split over ranks {ws-1, 0}: each gives its rows, the others nothing
      local P2 = flow.placement("cpu", { ws - 1, 0 })
      local mine = me == ws - 1 and full:narrow(0, 0, 2) or me == 0 and full:narrow(0, 2, 1) or flow.zeros({ 7 })
      local y = mine:to_global(P2, S(0))
      assert.same({ 3, 4 }, y:shape())
      assert.same(full:totable(), whole(y:to_global(P, B)):totable())
    end
  end)

  it("members that disagree make every rank raise, outsiders included (no hang)", function()
    if ws < 2 then return end
    local P1 = flow.placement("cpu", { 1 % ws, 0 })
    local ok, err = pcall(function() return flow.ones({ 2, me + 1 }):to_global(P1, S(0)) end)
    assert.is_false(ok)
    if ws > 2 and me >= 2 then
      assert.matches("placement's ranks found their local shards inconsistent", err)
    else
      assert.matches("the local shards do not form one tensor", err)
    end
  end)

  it("broadcast from local takes rank 0's copy", function()
    local g = flow.full({ 2 }, me + 10):to_global(P, B)
    assert.same({ 10, 10 }, g:to_local():totable())
  end)

  it("explain names the collective and the bytes", function()
    local x = global(full_of({ 8, 4 }), P, S(0))
    local s = flow.explain(x, P, B)
    if ws > 1 then
      assert.matches("all%-gather", s)
      assert.matches(("%d bytes"):format((ws - 1) * 8 * 4 * 4), s, 1, true)
    else
      assert.matches("no data moves", s)
    end
    assert.matches("all%-reduce", flow.explain(global(full_of({ 2 }), P, PS), P, B) .. (ws == 1 and "all-reduce" or ""))
  end)
end)

-- Over NCCL, which has no strided transfers, the all-to-all packs its strided blocks into dense
-- buffers (2-D copies), sends them by alltoallv and unpacks them. flow._pack_blocks makes the MPI
-- path do the same, so the packing is checked here on machines without a GPU.
describe("all-to-all with packed blocks (the NCCL path)", function()
  local cases = { { { 5, 7 }, 0, 1 }, { { 7, 5 }, 1, 0 }, { { 6, 3, 5 }, 2, 0 }, { { 3, 4, 5 }, 0, 2 },
                  { { 4, 6, 2 }, 1, 2 }, { { 2, 1 }, 0, 1 } }
  for _, c in ipairs(cases) do
    local shape, a, b = c[1], c[2], c[3]
    it(("S(%d) -> S(%d) on %s"):format(a, b, table.concat(shape, "x")), function()
      local full = full_of(shape)
      local x = global(full, P, S(a))
      local prev = flow._pack_blocks(true)
      local ok, y = pcall(x.to_global, x, P, S(b))
      flow._pack_blocks(prev)
      assert.is_true(ok, tostring(y))
      assert.same(full:totable(), whole(y):totable())
      local lo, len = range(shape[b + 1], ws, me)
      assert.same(full:narrow(b, lo, len):totable(), y:to_local():totable())
    end)
  end
  if ws == 4 then
    it("(S(0), S(1)) -> (S(1), S(0)) on a 2-D mesh", function()
      local P2 = flow.placement("cpu", { { 0, 1 }, { 2, 3 } })
      local full = full_of({ 6, 10 })
      local prev = flow._pack_blocks(true)
      local ok, y = pcall(function() return global(full, P2, { S(0), S(1) }):to_global(P2, { S(1), S(0) }) end)
      flow._pack_blocks(prev)
      assert.is_true(ok, tostring(y))
      assert.same(full:totable(), whole(y):totable())
    end)
  end
end)

describe("global creation", function()
  -- a list, not a table iterated with pairs: every rank must define the tests in the same order
  local makers = {
    { "randn", function(o) return flow.randn({ 5, 4 }, o) end },
    { "rand", function(o) return flow.rand({ 5, 4 }, o) end },
    { "randint", function(o) return flow.randint(0, 9, { 5, 4 }, o) end },
    { "arange", function(o) return flow.arange(2, 12, 2, o) end },
    { "linspace", function(o) return flow.linspace(0, 1, 7, o) end },
    { "eye", function(o) return flow.eye(5, 4, o) end },
    { "full", function(o) return flow.full({ 5, 4 }, 2.5, o) end },
  }
  for _, m in ipairs(makers) do
    local name, make = m[1], m[2]
    it(name .. " draws each shard's slice of the local tensor", function()
      flow.manual_seed(11)
      local expect = make({})
      for _, sbp in ipairs({ S(0), B, PS }) do
        flow.manual_seed(11)
        local g = make({ placement = P, sbp = sbp })
        assert.same(expect:shape(), g:shape())
        assert.same(expect:totable(), whole(g):totable())
      end
    end)
  end
end)

describe("2-D boxing", function()
  if ws ~= 4 then return end
  local P2 = flow.placement("cpu", { { 0, 1 }, { 2, 3 } })
  local values = { S(0), S(1), B, PS }
  local list = {}
  for _, a in ipairs(values) do for _, b in ipairs(values) do list[#list + 1] = { a, b } end end
  local picks = { { B, S(0) }, { S(0), S(0) }, { S(0), S(1) }, { PS, S(1) }, { S(1), PS }, { B, B }, { PS, PS }, { S(1), S(0) } }
  for _, from in ipairs(picks) do
    for _, to in ipairs(list) do
      it(("(%s, %s) -> (%s, %s)"):format(tostring(from[1]), tostring(from[2]), tostring(to[1]), tostring(to[2])), function()
        local full = full_of({ 5, 6 })
        local y = global(full, P2, from):to_global(P2, to)
        assert.same(full:totable(), whole(y):totable())
      end)
    end
  end

  it("(B, S(0)) holds rows split within each mesh row", function()
    local full = full_of({ 4, 2 })
    local mine = global(full, P2, { B, S(0) }):to_local()
    local col = me % 2
    assert.same(full:narrow(0, col * 2, 2):totable(), mine:totable())
  end)

  it("equal splits on both axes act as one split over the whole mesh", function()
    local full = full_of({ 8, 4 })
    local x = global(full, P2, { S(0), S(0) })
    local s = flow.explain(x, P2, { S(1), S(1) })
    assert.matches("whole mesh: S%(0%) %-> S%(1%) by all%-to%-all", s)
    assert.same(full:totable(), whole(x:to_global(P2, { S(1), S(1) })):totable())
    assert.matches("whole mesh: P %-> B by all%-reduce", flow.explain(global(full, P2, { PS, PS }), P2, { B, B }))
  end)

  it("one mesh axis changes inside its sub-communicator", function()
    local x = global(full_of({ 8, 4 }), P2, { S(0), S(1) })
    local s = flow.explain(x, P2, { S(0), B })
    assert.matches("mesh axis 1: S%(1%) %-> B by all%-gather", s)
    assert.not_matches("mesh axis 0", s)
  end)
end)

describe("boxing between placements", function()
  if ws < 2 then return end
  local half = {}
  for i = 0, ws // 2 - 1 do half[#half + 1] = i end
  local rest = {}
  for i = ws // 2, ws - 1 do rest[#rest + 1] = i end
  local shifted = {}
  for i = 1, ws - 1 do shifted[#shifted + 1] = i end
  shifted[#shifted + 1] = 0
  local places = { flow.placement("cpu", half), flow.placement("cpu", rest), flow.placement("cpu", shifted) }
  -- disjoint, then overlapping, then a permutation of the same ranks
  for _, pair in ipairs({ { 1, 2 }, { 2, 3 }, { 3, 1 } }) do
    local pa, pb = places[pair[1]], places[pair[2]]
    for _, from in ipairs({ S(0), S(1), B, PS }) do
      for _, to in ipairs({ S(0), S(1), B, PS }) do
        it(("%s %s -> %s %s"):format(tostring(pa), tostring(from), tostring(pb), tostring(to)), function()
          local full = full_of({ 5, 3 })
          local y = global(full, P, B):to_global(pa, from):to_global(pb, to)
          assert.equal(pb, y.placement)
          assert.same(full:totable(), whole(y:to_global(P, B)):totable())
        end)
      end
    end
  end
  it("explain names the send/recv transfer", function()
    local x = global(full_of({ 2 }), P, B):to_global(places[1], B)
    assert.matches("between placements.*send/recv", flow.explain(x, places[2], S(0)))
  end)
end)

describe("boxing between a 2-D mesh and 1-D placements", function()
  if ws ~= 4 then return end
  local P2 = flow.placement("cpu", { { 0, 1 }, { 2, 3 } })
  local A, Z = flow.placement("cpu", { 0, 1 }), flow.placement("cpu", { 3, 2 })
  local cases = {
    { P2, { S(0), S(1) }, Z, S(1) }, { P2, { PS, S(0) }, A, B }, { A, PS, P2, { B, S(0) } },
    { Z, S(0), P2, { S(1), PS } }, { P2, { B, PS }, Z, S(0) },
  }
  for k, c in ipairs(cases) do
    it(("case %d"):format(k), function()
      local full = full_of({ 5, 6 })
      local y = global(full, P, B):to_global(c[1], c[2]):to_global(c[3], c[4])
      assert.same(full:totable(), whole(y:to_global(P, B)):totable())
    end)
  end
end)
