-- `flowlua --ranks N`: N ranks without mpirun, as forked processes on the shared-memory backend
-- (core/comm_launch.c, core/comm_local.c). The multi-rank specs pass as under mpirun, and a job ends
-- as an mpirun job does: the first rank to fail ends the others, and the message names it.
local flow = require "flow"
local sh = require "support.shell"
local bin = os.getenv("FLOW_BIN")

-- Run flowlua with these arguments (a shell fragment); its output (stdout then stderr), exit code
-- and seconds.
local function flowlua(args, env)
  return sh.timed((env or "") .. " OPENBLAS_NUM_THREADS=1 FLOW_SPEC_LABEL=specs timeout -s KILL 300 "
    .. sh.quote(bin) .. " " .. args)
end

local script = sh.script

local function needs_bin()
  if not bin then pending("FLOW_BIN is not set (scripts/test.sh exports the flowlua path)") end
  return bin ~= nil
end

describe("flowlua --ranks", function()
  -- scripts/test.sh runs all of spec/mpi under --ranks 2 and --ranks 4 (local2, local4); here one
  -- file of it shows the spec runner itself works on the ranks of a job (the closing line counts
  -- each rank's results)
  it("runs a multi-rank spec file as mpirun -np N does", function()
    if not needs_bin() then return end
    local out, code = flowlua("--ranks 2 spec/run.lua spec/mpi/boxing_spec.lua")
    local passed, failed = out:match("specs: (%d+) passed, (%d+) failed")
    assert.is_truthy(passed, out)
    assert.are.equal("0", failed, out)
    assert.is_true(tonumber(passed) > 100, out)
    assert.are.equal(0, code, out)
  end)

  describe("the command line", function()
    it("--ranks 0, a missing or a bad count is an error, with --ranks's usage", function()
      if not needs_bin() then return end
      for _, bad in ipairs({ "--ranks 0", "--ranks=-1", "--ranks x", "--ranks" }) do
        local out, code = flowlua(bad .. " -e 'print(1)'")
        assert.are.equal(1, code, bad)
        assert.matches("%-%-ranks needs a number of ranks from 1 to 1024", out, 1, false)
        assert.matches("usage: [^\n]* %-%-ranks n %[options%] %[script %[args%]%]", out)
        assert.not_matches("\n1\n", "\n" .. out)
      end
    end)

    it("a rank's world is not MPI's: flow.init_mpi() refuses", function()
      if not needs_bin() then return end
      local out, code = flowlua("--ranks 2 -e 'print(pcall(flow.init_mpi))'")
      assert.are.equal(0, code, out)
      assert.matches("^false\t[^\n]*this process is a rank of flowlua %-%-ranks", out)
    end)

    it("flow.rank() and flow.world_size() are the job's; print speaks for rank 0, print_all for all", function()
      if not needs_bin() then return end
      local out, code = flowlua("--ranks 3 -e 'print(\"once\", flow.mpi_running())' "
        .. "-e 'flow.print_all(flow.rank(), flow.world_size())'")
      assert.are.equal(0, code, out)
      assert.are.equal("once\tfalse\n[rank 0] 0\t3\n[rank 1] 1\t3\n[rank 2] 2\t3\n", out)
    end)

    it("rank 0 reads stdin, the others read nothing, as under mpirun", function()
      if not needs_bin() then return end
      local out, code = flowlua("--ranks 2 -e 'flow.print_all(io.read(\"l\"))'", "echo typed |")
      assert.are.equal(0, code, out)
      assert.are.equal("[rank 0] typed\n[rank 1] nil\n", out)
    end)

    it("the REPL runs every line on every rank", function()
      if not needs_bin() then return end
      local out, code = flowlua("--ranks 2", "printf 'x = flow.rank() * 10\\nflow.print_all(x)\\nx + 1\\n' |")
      assert.are.equal(0, code, out)
      assert.are.equal("[rank 0] 0\n[rank 1] 10\n1\n", out)
    end)

    it("--ranks comes before the script; the script's own arguments are its own", function()
      if not needs_bin() then return end
      local f = script("flow.print_all(select('#', ...), ...)\n")
      local out, code = flowlua("--ranks=2 " .. f .. " --ranks 3")
      os.remove(f)
      assert.are.equal(0, code, out)
      assert.are.equal("[rank 0] 2\t--ranks\t3\n[rank 1] 2\t--ranks\t3\n", out)
    end)
  end)

  describe("flow.run_ranks(n, fn, ...)", function()
    it("runs fn on n ranks of a job of its own, with its upvalues and arguments copied", function()
      if not needs_bin() then return end
      local dir, scale = os.tmpname(), 10
      os.remove(dir)
      assert(os.execute("mkdir " .. sh.quote(dir)))
      flow.run_ranks(3, function(path)
        local P = flow.placement("cpu", { 0, 1, 2 })
        local x = flow.ones({ 2, 2 }):to_global(P, flow.sbp.split(0))
        local f = assert(io.open(("%s/%d"):format(path, flow.rank()), "w"))
        f:write(flow.world_size(), " ", ("%g"):format(x:sum():item() * scale))
        f:close()
      end, dir)
      for r = 0, 2 do
        local f = assert(io.open(("%s/%d"):format(dir, r)))
        assert.are.equal("3 120", f:read("a"))
        f:close()
        os.remove(("%s/%d"):format(dir, r))
      end
      os.remove(dir)
    end)

    it("raises with the failing rank's message", function()
      if not needs_bin() then return end
      local ok, err = pcall(flow.run_ranks, 2, function()
        if flow.rank() == 1 then error("boom") end
        flow.barrier()
      end)
      assert.is_false(ok)
      assert.matches("run_ranks: .*%[rank 1%] [^\n]*: boom", err)
      assert.matches("rank 1 exited with status 1", err, 1, true)
    end)

    it("refuses upvalues and arguments that cannot travel", function()
      local t = {}
      assert.has_error(function() flow.run_ranks(2, function() return t end) end,
        "run_ranks: upvalue 't' is a table; only flow, _ENV, nil, booleans, numbers and strings reach the ranks")
      assert.has_error(function() flow.run_ranks(2, function() end, print) end,
        "run_ranks: argument 1 is a function; only flow, _ENV, nil, booleans, numbers and strings reach the ranks")
      assert.has_error(function() flow.run_ranks(0, function() end) end)
    end)
  end)

  describe("how a job ends", function()
    it("an uncaught error on one rank ends the job at once, naming the rank", function()
      if not needs_bin() then return end
      local out, code, took = flowlua("--ranks 3 -e 'if flow.rank() == 1 then error(\"boom\") end' "
        .. "-e 'flow.barrier() print(\"passed the barrier\")'")
      assert.are.equal(1, code, out)
      assert.matches("%[rank 1%] %(command line%):1: boom", out)
      assert.matches("rank 1 exited with status 1; ending the job", out, 1, false)
      assert.not_matches("passed the barrier", out)
      assert.is_true(took < 10, ("the job took %.0f s to end"):format(took))
    end)

    it("os.exit: the job's status is the first failing rank's, 0 when all succeed", function()
      if not needs_bin() then return end
      local cases = { { "os.exit(0)", 0 }, { "os.exit(true)", 0 }, { "os.exit(3)", 3 },
                      { "os.exit(flow.rank() == 2 and 5 or 0)", 5 }, { "flow.print_all(1)", 0 } }
      for _, case in ipairs(cases) do
        local out, code = flowlua("--ranks 3 -e " .. sh.quote(case[1]))
        assert.are.equal(case[2], code, case[1] .. ": " .. out)
        if case[2] == 5 then assert.matches("rank 2 exited with status 5", out, 1, false) end
      end
    end)

    it("a rank killed (SIGKILL) ends the job at once, naming it", function()
      if not needs_bin() then return end
      local f = script([[
if flow.rank() == 1 then os.execute("kill -KILL $PPID") end
flow.barrier()
print("passed the barrier")
]])
      local out, code, took = flowlua("--ranks 2 " .. f)
      os.remove(f)
      assert.are.equal(137, code, out)
      assert.matches("rank 1 was killed by signal 9", out, 1, false)
      assert.not_matches("passed the barrier", out)
      assert.is_true(took < 10, ("the job took %.0f s to end"):format(took))
    end)

    it("a stopped rank (SIGSTOP): the others raise after FLOW_TIMEOUT naming it, and the job ends", function()
      if not needs_bin() then return end
      local f = script([[
local P = flow.placement("cpu", {0, 1})
local x = flow.ones({4, 3}):to_global(P, flow.sbp.broadcast):to_global(P, flow.sbp.split(0))
if flow.rank() == 1 then os.execute("kill -STOP $PPID") end
print(x:to_global(P, flow.sbp.broadcast):sum():item())
]])
      local out, code, took = flowlua("--ranks 2 " .. f, "FLOW_TIMEOUT=1")
      os.remove(f)
      assert.are_not.equal(0, code)
      assert.matches("%[rank 0%] to_global: waited 1 s %(FLOW_TIMEOUT%) for rank 1, which did not arrive", out)
      assert.matches("rank 0 exited with status 1; ending the job", out, 1, false)
      assert.is_true(took < 30, ("the job took %.0f s to end"):format(took))
    end)

    it("stopped inside a collective that had no handshake: the job ends after FLOW_TIMEOUT + FLOW_WATCHDOG_GRACE", function()
      if not needs_bin() then return end
      local f = script([[
if flow.rank() == 1 then os.execute("kill -STOP $PPID") end
flow._allgather_strings("x")
]])
      local out, code, took = flowlua("--ranks 2 " .. f, "FLOW_TIMEOUT=1 FLOW_WATCHDOG_GRACE=1")
      os.remove(f)
      assert.are_not.equal(0, code)
      assert.matches("%[rank 0%] all%-gather: no progress for %d+ s %(FLOW_TIMEOUT 1 s %+ 1 s%)", out)
      assert.is_true(took < 30, ("the job took %.0f s to end"):format(took))
    end)

    it("a rank that exits while another waits for it: the other raises at once, naming it", function()
      if not needs_bin() then return end
      local out, code, took = flowlua("--ranks 2 -e 'if flow.rank() == 1 then os.exit(0) end' "
        .. "-e 'local ok, err = pcall(flow.barrier) print(ok, err)'")
      assert.are.equal(0, code, out)
      assert.matches("false\t%[rank 0%] barrier: rank 1 exited; rank 0 is at barrier", out)
      assert.is_true(took < 10, ("the job took %.0f s to end"):format(took))
    end)
  end)
end)
