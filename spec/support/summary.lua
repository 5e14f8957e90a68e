-- busted output handler: busted's plain terminal output, then one closing line
-- "<label>: N passed, N failed, N skipped" (label from FLOW_SPEC_LABEL, default "specs").
-- Under mpirun only rank 0 prints the per-test lines; every rank's failures are printed.
return function(options)
  local busted = require "busted"
  local flow = require "flow"
  local rank = flow.rank and flow.rank() or 0
  local handler = require "busted.outputHandlers.plainTerminal"(options)
  if rank ~= 0 then
    -- keep only failure reports from other ranks, tagged with the rank
    local base = require "busted.outputHandlers.base"()
    local function report(element, parent, message, trace)
      io.stderr:write(("[rank %d] FAIL %s\n%s\n"):format(rank, base.getFullName(element),
        tostring(message or (trace and trace.message) or "")))
      return nil, true
    end
    busted.subscribe({ "test", "end" }, function(element, parent, status)
      return nil, true
    end)
    busted.subscribe({ "failure" }, report)
    busted.subscribe({ "error" }, report)
    handler = base
  end
  busted.subscribe({ "suite", "end" }, function()
    local passed, failed, skipped = 0, 0, 0
    -- handler.successesCount etc. are kept by the base handler
    passed = handler.successesCount or 0
    failed = (handler.failuresCount or 0) + (handler.errorsCount or 0)
    skipped = handler.pendingsCount or 0
    if rank == 0 then
      io.stdout:write(("\n%s: %d passed, %d failed, %d skipped\n"):format(
        os.getenv("FLOW_SPEC_LABEL") or "specs", passed, failed, skipped))
      io.stdout:flush()
    end
    return nil, true
  end)
  return handler
end
