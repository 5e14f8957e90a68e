-- Reductions composed of flow ops (logsumexp, std, any, all): PyTorch's numbers, and the gradient
-- from the rules of the ops they are made of. Installed into the module by init.lua.
return function(flow)
  -- axes as flow.sum takes them: nil (all), an integer or a list; as a list, 0-based and sorted
  -- from the last, so squeezing one does not move the next
  local function axis_list(x, axes)
    local n, list = #x:shape(), {}
    if axes == nil then
      for a = 0, n - 1 do list[#list + 1] = a end
    elseif type(axes) == "table" then
      for _, a in ipairs(axes) do list[#list + 1] = a < 0 and a + n or a end
    else
      list[1] = axes < 0 and axes + n or axes
    end
    table.sort(list, function(a, b) return a > b end)
    return list
  end

  -- logsumexp(x, axes, keepdim) = m + log(sum(exp(x - m))) with m the max over the axes, held
  -- constant (the value does not depend on it, so the gradient is softmax(x) either way) and 0
  -- where it is infinite, as torch.logsumexp: all -inf gives -inf, a +inf gives +inf.
  flow.logsumexp = flow._named("logsumexp", function(x, axes, keepdim)
    local list = axis_list(x, axes)
    local m = flow.no_grad(function()
      local m = x:detach()
      for _, a in ipairs(list) do m = (flow.max(m, a, true)) end
      return flow.masked_fill(m, flow.eq(flow.abs(m), math.huge), 0)
    end)
    local out = flow.log(flow.sum(flow.exp(x - m), list, true)) + m
    if keepdim then return out end
    return flow.squeeze(out, list)
  end)

  -- std(x, axes, keepdim, unbiased = true) = sqrt(var(x, axes, keepdim, unbiased))
  flow.std = flow._named("std", function(x, axes, keepdim, unbiased)
    return flow.sqrt(flow.var(x, axes, keepdim, unbiased))
  end)

  -- any: some element is nonzero (NaN counts as nonzero); all: none is zero. Bool, no gradient.
  flow.any = flow._named("any", function(x, axes, keepdim)
    return flow.gt(flow.sum(flow.ne(x, 0):long(), axes, keepdim), 0)
  end)
  flow.all = flow._named("all", function(x, axes, keepdim)
    return flow.eq(flow.sum(flow.eq(x, 0):long(), axes, keepdim), 0)
  end)
end
