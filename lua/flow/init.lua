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

-- Pictures of global layouts (lua/flow/visualize.lua), loaded on first use.
function flow.visualize(t, path) return require("flow.visualize").draw(t, path) end
function flow.visualize_boxing(t, placement, sbp, path) return require("flow.visualize").boxing(t, placement, sbp, path) end

return flow
