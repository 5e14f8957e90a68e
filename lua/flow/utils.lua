-- Small helpers for scripts: command-line flags and human-readable times.
local flow = require "flow"

local utils = {}

-- Flags: parse_args(arg, spec) with spec = {name = default, ...}; "--name value" or
-- "--name=value"; dashes in names map to underscores ("--min-lr" sets min_lr). The value is
-- converted to the default's type (a boolean default makes a switch: "--name" alone sets it); a
-- flag not in spec is an error that lists the known ones.
function utils.parse_args(argv, spec)
  local out = {}
  for k, v in pairs(spec) do out[k] = v end
  local function known()
    local names = {}
    for k in pairs(spec) do names[#names + 1] = "--" .. k:gsub("_", "-") end
    table.sort(names)
    return table.concat(names, " ")
  end
  local i = 1
  while i <= #argv do
    local a = argv[i]
    local name, value = a:match("^%-%-([%w%-_]+)=(.*)$")
    if not name then
      name = a:match("^%-%-([%w%-_]+)$")
      if not name then error(("unexpected argument '%s' (flags: %s)"):format(a, known()), 0) end
      if type(spec[(name:gsub("%-", "_"))]) == "boolean" then value = "true" -- a switch takes no value
      else
        i = i + 1
        value = argv[i]
      end
    end
    local key = name:gsub("%-", "_")
    local def = spec[key]
    if def == nil then error(("unknown flag --%s (flags: %s)"):format(name, known()), 0) end
    if value == nil then error(("flag --%s needs a value"):format(name), 0) end
    if type(def) == "boolean" then
      if value ~= "true" and value ~= "false" then error(("flag --%s is a switch: true or false (got '%s')"):format(name, value), 0) end
      out[key] = value == "true"
    elseif type(def) == "number" then
      local n = tonumber(value)
      if not n then error(("flag --%s needs a number (got '%s')"):format(name, value), 0) end
      if math.type(def) == "integer" then
        n = math.tointeger(n)
        if not n then error(("flag --%s needs an integer (got '%s')"):format(name, value), 0) end
      end
      out[key] = n
    else
      out[key] = value
    end
    i = i + 1
  end
  return out
end

-- "1h02m", "3m05s", "12.3s"
function utils.format_seconds(s)
  if s ~= s or s == math.huge then return "?" end
  if s >= 3600 then return ("%dh%02dm"):format(s // 3600, (s % 3600) // 60) end
  if s >= 60 then return ("%dm%02ds"):format(s // 60, math.floor(s % 60)) end
  return ("%.1fs"):format(s)
end

-- Seconds on a monotonic clock.
function utils.now()
  return flow.now and flow.now() or os.clock()
end

return utils
