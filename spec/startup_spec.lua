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

-- An AddressSanitizer build's flow.so cannot load into an uninstrumented lua5.4.
local function sanitized()
  local cache = io.open(flow_so_dir .. "/CMakeCache.txt")
  local on = cache and cache:read("a"):match("FLOW_SANITIZE:BOOL=ON")
  if cache then cache:close() end
  return on ~= nil
end

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
    if sanitized() then return pending("an AddressSanitizer flow.so cannot load into an uninstrumented lua5.4") end
    local out, err, code = run("lua5.4 -e " .. sh_quote(
      "package.cpath = " .. ("%q"):format(flow_so_dir .. "/?.so;") .. " .. package.cpath "
      .. "collectgarbage('incremental') local p = print local flow = require 'flow' "
      .. "io.write(collectgarbage('incremental'), ' ', tostring(print == p), ' ', flow.world_size(), ' ', tostring(rawget(_G, 'flow')), '\\n')"))
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("incremental true 1 nil\n", out)
  end)
end)


-- The CUDA backend is a plugin (flow_cuda.so) loaded on first CUDA use: which of it and of the CUDA
-- libraries the process has mapped, read from /proc/self/maps and printed as a sorted list.
local mapped = "local seen, list = {}, {} for l in io.lines('/proc/self/maps') do "
  .. "for _, n in ipairs({'flow_cuda.so', 'libcudart', 'libcublas', 'libcudnn', 'libnccl'}) do "
  .. "if l:find(n, 1, true) and not seen[n] then seen[n] = true list[#list + 1] = n end end end "
  .. "table.sort(list) print(table.concat(list, ' '))"

describe("the CUDA plugin", function()
  local function flowlua(code, env)
    return run((env or "") .. " " .. sh_quote(bin) .. " -e " .. sh_quote(code))
  end

  it("is not loaded by a plain run, from flowlua or from lua5.4", function()
    local out, err, code = flowlua("local x = flow.ones({4}):sum() " .. mapped)
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("\n", out)
    if not shell.has("lua5.4") or sanitized() then return end
    out, err, code = run("lua5.4 -e " .. sh_quote("package.cpath = " .. ("%q"):format(flow_so_dir .. "/?.so;")
      .. " .. package.cpath local flow = require 'flow' local x = flow.ones({4}):sum() " .. mapped))
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("\n", out)
  end)

  it("loads on first CUDA use and reports the GPU state (no GPU is not an error)", function()
    if not flow.cuda.built then return pending("this build has no CUDA support") end
    local probe = "print(flow.cuda.is_available(), flow.cuda.unavailable_reason()) " .. mapped
    local out, err, code = flowlua(probe)
    assert.equal(0, code, err)
    local avail, reason, libs = out:match("^(%a+)\t([^\n]*)\n([^\n]*)\n$")
    assert.truthy(avail, out)
    assert.is_true(avail == "true" and reason == "nil" or reason:find("^no GPU found") ~= nil, out)
    assert.equal("flow_cuda.so libcublas libcudart libcudnn libnccl", libs)
    if not shell.has("lua5.4") or sanitized() then return end
    out, err, code = run("lua5.4 -e " .. sh_quote("package.cpath = " .. ("%q"):format(flow_so_dir .. "/?.so;")
      .. " .. package.cpath flow = require 'flow' " .. probe))
    assert.equal(0, code, err)
    assert.matches("^" .. avail .. "\t[^\n]*\nflow_cuda.so libcublas libcudart libcudnn libnccl\n$", out)
  end)

  it("says clearly when the plugin is missing or is not one", function()
    if not flow.cuda.built then return pending("this build has no CUDA support") end
    local probe = "print(flow.cuda.is_available(), flow.cuda.unavailable_reason()) "
      .. "print(select(2, pcall(flow.zeros, {2}, {device = 'cuda'})))"
    local out, _, code = flowlua(probe, "FLOW_CUDA_PLUGIN=/nonexistent/flow_cuda.so")
    assert.equal(0, code)
    assert.matches("^false\tthe CUDA plugin flow_cuda.so was not found %(looked for /nonexistent/flow_cuda.so", out)
    assert.matches("\n[^\n]*cuda is not available %(the CUDA plugin flow_cuda.so was not found", out)
    -- a shared library that is not the plugin: the zlib flowlua links
    local libz = flowlua("for l in io.lines('/proc/self/maps') do local p = l:match('(/%S*/libz%.so[%.%d]*)$') "
      .. "if p then print(p) break end end"):match("[^\n]+")
    if not libz then return end
    out, _, code = flowlua(probe, "FLOW_CUDA_PLUGIN=" .. sh_quote(libz))
    assert.equal(0, code)
    assert.matches("^false\t[^\n]*libz[^\n]* is not a flowlua CUDA plugin %(no flow_cuda_plugin_open%)", out)
  end)
end)
