-- The README's example must run as printed and train: its printed losses must fall.
local flow = require "flow"

describe("the README example", function()
  it("runs as printed and its loss falls", function()
    local f = assert(io.open("README.md"))
    local text = f:read("a")
    f:close()
    local code = assert(text:match("```lua\n(.-)```"), "README has a ```lua block")
    local losses = {}
    local env = setmetatable({ print = function(step, loss) losses[#losses + 1] = loss end },
                             { __index = _G })
    assert(load(code, "=README.md", "t", env))()
    assert.are.equal(5, #losses)
    assert.is_true(losses[5] < losses[1])
    assert.is_true(losses[5] < 0.1)
  end)
end)
