-- Tensors as text, PyTorch style: values with a common width (4 decimals for floats, scientific
-- notation when magnitudes call for it), rows on their own lines, "..." where a large tensor is
-- summarised, then shape, dtype and autograd state. Called through tostring(t) / print(t).
local M = {}

local defaults = { precision = 4, threshold = 1000, edgeitems = 3, sci_mode = "auto" }
local options = {}
for k, v in pairs(defaults) do options[k] = v end

-- set_printoptions{precision =, threshold =, edgeitems =, sci_mode = true|false|"auto",
-- profile = "default" (every option back to its default)}
function M.set_options(opts)
  if opts.profile == "default" then
    for k, v in pairs(defaults) do options[k] = v end
  end
  for k, v in pairs(opts) do
    if k ~= "profile" then
      if defaults[k] == nil then
        error("set_printoptions: unknown option '" .. tostring(k) .. "' (precision, threshold, edgeitems, sci_mode, profile)", 2)
      end
      options[k] = v
    end
  end
end

local ELLIPSIS = "..."

local function leaves(data, out)
  if type(data) ~= "table" then
    if data ~= ELLIPSIS then out[#out + 1] = data end
    return out
  end
  for _, v in ipairs(data) do leaves(v, out) end
  return out
end

-- The element formatter for one tensor: decides fixed or scientific notation from all values
-- shown (as PyTorch: scientific when the finite non-zero magnitudes span more than 1000x, or
-- exceed 1e8, or fall below 1e-4).
local function formatter(dtype, values)
  if dtype == "bool" then return tostring end
  if dtype ~= "float32" and dtype ~= "float64" and dtype ~= "float16" and dtype ~= "bfloat16" then
    return function(v) return string.format("%d", v) end
  end
  local lo, hi = math.huge, 0
  for _, v in ipairs(values) do
    local a = math.abs(v)
    if a == a and a ~= math.huge and a ~= 0 then
      if a < lo then lo = a end
      if a > hi then hi = a end
    end
  end
  local sci = options.sci_mode
  if sci == "auto" then sci = hi > 0 and (hi / lo > 1000 or hi > 1e8 or lo < 1e-4) end
  local fmt = "%." .. options.precision .. (sci and "e" or "f")
  return function(v)
    if v ~= v then return "nan" end
    if v == math.huge then return "inf" end
    if v == -math.huge then return "-inf" end
    return string.format(fmt, v)
  end
end

-- Lay out nested lists: the innermost axis on one line, each outer axis one line per entry
-- (a blank line between blocks of 3-d and up), continuation lines indented under the bracket.
local function layout(data, depth, ndim, indent, cell)
  if depth == ndim then return cell(data) end
  local parts = {}
  for i, v in ipairs(data) do
    if v == ELLIPSIS then parts[i] = ELLIPSIS
    else parts[i] = layout(v, depth + 1, ndim, indent + 1, cell) end
  end
  if depth == ndim - 1 then return "[" .. table.concat(parts, ", ") .. "]" end
  local sep = "," .. string.rep("\n", ndim - depth - 1) .. string.rep(" ", indent + 1)
  return "[" .. table.concat(parts, sep) .. "]"
end

local function suffix(t, shape, grad_fn, global)
  local s = { "shape={" .. table.concat(shape, ",") .. "}", "dtype=" .. t.dtype }
  if global then
    s[#s + 1] = "placement=" .. global.placement
    s[#s + 1] = "sbp=" .. global.sbp
  elseif t.device ~= "cpu" then
    s[#s + 1] = "device=" .. t.device
  end
  if grad_fn then
    s[#s + 1] = "grad_fn=<" .. grad_fn .. ">"
  elseif (global or t).requires_grad then
    s[#s + 1] = "requires_grad=true"
  end
  return table.concat(s, ", ")
end

-- format(t, summarize, grad_fn, global): summarize(t, edgeitems, threshold) returns the shown
-- values as nested lists (a plain value for a 0-d tensor), with "..." standing for elided entries;
-- grad_fn names the op that made t (nil for a leaf). For a global tensor, t holds its gathered
-- values and global = {placement =, sbp =, requires_grad =} describes it.
function M.format(t, summarize, grad_fn, global)
  local shape = t:shape()
  local head = "tensor("
  local numel = 1
  for _, n in ipairs(shape) do numel = numel * n end
  local body
  if numel == 0 then
    body = "[]"
  else
    local data = summarize(t, options.edgeitems, options.threshold)
    local fmt = formatter(t.dtype, leaves(data, {}))
    local width = 0
    for _, v in ipairs(leaves(data, {})) do width = math.max(width, #fmt(v)) end
    local function cell(v)
      if v == ELLIPSIS then return v end
      local s = fmt(v)
      return string.rep(" ", width - #s) .. s
    end
    body = layout(data, 0, #shape, #head, cell)
  end
  return head .. body .. ", " .. suffix(t, shape, grad_fn, global) .. ")"
end

return M
