local flow = require "flow"

describe("tensor basics", function()
  it("adds a scalar to a tensor", function()
    assert.are.same({3, 4}, (flow.tensor({1, 2}) + 2):totable())
  end)
end)

describe("tensor fields", function()
  it("t.grad takes a tensor of the tensor's shape, or nil", function()
    local t = flow.ones({2})
    local ok, err = pcall(function() t.grad = flow.ones({4}) end)
    assert.is_false(ok)
    assert.matches("grad: a gradient of shape {4} for a tensor of shape {2}", err)
    t.grad = flow.full({2}, 3)
    assert.are.same({3, 3}, t.grad:totable())
    t.grad = nil
    assert.is_nil(t.grad)
  end)
end)
