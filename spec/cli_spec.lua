-- flowlua as a drop-in lua5.4: the same arguments given to $FLOW_BIN and to Debian's lua5.4 print
-- the same and exit the same (the program's name aside); os.exit under mpirun ends cleanly, and
-- an uncaught error on one rank ends the whole job.
local flow = require "flow"
local shell = require "support.shell"
local bin = os.getenv("FLOW_BIN")
local sh_quote, has, run = shell.quote, shell.has, shell.run

if not bin or not has("lua5.4") then
  describe("the flowlua command line", function()
    it("needs the binary and lua5.4", function()
      pending("FLOW_BIN is not set (scripts/test.sh exports it) or lua5.4 is not installed")
    end)
  end)
  return
end

local dir = shell.tmpdir()
local function write(name, text)
  local f = assert(io.open(dir .. "/" .. name, "w"))
  f:write(text)
  f:close()
  return dir .. "/" .. name
end
write("mymod.lua", "return {answer = 42}\n")
local script = write("script.lua", "print('script', ...) print(arg[0], arg[-1] ~= nil, #arg)\n")
local init = write("init.lua", "print('init from file')\n")
local failing = write("failing.lua", "local function inner() error('deep') end\ninner()\n")

-- Each case: the environment and arguments given to both interpreters (stdin from /dev/null
-- unless the case pipes its own).
local cases = {
  {"-e chunks run in order", "-e 'print(1)' -e 'print(2)'"},
  {"-e attached to its chunk", "-e'print(3)'"},
  {"-l mod sets the global mod", "-l mymod -e 'print(mymod.answer)'"},
  {"-l g=mod sets the global g", "-l m=mymod -e 'print(m.answer, mymod)'"},
  {"-l of a missing module fails", "-l nosuchmodule -e 'print(1)'"},
  {"LUA_INIT runs before the options", "-e 'print(2)'", env = "LUA_INIT='print(1)'"},
  {"LUA_INIT_5_4 wins over LUA_INIT", "-e 'print(2)'", env = "LUA_INIT='print(0)' LUA_INIT_5_4='print(1)'"},
  {"LUA_INIT=@file runs the file", "-e 'print(2)'", env = "LUA_INIT=@" .. init},
  {"an error in LUA_INIT stops the run", "-e 'print(2)'", env = "LUA_INIT='error(\"in init\")'"},
  {"-E ignores LUA_INIT and LUA_PATH", "-E -e 'print(package.path:find(\"/nowhere/\", 1, true))'",
   env = "LUA_INIT='print(1)' LUA_PATH='/nowhere/?.lua'"},
  {"without -E LUA_PATH counts", "-e 'print(package.path:find(\"/nowhere/\", 1, true) ~= nil)'",
   env = "LUA_PATH='/nowhere/?.lua'"},
  {"warnings are off by default", "-e 'warn(\"hidden\") print(1)'"},
  {"-W turns warnings on", "-W -e 'warn(\"shown\", \" in pieces\")'"},
  {"warn('@on') turns them on", "-e 'warn(\"@on\") warn(\"a\") warn(\"@off\") warn(\"b\")'"},
  {"an error in __gc is a warning", "-W -e 'setmetatable({}, {__gc = function() error(\"in gc\") end}) collectgarbage()'"},
  {"a script gets its arguments in arg and ...", sh_quote(script) .. " a b"},
  {"-- ends the options", "-- " .. sh_quote(script) .. " -x"},
  {"- runs stdin with the arguments", "- one two", stdin = "echo 'print(..., arg[0])'"},
  {"an unknown option is an error", "-x"},
  {"-e without a chunk is an error", "-e"},
  {"-- with more after it is an error", "--x"},
  {"-i with a suffix is an error", "-ix"},
  {"a failing script exits 1 with a traceback", sh_quote(failing)},
  {"a missing script is an error", sh_quote(dir .. "/nosuch.lua")},
  {"a syntax error is reported", "-e 'x ='"},
  {"an error object that is a table", "-e 'error({})'"},
  {"os.exit passes the status", "-e 'os.exit(3)'"},
  {"os.exit(false) fails", "-e 'os.exit(false)'"},
  {"os.exit(true, true) closes the state", "-e 'setmetatable({}, {__gc = function() print(\"closed\") end}) os.exit(true, true)'"},
}

describe("flowlua as a drop-in for lua5.4", function()
  for _, case in ipairs(cases) do
    it(case[1], function()
      local function go(interp)
        local cmd = ("cd %s && %s %s%s %s"):format(sh_quote(dir), case.stdin and (case.stdin .. " |") or "",
          case.env and (case.env .. " ") or "", sh_quote(interp), case[2])
        if not case.stdin then cmd = cmd .. " </dev/null" end
        local out, err, code = run(cmd)
        return out, (err:gsub(interp:gsub("%p", "%%%0"), "PROG")), code
      end
      local lout, lerr, lcode = go("lua5.4")
      local fout, ferr, fcode = go(bin)
      assert.equal(lout, fout)
      assert.equal(lerr, ferr)
      assert.equal(lcode, fcode)
    end)
  end

  it("names itself flowlua in -v, with the Lua release", function()
    local out, _, code = run(sh_quote(bin) .. " -v")
    assert.equal(0, code)
    assert.matches("^flowlua %d+%.%d+%.%d+ %(Lua 5%.4[^\n]*%)\n$", out)
  end)
end)

describe("flowlua under mpirun", function()
  local function mpirun(np, args)
    return run("timeout 60 mpirun --allow-run-as-root --oversubscribe -np " .. np .. " " .. sh_quote(bin) .. " " .. args)
  end

  it("ends cleanly on os.exit(0): MPI is finalized at exit", function()
    if not has("mpirun") then return pending("mpirun is not installed") end
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    local out, err, code = mpirun(2, "-e 'io.write(flow.world_size(), flow.rank(), \"\\n\") os.exit(0)'")
    assert.equal("", err)
    assert.equal(0, code)
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    table.sort(lines)
    assert.same({"20", "21"}, lines)
  end)

  it("passes a failing os.exit status on to mpirun", function()
    if not has("mpirun") then return pending("mpirun is not installed") end
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    local _, _, code = mpirun(2, "-e 'os.exit(3)'")
    assert.equal(3, code)
  end)

  it("ends the whole job at once when one rank raises: its error, tagged with its rank, once", function()
    if not has("mpirun") then return pending("mpirun is not installed") end
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    -- rank 0 goes on into a collective that rank 1 never joins
    local one_fails = write("one_fails.lua", [[
local P = flow.placement("cpu", {0, 1})
if flow.rank() == 1 then error("only rank 1 fails") end
local x = flow.ones({4}, {placement = P, sbp = flow.sbp.split(0)})
print(x:to_global(P, flow.sbp.broadcast):sum():item())
]])
    local t0 = flow.now()
    local out, err, code = mpirun(2, sh_quote(one_fails))
    local elapsed = flow.now() - t0
    assert.is_true(elapsed < 10, ("took %.1f s"):format(elapsed))
    assert.are_not.equal(0, code)
    assert.are_not.equal(124, code, "timed out") -- timeout's status: the job hung
    local _, n = err:gsub("only rank 1 fails", "")
    assert.equal(1, n, err)
    assert.matches("%[rank 1%] [^\n]*one_fails.lua:2: only rank 1 fails", err)
    assert.equal("", out)
  end)
end)
