-- busted output handler: busted's plain terminal output, then one closing line
-- "<label>: N passed, N failed, N skipped" (label from FLOW_SPEC_LABEL, default "specs").
-- Under mpirun rank 0 prints the per-test lines, other ranks print only their failures (tagged
-- with the rank), and the closing line counts a test as failed when it failed on any rank.
return function(options)
  local busted = require "busted"
  local flow = require "flow"
  local rank, size = flow.rank(), flow.world_size()
  local handler
  if rank == 0 then
    handler = require "busted.outputHandlers.plainTerminal"(options)
  else
    handler = require "busted.outputHandlers.base"()
    local function report(element, parent, message, trace)
      io.stderr:write(("[rank %d] FAIL %s\n%s\n"):format(rank, handler.getFullName(element),
        tostring(message or (trace and trace.message) or "")))
      return nil, true
    end
    busted.subscribe({ "failure" }, report)
    busted.subscribe({ "error" }, report)
  end

  -- every rank's {passed, failed, skipped}, gathered with the framework's own all-gather
  local function gather(counts)
    if size == 1 then return { counts } end
    local ranks = {}
    for r = 0, size - 1 do ranks[#ranks + 1] = r end
    local P = flow.placement("cpu", ranks)
    local mine = flow.tensor({ counts }, { dtype = "float64" })
    return mine:to_global(P, flow.sbp.split(0)):to_global(P, flow.sbp.broadcast):to_local():totable()
  end

  busted.subscribe({ "suite", "end" }, function()
    local counts = { handler.successesCount or 0,
                     (handler.failuresCount or 0) + (handler.errorsCount or 0),
                     handler.pendingsCount or 0 }
    local ok, all = pcall(gather, counts)
    if not ok then
      io.stderr:write(("[rank %d] could not gather spec counts: %s\n"):format(rank, tostring(all)))
      all = { counts }
    end
    local passed, failed, skipped = counts[1], 0, counts[3]
    for _, c in ipairs(all) do
      passed = math.min(passed, math.floor(c[1]))
      failed = math.max(failed, math.floor(c[2]))
    end
    if rank == 0 then
      io.stdout:write(("\n%s: %d passed, %d failed, %d skipped\n"):format(
        os.getenv("FLOW_SPEC_LABEL") or "specs", passed, failed, skipped))
      io.stdout:flush()
    end
    return nil, true
  end)
  return handler
end
