-- Shape ops composed of flow ops (roll, unbind, repeat/tile, masked_select): PyTorch's values, and
-- the gradient from the rules of the ops they are made of (narrow, cat, select, expand, sort,
-- index_select). Installed into the module by init.lua.
return function(flow)
  local function list(v) return type(v) == "table" and v or {v} end

  -- The shape a and b broadcast to (PyTorch's rule), or an error naming both.
  local function broadcast_shape(a, b)
    local n, out = math.max(#a, #b), {}
    for i = 1, n do
      local x, y = a[i - n + #a] or 1, b[i - n + #b] or 1
      if x ~= y and x ~= 1 and y ~= 1 then
        error(("shapes {%s} and {%s} do not broadcast"):format(table.concat(a, ","), table.concat(b, ",")), 0)
      end
      out[i] = x == 1 and y or x
    end
    return out
  end

  -- roll(x, shifts, axes): out[.., i, ..] = x[.., (i - s) mod n, ..] along each axis with its shift
  -- (shifts and axes integers or lists of one length); without axes, x is rolled flat and
  -- reshaped back, as torch.roll. Each roll is cat(last s slices, the rest): always a copy.
  flow.roll = flow._named("roll", function(x, shifts, axes)
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

  -- unbind(x, axis = 0): the slices along axis as a list (views), axis removed, as torch.unbind
  flow.unbind = flow._named("unbind", function(x, axis)
    axis = axis or 0
    local nd = #x:shape()
    if nd == 0 then error("cannot unbind a 0-d tensor", 0) end
    local ax = axis < 0 and axis + nd or axis
    if ax < 0 or ax >= nd then error(("axis %d is out of range for a %d-d tensor"):format(axis, nd), 0) end
    local out = {}
    for i = 0, x:shape()[ax + 1] - 1 do out[i + 1] = x:select(ax, i) end
    return out
  end)

  -- repeat(x, reps): Tensor.repeat, x tiled reps[i] times along axis i (reps a list or integers,
  -- at least one per axis of x; extra ones add leading axes). x seen as [1, n0, 1, n1, ...],
  -- expanded to [r0, n0, r1, n1, ...] and reshaped to [r0 n0, r1 n1, ...]: a copy whose gradient
  -- is expand's (the sum over the copies). flow["repeat"]: `repeat` is a Lua keyword.
  local function tile(x, reps)
    local shape = x:shape()
    local lead = #reps - #shape
    local view, big, out = {}, {}, {}
    for i, r in ipairs(reps) do
      if math.type(r) ~= "integer" or r < 0 then
        error(("repeats must be non-negative integers (got %s at %d)"):format(tostring(r), i), 0)
      end
      local n = shape[i - lead] or 1
      view[#view + 1], view[#view + 2] = 1, n
      big[#big + 1], big[#big + 2] = r, n
      out[i] = r * n
    end
    return x:reshape(view):expand(big):reshape(out)
  end
  flow["repeat"] = flow._named("repeat", function(x, reps, ...)
    reps = type(reps) == "table" and reps or {reps, ...}
    if #reps < #x:shape() then
      error(("the number of repeats (%d) must be at least the number of axes of the tensor (%d)")
        :format(#reps, #x:shape()), 0)
    end
    return tile(x, reps)
  end)

  -- tile(x, reps): torch.tile, repeat with reps padded with leading 1s to x's rank
  flow.tile = flow._named("tile", function(x, reps, ...)
    reps = type(reps) == "table" and {table.unpack(reps)} or {reps, ...}
    while #reps < #x:shape() do table.insert(reps, 1, 1) end
    return tile(x, reps)
  end)

  -- masked_select(x, mask): the elements of x where the bool mask is true (x and mask broadcast
  -- together), flat, in order. Their positions are the first sum(mask) of a stable descending
  -- argsort of the mask; the gradient goes back through index_select.
  flow.masked_select = flow._named("masked_select", function(x, mask)
    if mask.dtype ~= "bool" then
      error(("mask must be a bool tensor (got %s; make one with a comparison or :bool())"):format(mask.dtype), 0)
    end
    local shape = broadcast_shape(x:shape(), mask:shape())
    local m = mask:expand(shape):reshape({-1})
    local n = flow.sum(m):item()
    local at = flow.argsort(m, 0, true):narrow(0, 0, n)
    return x:expand(shape):reshape({-1}):index_select(0, at)
  end)
end
