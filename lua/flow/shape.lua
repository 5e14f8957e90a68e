-- Shape ops composed of flow ops (roll): PyTorch's values, and the gradient from the rules of the
-- ops they are made of (narrow and cat). Installed into the module by init.lua.
return function(flow)
  -- roll(x, shifts, axes): out[.., i, ..] = x[.., (i - s) mod n, ..] along each axis with its shift
  -- (shifts and axes integers or lists of one length); without axes, x is rolled flat and
  -- reshaped back, as torch.roll. Each roll is cat(last s slices, the rest): always a copy.
  flow.roll = flow._named("roll", function(x, shifts, axes)
    local function list(v) return type(v) == "table" and v or {v} end
    if type(shifts) ~= "number" and type(shifts) ~= "table" then
      error(("expected shifts as an integer or a list (got %s)"):format(type(shifts)), 0)
    end
    if axes == nil then
      if #list(shifts) ~= 1 then error("without axes, expected one shift (got " .. #list(shifts) .. ")", 0) end
      return flow.roll(x:reshape({-1}), shifts, 0):reshape(x:shape())
    end
    local s, a = list(shifts), list(axes)
    if #s ~= #a then error(("shifts and axes must have the same length (got %d and %d)"):format(#s, #a), 0) end
    local out = x
    for i = 1, #a do
      local n = out:shape()[(a[i] < 0 and a[i] + #out:shape() or a[i]) + 1]
      if n == nil then error(("axis %d is out of range for a %d-d tensor"):format(a[i], #out:shape()), 0) end
      local k = n > 0 and s[i] % n or 0
      out = flow.cat({out:narrow(a[i], n - k, k), out:narrow(a[i], 0, n - k)}, a[i])
    end
    return out
  end)
end
