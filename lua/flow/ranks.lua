-- flow.run_ranks(n, fn, ...): fn(...) on every rank of a fresh `flowlua --ranks n` job started
-- from this process, for specs and experiments in a one-rank session. A job of its own, not forks
-- of this process: the ranks start with nothing of this one's state (placements, caches, RNG),
-- exactly as under mpirun. fn travels as bytecode: its upvalues may be the flow module, _ENV (the
-- rank's globals) or plain values (nil, booleans, numbers, strings), copied, as its arguments
-- are. Returns when every rank returned; otherwise raises with the job's error output, which
-- names the failing rank.
local flow = require "flow"

local M = {}

local function literal(v, what)
  local t = type(v)
  if t == "nil" or t == "boolean" or t == "number" or t == "string" then return ("%q"):format(v) end
  error(("run_ranks: %s is a %s; only flow, _ENV, nil, booleans, numbers and strings reach the ranks")
    :format(what, t), 4)
end

local function quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The script each rank runs: fn loaded from its bytecode, its upvalues set, called with the arguments.
local function script(fn, ...)
  local lines = { 'local flow = require "flow"',
                  ("local fn = assert(load(%q, nil, 'b'))"):format(string.dump(fn)) }
  for i = 1, math.huge do
    local name, v = debug.getupvalue(fn, i)
    if not name then break end
    local value = v == flow and "flow" or name == "_ENV" and "_ENV" or literal(v, "upvalue '" .. name .. "'")
    lines[#lines + 1] = ("debug.setupvalue(fn, %d, %s)"):format(i, value)
  end
  local args = {}
  for i = 1, select("#", ...) do args[i] = literal((select(i, ...)), "argument " .. i) end
  lines[#lines + 1] = ("fn(%s)"):format(table.concat(args, ", "))
  return table.concat(lines, "\n") .. "\n"
end

function M.run(n, fn, ...)
  if math.type(n) ~= "integer" or n < 1 then
    error(("run_ranks: the number of ranks must be a positive integer (got %s)"):format(tostring(n)), 3)
  end
  if type(fn) ~= "function" then error(("run_ranks: expected a function (got %s)"):format(type(fn)), 3) end
  local program = os.getenv("FLOW_BIN") or flow._program()
  if not program:find("flowlua[^/]*$") then
    error(("run_ranks: needs the flowlua program to start the ranks (this is %s): set FLOW_BIN"):format(program), 3)
  end
  local path, err = os.tmpname(), os.tmpname()
  local f = assert(io.open(path, "wb"))
  f:write(script(fn, ...))
  f:close()
  io.stdout:flush()
  local ok = os.execute(("%s --ranks %d %s 2>%s"):format(quote(program), n, quote(path), quote(err)))
  os.remove(path)
  f = io.open(err)
  local out = f and f:read("a") or ""
  if f then f:close() end
  os.remove(err)
  if ok then
    io.stderr:write(out)
    return
  end
  local kept = {} -- the messages, without their tracebacks
  local trace = false
  for line in out:gmatch("[^\n]+") do
    if line == "stack traceback:" then trace = true
    elseif not line:find("^%s") then trace = false end
    if not trace then kept[#kept + 1] = line end
  end
  error("run_ranks: " .. (#kept > 0 and table.concat(kept, "\n") or "the job failed"), 3)
end

return M
