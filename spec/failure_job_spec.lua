-- Jobs where a rank dies or stops for good (`mpirun -np 2` children): the job ends, with a message
-- naming the rank, instead of hanging. Cases a session survives are in spec/mpi/failure_spec.lua.
local flow = require "flow"
local sh = require "support.shell"
local bin = os.getenv("FLOW_BIN")

local function cannot()
  if not bin then return "FLOW_BIN is not set (scripts/test.sh exports the flowlua path)" end
  if not sh.has("mpirun") then return "mpirun is not installed" end
  if not flow._has_mpi then return "this build has no MPI (FLOW_MPI=OFF)" end
end

-- Run script on 2 ranks with FLOW_TIMEOUT=1 (and a watchdog grace of 1 s); its output (stdout and stderr), exit code and seconds.
local function job(script)
  local f = sh.script(script)
  local out, code, took = sh.timed("FLOW_TIMEOUT=1 FLOW_WATCHDOG_GRACE=1 OPENBLAS_NUM_THREADS=1 timeout -s KILL 60 mpirun "
    .. "--allow-run-as-root --oversubscribe -np 2 " .. sh.quote(bin) .. " " .. sh.quote(f))
  os.remove(f)
  return out, code, took
end

local setup = [[
local P = flow.placement("cpu", {0, 1})
local x = flow.ones({4, 3}):to_global(P, flow.sbp.broadcast):to_global(P, flow.sbp.split(0))
]]

describe("a rank that dies or stops for good", function()
  -- rank 1 gets the signal just before a boxing; what the job's output must say
  local cases = {
    { "KILL", "killed (SIGKILL): the job ends at once, and rank 0 names the rank in our words (mpirun too)",
      "flowlua: %[rank 0%] rank 1 %(pid %d+%) is gone %(exited, killed or crashed%), so the job ends" },
    { "STOP", "stopped (SIGSTOP): the others raise after FLOW_TIMEOUT naming it, and the job ends",
      "%[rank 0%] to_global: waited 1 s %(FLOW_TIMEOUT%) for rank 1, which did not arrive" },
  }
  for _, case in ipairs(cases) do
    it(case[2], function()
      local why = cannot()
      if why then return pending(why) end
      local out, code, took = job(setup .. ([[
if flow.rank() == 1 then os.execute("kill -%s $PPID") end
print(x:to_global(P, flow.sbp.broadcast):sum():item())
]]):format(case[1]))
      assert.are_not.equal(0, code)
      assert.matches(case[3], out)
      assert.not_matches("12%.0", out) -- no value was printed
      assert.not_matches("%[rank 0%] %[rank 0%]", out) -- tagged once
      assert.is_true(took < 30, ("the job took %.0f s to end"):format(took))
    end)
  end

  it("stopped inside a collective that had no handshake: the watchdog ends the job after FLOW_TIMEOUT + FLOW_WATCHDOG_GRACE", function()
    local why = cannot()
    if why then return pending(why) end
    local out, code, took = job([[
if flow.rank() == 1 then os.execute("kill -STOP $PPID") end
flow._allgather_strings("x")
]])
    assert.are_not.equal(0, code)
    assert.matches("%[rank 0%] all%-gather: no progress for %d+ s %(FLOW_TIMEOUT 1 s %+ 1 s%)", out)
    assert.is_true(took < 30, ("the job took %.0f s to end"):format(took))
  end)
end)
