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

describe("t.shape", function()
  it("is the shape as a field (indexable, with a length, printing as {2, 3}) and t:shape() still works", function()
    local x = flow.zeros({ 2, 3 })
    assert.equal(3, x.shape[2])
    assert.equal(2, #x.shape)
    assert.equal("{2, 3}", tostring(x.shape))
    local s = x:shape()
    assert.are.same({ 2, 3 }, s)
    assert.is_nil(getmetatable(s)) -- a plain list, the caller's to change
    s[1] = 9
    assert.equal(2, x.shape[1])
    assert.equal("{}", tostring(flow.tensor(1.5).shape))
  end)
end)
