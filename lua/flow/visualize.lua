-- flow.visualize: pictures of a global tensor's layout. Which rank holds which block of the
-- logical tensor, for 1-D and 2-D meshes, with split (S), broadcast (B) and partial-sum (P)
-- marked: a text grid for the terminal, or an SVG file. flow.visualize_boxing draws a conversion
-- as a before/after pair with the collective that runs it.
local flow = require "flow"

local M = {}

-- The layout to draw: a global tensor, or {placement =, sbp =, shape =}.
local function layout_of(t, fn)
  if flow.is_tensor(t) then
    if not t.is_global then error(fn .. ": expected a global tensor (a local tensor has one block: itself)", 3) end
    return t.placement, t.sbp, t:shape(), t.dtype
  end
  if type(t) == "table" and t.placement and t.sbp and t.shape then return t.placement, t.sbp, t.shape, t.dtype end
  error(fn .. ": expected a global tensor or {placement =, sbp =, shape =}", 3)
end

local function sbp_str(sbp)
  if type(sbp) ~= "table" then return tostring(sbp) end
  local parts = {}
  for i, s in ipairs(sbp) do parts[i] = tostring(s) end
  return "(" .. table.concat(parts, ", ") .. ")"
end

-- The grid of a layout over its first two axes (a 1-D tensor is one row, a 0-d one one cell):
-- cut points per axis, and per cell the ranks holding it.
local function grid(placement, sbp, shape)
  local blocks = flow._layout(placement, sbp, shape)
  local nd = #shape
  local axes = nd >= 2 and { 1, 2 } or nd == 1 and { 1 } or {}
  local cuts = {}
  for a = 1, 2 do
    local ax = axes[a]
    local set, list = { [0] = true }, { 0 }
    local len = ax and shape[ax] or 1
    if not set[len] then set[len] = true; list[#list + 1] = len end
    for _, b in ipairs(blocks) do
      for _, v in ipairs(ax and { b.start[ax], b.start[ax] + b.size[ax] } or {}) do
        if not set[v] then set[v] = true; list[#list + 1] = v end
      end
    end
    table.sort(list)
    cuts[a] = list
  end
  local cells = {}
  for i = 1, #cuts[1] - 1 do
    cells[i] = {}
    for j = 1, #cuts[2] - 1 do
      local holders = {}
      for _, b in ipairs(blocks) do
        local inside = true
        for a = 1, 2 do
          local ax = axes[a]
          if ax then
            local lo, hi = b.start[ax], b.start[ax] + b.size[ax]
            inside = inside and b.size[ax] > 0 and lo <= cuts[a][a == 1 and i or j] and cuts[a][(a == 1 and i or j) + 1] <= hi
          end
        end
        if inside then holders[#holders + 1] = b.rank end
      end
      cells[i][j] = holders
    end
  end
  local partial = blocks[1] and blocks[1].partial
  return { cuts = cuts, cells = cells, partial = partial, axes = axes, nd = nd }
end

local function range(cuts, i) return ("%d:%d"):format(cuts[i], cuts[i + 1]) end

local function cell_text(holders, partial)
  if #holders == 0 then return "-" end
  local parts = {}
  for k, r in ipairs(holders) do parts[k] = "r" .. r .. (partial and "+" or "") end
  return table.concat(parts, " ")
end

-- "0" or "0, 1": the mesh axes whose SBP is partial_sum.
local function partial_axes(sbp)
  local list = type(sbp) == "table" and sbp or { sbp }
  local out = {}
  for i, s in ipairs(list) do if tostring(s) == "P" then out[#out + 1] = tostring(i - 1) end end
  return table.concat(out, ", ")
end

-- The text grid: a header, then one line per row interval.
local function text(placement, sbp, shape, dtype)
  local g = grid(placement, sbp, shape)
  local lines = {}
  lines[1] = ("layout of {%s}%s on %s, sbp %s"):format(table.concat(shape, ","), dtype and (" " .. dtype) or "",
    tostring(placement), sbp_str(sbp))
  if g.nd > 2 then lines[#lines + 1] = ("(axes 0 and 1 shown; axes 2..%d are whole in every block)"):format(g.nd - 1) end
  local head, widths = { g.nd >= 1 and "rows" or "" }, {}
  local colw = 0
  for i = 1, #g.cells do
    for j = 1, #g.cells[i] do colw = math.max(colw, #cell_text(g.cells[i][j], g.partial)) end
  end
  for j = 1, #g.cuts[2] - 1 do
    local h = g.nd >= 2 and ("cols " .. range(g.cuts[2], j)) or ""
    widths[j] = math.max(colw, #h)
    head[#head + 1] = h .. string.rep(" ", widths[j] - #h)
  end
  local roww = 0
  for i = 1, #g.cuts[1] - 1 do roww = math.max(roww, #(g.nd >= 1 and range(g.cuts[1], i) or "")) end
  roww = math.max(roww, 4)
  head[1] = head[1] .. string.rep(" ", roww - #head[1])
  lines[#lines + 1] = table.concat(head, " | ")
  for i = 1, #g.cells do
    local row = { (g.nd >= 1 and range(g.cuts[1], i) or "") }
    row[1] = row[1] .. string.rep(" ", roww - #row[1])
    for j = 1, #g.cells[i] do
      local c = cell_text(g.cells[i][j], g.partial)
      row[#row + 1] = c .. string.rep(" ", widths[j] - #c)
    end
    lines[#lines + 1] = table.concat(row, " | ")
  end
  if g.partial then lines[#lines + 1] = "+ partial sum over mesh axis " .. partial_axes(sbp) .. ": a block's value is the sum of its copies along it" end
  return table.concat(lines, "\n")
end

local palette = { "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5",
                  "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f" }

local function escape(s) return (s:gsub("&", "&amp;"):gsub("<", "&lt;"):gsub(">", "&gt;")) end

-- One panel of rectangles at (x0, y0), w x h; returns its SVG elements.
local function panel(placement, sbp, shape, title, x0, y0, w, h)
  local g = grid(placement, sbp, shape)
  local out = {}
  out[#out + 1] = ('<text x="%d" y="%d" font-family="monospace" font-size="13">%s</text>'):format(x0, y0 - 8, escape(title))
  local n1, n2 = g.cuts[1][#g.cuts[1]], g.cuts[2][#g.cuts[2]]
  local colors, ncolors = {}, 0
  for i = 1, #g.cells do
    for j = 1, #g.cells[i] do
      local key = table.concat(g.cells[i][j], ",")
      if not colors[key] then ncolors = ncolors + 1; colors[key] = palette[(ncolors - 1) % #palette + 1] end
      local x = x0 + w * g.cuts[2][j] / math.max(1, n2)
      local y = y0 + h * g.cuts[1][i] / math.max(1, n1)
      local cw = w * (g.cuts[2][j + 1] - g.cuts[2][j]) / math.max(1, n2)
      local ch = h * (g.cuts[1][i + 1] - g.cuts[1][i]) / math.max(1, n1)
      out[#out + 1] = ('<rect class="block" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="black"%s/>'):format(
        x, y, cw, ch, colors[key], g.partial and ' fill-opacity="0.45" stroke-dasharray="4 2"' or "")
      out[#out + 1] = ('<text class="ranks" x="%.1f" y="%.1f" font-family="monospace" font-size="12" text-anchor="middle">%s</text>'):format(
        x + cw / 2, y + ch / 2 + 4, escape(cell_text(g.cells[i][j], g.partial)))
    end
  end
  return out
end

local function svg_document(width, height, body)
  return ('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d">\n'):format(
    width, height, width, height) .. '<rect width="100%" height="100%" fill="white"/>\n' .. table.concat(body, "\n") ..
    "\n</svg>\n"
end

local function write(path, s)
  local f, err = io.open(path, "w")
  if not f then error("visualize: cannot write " .. tostring(path) .. ": " .. tostring(err), 3) end
  f:write(s)
  f:close()
end

-- flow.visualize(t [, path]): the text grid (printed by the caller), or an SVG written to path.
-- t: a global tensor or {placement =, sbp =, shape =}. Returns the text, or the SVG.
function M.draw(t, path)
  local placement, sbp, shape, dtype = layout_of(t, "visualize")
  if not path then return text(placement, sbp, shape, dtype) end
  local title = ("{%s} on %s, sbp %s"):format(table.concat(shape, ","), tostring(placement), sbp_str(sbp))
  local body = panel(placement, sbp, shape, title, 20, 40, 360, 240)
  local g = grid(placement, sbp, shape)
  if g.partial then
    body[#body + 1] = '<text x="20" y="310" font-family="monospace" font-size="11">dashed, faded: partial sums over mesh axis '
      .. partial_axes(sbp) .. '</text>'
  end
  local s = svg_document(400, 320, body)
  write(path, s)
  return s
end

-- flow.visualize_boxing(t, placement, sbp [, path]): before and after of t:to_global(placement,
-- sbp), with the collective flow.explain reports. Text, or an SVG written to path.
function M.boxing(t, placement, sbp, path)
  local p0, s0, shape, dtype = layout_of(t, "visualize_boxing")
  local how = flow.explain(t, placement, sbp) or ""
  if not path then
    return "before: " .. text(p0, s0, shape, dtype) .. "\nafter:  " .. text(placement, sbp, shape, dtype) .. "\n" .. how
  end
  local body = panel(p0, s0, shape, "before: " .. sbp_str(s0), 20, 40, 320, 220)
  for _, e in ipairs(panel(placement, sbp, shape, "after: " .. sbp_str(sbp), 400, 40, 320, 220)) do body[#body + 1] = e end
  body[#body + 1] = '<text x="350" y="150" font-family="monospace" font-size="20">&#8594;</text>'
  local y = 290
  for line in how:gmatch("[^\n]+") do
    body[#body + 1] = ('<text class="explain" x="20" y="%d" font-family="monospace" font-size="11">%s</text>'):format(y, escape(line))
    y = y + 14
  end
  local s = svg_document(740, y + 10, body)
  write(path, s)
  return s
end

return M
