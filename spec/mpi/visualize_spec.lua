-- flow.visualize: which rank holds which block of a global tensor, as a text grid and as SVG;
-- flow.visualize_boxing: a conversion's before and after with its collective.
local flow = require "flow"
local S, B, P = flow.sbp.split, flow.sbp.broadcast, flow.sbp.partial_sum
local ws = flow.world_size()

local function all_ranks()
  local r = {}
  for i = 0, ws - 1 do r[#r + 1] = i end
  return flow.placement("cpu", r)
end

describe("flow.visualize #mpi", function()
  it("S(0): one row band per rank, uneven sizes as the split gives them", function()
    local x = flow.zeros({ 2 * ws + 1, 3 }, { placement = all_ranks(), sbp = S(0) })
    local text = flow.visualize(x)
    assert.matches("layout of {" .. (2 * ws + 1) .. ",3} float32", text)
    local start = 0
    for r = 0, ws - 1 do
      local n = r == 0 and 3 or 2 -- the first n % p ranks get one more row
      assert.matches(("\n%d:%d%%s*| r%d%%s"):format(start, start + n, r), text .. "\n")
      start = start + n
    end
  end)

  it("B: every rank holds the whole tensor; P: the copies are marked as partial sums", function()
    local b = flow.visualize(flow.zeros({ 4, 4 }, { placement = all_ranks(), sbp = B }))
    local every = {}
    for r = 0, ws - 1 do every[#every + 1] = "r" .. r end
    assert.matches("0:4%s*| " .. table.concat(every, " "), b)
    local p = flow.visualize(flow.zeros({ 4, 4 }, { placement = all_ranks(), sbp = P }))
    assert.matches("r0%+", p)
    assert.matches("partial sum over mesh axis 0", p)
  end)

  it("a 2-D mesh with (S(0), S(1)) is a grid of blocks", function()
    if ws ~= 4 then return pending("needs 4 ranks") end
    local mesh = flow.placement("cpu", { { 0, 1 }, { 2, 3 } })
    local text = flow.visualize(flow.zeros({ 4, 6 }, { placement = mesh, sbp = { S(0), S(1) } }))
    assert.matches("rows%s*| cols 0:3%s*| cols 3:6", text)
    assert.matches("0:2%s*| r0%s*| r1", text)
    assert.matches("2:4%s*| r2%s*| r3", text)
  end)

  it("writes an SVG with one rectangle per block, labelled with its ranks", function()
    local path = os.tmpname()
    local svg = flow.visualize(flow.zeros({ 8, 2 }, { placement = all_ranks(), sbp = S(0) }), path)
    local f = assert(io.open(path))
    assert.equal(svg, f:read("a"))
    f:close()
    os.remove(path)
    assert.matches("^<svg xmlns", svg)
    local rects, labels = 0, {}
    for _ in svg:gmatch('class="block"') do rects = rects + 1 end
    for l in svg:gmatch('class="ranks"[^>]*>([^<]*)<') do labels[#labels + 1] = l end
    assert.equal(ws, rects)
    for r = 0, ws - 1 do assert.equal("r" .. r, labels[r + 1]) end
  end)

  it("a boxing picture: before and after, and the collective that runs it", function()
    local x = flow.zeros({ 8 }, { placement = all_ranks(), sbp = S(0) })
    local text = flow.visualize_boxing(x, all_ranks(), B)
    assert.matches("before: layout of {8}.-sbp S%(0%)", text)
    assert.matches("after:  layout of {8}.-sbp B", text)
    if ws > 1 then assert.matches("all%-gather", text) end
    local path = os.tmpname()
    local svg = flow.visualize_boxing(x, all_ranks(), B, path)
    os.remove(path)
    local rects = 0
    for _ in svg:gmatch('class="block"') do rects = rects + 1 end
    assert.equal(ws + 1, rects) -- ws blocks before, one whole block after
    assert.matches('class="explain"', svg)
  end)

  it("a local tensor is an error that says what is expected", function()
    assert.has_error(function() flow.visualize(flow.zeros({ 2 })) end,
      "visualize: expected a global tensor (a local tensor has one block: itself)")
  end)
end)
