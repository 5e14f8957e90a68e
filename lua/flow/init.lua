-- The pure-Lua half of the flow module: runs once when the C module opens, with the module
-- table as its argument. Submodules load lazily on first use (flow.nn, flow.optim, ...).
local flow = ...

local lazy = { nn = "flow.nn", optim = "flow.optim", utils = "flow.utils", data = "flow.data", gpt = "flow.gpt" }
setmetatable(flow, {
  __index = function(t, k)
    local mod = lazy[k]
    if mod and package.preload[mod] then
      local v = require(mod)
      rawset(t, k, v)
      return v
    end
  end,
})

-- f as the function `name`: an error raised inside it (by an op it calls, or by Lua on a bad
-- argument) is raised again naming `name`, as the C bindings name theirs.
function flow._named(name, f)
  if type(name) ~= "string" or type(f) ~= "function" then
    error(("_named: expected a name and a function (got %s, %s)"):format(type(name), type(f)), 2)
  end
  local prefix = name .. ":"
  local function pass(ok, ...)
    if ok then return ... end
    local msg = ...
    if type(msg) ~= "string" then error(msg, 0) end
    msg = msg:gsub("^[^:\n]*%.lua:%d+: ", "")
    if msg:sub(1, #prefix) ~= prefix then msg = name .. ": " .. msg end
    error(msg, 0)
  end
  return function(...) return pass(pcall(f, ...)) end
end

require("flow.reductions")(flow)
require("flow.shape")(flow)

-- Pictures of global layouts (lua/flow/visualize.lua), loaded on first use.
function flow.visualize(t, path) return require("flow.visualize").draw(t, path) end
function flow.visualize_boxing(t, placement, sbp, path) return require("flow.visualize").boxing(t, placement, sbp, path) end

return flow
