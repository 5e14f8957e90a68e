local flow = require "flow"

describe("tostring of a tensor", function()
  after_each(function() flow.set_printoptions({profile = "default"}) end)

  it("prints floats with 4 decimals, one row per line, then shape and dtype", function()
    assert.equal("tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]], shape={2,2}, dtype=float32)",
                 tostring(flow.tensor({{1, 2}, {3, 4}}, {dtype = "float32"})))
    assert.equal("tensor([ 1.5000, -2.2500, 10.0000], shape={3}, dtype=float64)",
                 tostring(flow.tensor({1.5, -2.25, 10}, {dtype = "float64"})))
  end)

  it("prints integers without decimals and booleans as true/false, right-aligned", function()
    assert.equal("tensor([  0,   5, -10], shape={3}, dtype=int64)", tostring(flow.tensor({0, 5, -10})))
    assert.equal("tensor([ true, false], shape={2}, dtype=bool)", tostring(flow.tensor({true, false})))
  end)

  it("prints 0-d and empty tensors", function()
    assert.equal("tensor(3.1416, shape={}, dtype=float32)", tostring(flow.tensor(3.14159, {dtype = "float32"})))
    assert.equal("tensor(7, shape={}, dtype=int64)", tostring(flow.tensor(7)))
    assert.equal("tensor([], shape={0}, dtype=float32)", tostring(flow.zeros({0})))
  end)

  it("separates the blocks of a 3-d tensor with a blank line", function()
    local t = flow.tensor({{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}})
    assert.equal("tensor([[[1, 2],\n         [3, 4]],\n\n        [[5, 6],\n         [7, 8]]], shape={2,2,2}, dtype=int64)",
                 tostring(t))
  end)

  it("elides the middle of each axis of a tensor above 1000 elements", function()
    assert.equal("tensor([   0,    1,    2, ..., 1997, 1998, 1999], shape={2000}, dtype=int64)",
                 tostring(flow.arange(2000)))
    assert.equal("tensor([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], shape={10}, dtype=int64)", tostring(flow.arange(10)))
    local rows = {}
    for i = 0, 39 do
      local r = {}
      for j = 0, 49 do r[j + 1] = i * 50 + j end
      rows[i + 1] = r
    end
    local s = tostring(flow.tensor(rows))
    local lines = {}
    for l in s:gmatch("[^\n]+") do lines[#lines + 1] = l end
    assert.equal(7, #lines)
    assert.equal("tensor([[   0,    1,    2, ...,   47,   48,   49],", lines[1])
    assert.equal("        ...,", lines[4])
    assert.equal("        [1950, 1951, 1952, ..., 1997, 1998, 1999]], shape={40,50}, dtype=int64)", lines[7])
  end)

  it("switches to scientific notation when magnitudes span more than 1000x", function()
    assert.equal("tensor([1.0000e-06, 1.0000e+00, 1.0000e+03], shape={3}, dtype=float32)",
                 tostring(flow.tensor({1e-6, 1, 1000}, {dtype = "float32"})))
    flow.set_printoptions({sci_mode = false, precision = 2})
    assert.equal("tensor([   0.00,    1.00, 1000.00], shape={3}, dtype=float32)",
                 tostring(flow.tensor({1e-6, 1, 1000}, {dtype = "float32"})))
    flow.set_printoptions({profile = "default"})
    assert.equal("tensor([1.0000e-06, 1.0000e+00], shape={2}, dtype=float32)",
                 tostring(flow.tensor({1e-6, 1}, {dtype = "float32"})))
  end)

  it("spells nan and infinities", function()
    assert.equal("tensor([   nan,    inf,   -inf, 1.0000], shape={4}, dtype=float32)",
                 tostring(flow.tensor({0 / 0, 1 / 0, -1 / 0, 1}, {dtype = "float32"})))
  end)

  it("notes requires_grad", function()
    local x = flow.ones({2}, {requires_grad = true})
    assert.equal("tensor([1.0000, 1.0000], shape={2}, dtype=float32, requires_grad=true)", tostring(x))
    assert.equal("tensor([2.0000, 2.0000], shape={2}, dtype=float32, grad_fn=<mul>)", tostring(x * 2))
    assert.equal("tensor([1.0000, 1.0000], shape={2}, dtype=float32)", tostring(x:detach()))
  end)

  it("reads strided views in logical order", function()
    local t = flow.tensor({{1, 2, 3}, {4, 5, 6}})
    if not t.transpose then return pending("transpose is not built yet") end
    assert.equal("tensor([[1, 4],\n        [2, 5],\n        [3, 6]], shape={3,2}, dtype=int64)",
                 tostring(t:transpose(0, 1)))
  end)

  it("rejects unknown print options", function()
    local ok, err = pcall(flow.set_printoptions, {precison = 2})
    assert.is_false(ok)
    assert.matches("set_printoptions: unknown option 'precison'", err)
  end)
end)

-- A global tensor prints its logical values, gathered from the ranks of its placement, then its
-- placement, SBP and each rank's block. Gathering is a collective: print (which every rank calls)
-- and the REPL gather, while tostring never communicates in a multi-rank world.
describe("printing a global tensor", function()
  local shell = require "support.shell"
  local bin = os.getenv("FLOW_BIN")

  it("shows the gathered values in a world of one", function()
    local P = flow.placement("cpu", {0})
    local x = flow.arange(6):reshape({3, 2}):to_global(P, flow.sbp.broadcast):to_global(P, flow.sbp.split(1))
    assert.equal("tensor([[0, 1],\n        [2, 3],\n        [4, 5]], shape={3,2}, dtype=int64, placement=cpu{0}, "
                 .. "sbp=S(1))\n  rank 0: [0:3, 0:2]", tostring(x))
    local p = flow.ones({2}, {placement = P, sbp = flow.sbp.partial_sum, requires_grad = true})
    assert.equal("tensor([1.0000, 1.0000], shape={2}, dtype=float32, placement=cpu{0}, sbp=P, requires_grad=true)"
                 .. "\n  rank 0: [0:2] (partial)", tostring(p))
    assert.matches("grad_fn=<mul>", tostring(p * 2))
  end)

  -- What `print` writes under `mpirun -np ws` for a script printing S(0), P, a placement without
  -- rank 0, and (at 4 ranks) a 2-D mesh; rank 1 also calls tostring alone, which must not hang.
  local script = [==[
local ws = flow.world_size()
local ranks = {}
for r = 0, ws - 1 do ranks[#ranks + 1] = r end
local P = flow.placement("cpu", ranks)
local B, S = flow.sbp.broadcast, flow.sbp.split
local x = flow.arange(2 * ws):reshape({ws, 2}):to_global(P, B):to_global(P, S(0))
if flow.rank() == 1 then assert(tostring(x):find("local shard on rank 1: tensor([[2, 3]]", 1, true)) end
print(x)
print("sum:", flow.ones({2}, {placement = P, sbp = flow.sbp.partial_sum}) * 3)
print(flow.ones({2}, {placement = flow.placement("cpu", {ws - 1}), sbp = B}))
if ws == 4 then
  local mesh = flow.placement("cpu", {{0, 1}, {2, 3}})
  print(flow.arange(8):reshape({2, 4}):to_global(mesh, {B, B}):to_global(mesh, {S(0), S(1)}))
end
]==]

  local function expected(ws)
    local rows, blocks, all = {}, {}, {}
    for r = 0, ws - 1 do
      rows[#rows + 1] = ("[%d, %d]"):format(2 * r, 2 * r + 1)
      blocks[#blocks + 1] = ("  rank %d: [%d:%d, 0:2]"):format(r, r, r + 1)
      all[#all + 1] = tostring(r)
    end
    local place = "cpu{" .. table.concat(all, ", ") .. "}"
    local lines = {
      "tensor([" .. table.concat(rows, ",\n        ") .. "], shape={" .. ws .. ",2}, dtype=int64, placement="
        .. place .. ", sbp=S(0))",
      table.concat(blocks, "\n"),
      "sum:\ttensor([3.0000, 3.0000], shape={2}, dtype=float32, placement=" .. place .. ", sbp=P)",
    }
    for r = 0, ws - 1 do lines[#lines + 1] = ("  rank %d: [0:2] (partial)"):format(r) end
    lines[#lines + 1] = ("tensor([1.0000, 1.0000], shape={2}, dtype=float32, placement=cpu{%d}, sbp=B)"):format(ws - 1)
    lines[#lines + 1] = ("  rank %d: [0:2]"):format(ws - 1)
    if ws == 4 then
      lines[#lines + 1] = "tensor([[0, 1, 2, 3],\n        [4, 5, 6, 7]], shape={2,4}, dtype=int64, "
        .. "placement=cpu{{0, 1}, {2, 3}}, sbp=(S(0), S(1)))"
      lines[#lines + 1] = "  rank 0: [0:1, 0:2]\n  rank 1: [0:1, 2:4]\n  rank 2: [1:2, 0:2]\n  rank 3: [1:2, 2:4]"
    end
    return table.concat(lines, "\n") .. "\n"
  end

  for _, ws in ipairs({2, 4}) do
    it(("prints the gathered values under mpirun -np %d, every rank taking part"):format(ws), function()
      if not bin then return pending("FLOW_BIN is not set") end
      if not flow._has_mpi or not shell.has("mpirun") then return pending("needs MPI and mpirun") end
      local path = os.tmpname()
      local f = assert(io.open(path, "w"))
      f:write(script)
      f:close()
      local out, err, code = shell.run(("OPENBLAS_NUM_THREADS=1 timeout 120 mpirun --allow-run-as-root --oversubscribe "
        .. "-np %d %s %s"):format(ws, shell.quote(bin), shell.quote(path)))
      os.remove(path)
      assert.equal(0, code, err)
      assert.equal(expected(ws), out)
    end)
  end
end)
