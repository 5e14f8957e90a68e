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

require("flow.reductions")(flow)

return flow
