-- Start-up: a plain run is a world of one without MPI; MPI starts under a launcher or when asked;
-- flow.so required from a host lua5.4 leaves the host's GC mode and print alone.
local flow = require "flow"
local shell = require "support.shell"
local bin = os.getenv("FLOW_BIN")
local sh_quote, run = shell.quote, shell.run

if not bin then
  describe("flowlua start-up", function()
    it("needs the binary", function() pending("FLOW_BIN is not set (scripts/test.sh exports the flowlua path)") end)
  end)
  return
end
local flow_so_dir = bin:match("^(.*)/[^/]*$") or "."

describe("flowlua start-up", function()
  it("is a world of one without MPI in a plain run", function()
    local out, _, code = run(sh_quote(bin) .. " -e 'print(flow.world_size(), flow.mpi_running())'")
    assert.equal(0, code)
    assert.equal("1\tfalse\n", out)
  end)

  it("starts MPI when asked, with FLOW_MPI=1 or flow.init_mpi()", function()
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    local out, _, code = run("FLOW_MPI=1 " .. sh_quote(bin) .. " -e 'print(flow.world_size(), flow.mpi_running())'")
    assert.equal(0, code)
    assert.equal("1\ttrue\n", out)
    out, _, code = run(sh_quote(bin) .. " -e 'local P = flow.placement(\"cpu\", {0}) print(flow.init_mpi(), flow.mpi_running())"
      .. " print(flow.ones({2}, {placement = P, sbp = flow.sbp.broadcast}):to_local():sum():item())'")
    assert.equal(0, code)
    assert.equal("1\ttrue\n2.0\n", out)
  end)

  it("joins the launcher's world under mpirun, even of one rank", function()
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    if not shell.has("mpirun") then return pending("mpirun is not installed") end
    local out, _, code = run("timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 " .. sh_quote(bin)
      .. " -e 'print(flow.world_size(), flow.mpi_running())'")
    assert.equal(0, code)
    assert.equal("1\ttrue\n", out)
  end)

  it("leaves a host lua5.4's GC mode and print alone when required from flow.so", function()
    if not shell.has("lua5.4") then return pending("lua5.4 is not installed") end
    local cache = io.open(flow_so_dir .. "/CMakeCache.txt")
    local sanitized = cache and cache:read("a"):match("FLOW_SANITIZE:BOOL=ON")
    if cache then cache:close() end
    if sanitized then return pending("an AddressSanitizer flow.so cannot load into an uninstrumented lua5.4") end
    local out, err, code = run("lua5.4 -e " .. sh_quote(
      "package.cpath = " .. ("%q"):format(flow_so_dir .. "/?.so;") .. " .. package.cpath "
      .. "collectgarbage('incremental') local p = print local flow = require 'flow' "
      .. "io.write(collectgarbage('incremental'), ' ', tostring(print == p), ' ', flow.world_size(), ' ', tostring(rawget(_G, 'flow')), '\\n')"))
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("incremental true 1 nil\n", out)
  end)
end)

