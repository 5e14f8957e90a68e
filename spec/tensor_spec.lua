local flow = require "flow"

describe("tensor basics", function()
  it("adds a scalar to a tensor", function()
    assert.are.same({3, 4}, (flow.tensor({1, 2}) + 2):totable())
  end)
end)
