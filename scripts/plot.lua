-- Draws the loss curves of a train_gpt.lua --log FILE.jsonl as an SVG: train loss per step and
-- validation loss per evaluation on shared axes.  flowlua scripts/plot.lua FILE.jsonl OUT.svg
-- (plain lua5.4 runs it too: it needs no flow).

local W, H = 720, 420
local MARGIN = { left = 64, right = 120, top = 36, bottom = 48 }

local function fail(msg)
  io.stderr:write("plot: ", msg, "\n")
  os.exit(2)
end

-------------------------------------------------------------------------------- reading

-- One line of the log: a flat JSON object whose values are numbers or null (train_gpt writes
-- nothing else). Returns a table of the numeric fields, or nil and why.
local function parse_line(line)
  local body = line:match("^%s*{(.*)}%s*$")
  if not body then return nil, "not a JSON object" end
  local t = {}
  for item in body:gmatch("[^,]+") do
    local k, v = item:match('^%s*"([%w_]+)"%s*:%s*(%S+)%s*$')
    if not k then return nil, ("unexpected field '%s'"):format(item) end
    if v ~= "null" then
      t[k] = tonumber(v)
      if not t[k] then return nil, ("field %s is not a number: %s"):format(k, v) end
    end
  end
  return t
end

-- The train points {step, loss} and the val points {step, val_loss} of a log, in file order.
local function read_log(path)
  local f, err = io.open(path, "r")
  if not f then fail(err) end
  local train, val = {}, {}
  local n = 0
  for line in f:lines() do
    n = n + 1
    if line:match("%S") then
      local t, why = parse_line(line)
      if not t then fail(("%s:%d: %s"):format(path, n, why)) end
      if t.step and t.loss then train[#train + 1] = { t.step, t.loss } end
      if t.step and t.val_loss then val[#val + 1] = { t.step, t.val_loss } end
    end
  end
  f:close()
  return train, val
end

-------------------------------------------------------------------------------- drawing

-- A "nice" tick spacing (1, 2 or 5 times a power of ten) giving about `count` ticks over span.
local function tick_step(span, count)
  local raw = span / count
  local p = 10 ^ math.floor(math.log(raw, 10))
  for _, m in ipairs({ 1, 2, 5, 10 }) do
    if m * p >= raw then return m * p end
  end
  return 10 * p
end

local function fmt(v)
  return (("%.4g"):format(v))
end

local function svg(train, val, title)
  local xmin, xmax, ymin, ymax = math.huge, -math.huge, math.huge, -math.huge
  for _, pts in ipairs({ train, val }) do
    for _, p in ipairs(pts) do
      xmin, xmax = math.min(xmin, p[1]), math.max(xmax, p[1])
      ymin, ymax = math.min(ymin, p[2]), math.max(ymax, p[2])
    end
  end
  if xmax == xmin then xmin, xmax = xmin - 1, xmax + 1 end
  if ymax == ymin then ymin, ymax = ymin - 1, ymax + 1 end
  local pw, ph = W - MARGIN.left - MARGIN.right, H - MARGIN.top - MARGIN.bottom
  local function X(v) return MARGIN.left + (v - xmin) / (xmax - xmin) * pw end
  local function Y(v) return MARGIN.top + (ymax - v) / (ymax - ymin) * ph end

  local out = {}
  local function add(s, ...) out[#out + 1] = s:format(...) end
  add('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">', W, H, W, H)
  add('<rect width="%d" height="%d" fill="white"/>', W, H)
  add('<text x="%d" y="20" font-size="14">%s</text>', MARGIN.left, title)
  -- grid and tick labels
  local ys = tick_step(ymax - ymin, 6)
  for v = math.ceil(ymin / ys) * ys, ymax + ys * 1e-9, ys do
    add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>', X(xmin), Y(v), X(xmax), Y(v))
    add('<text x="%.1f" y="%.1f" text-anchor="end">%s</text>', X(xmin) - 6, Y(v) + 4, fmt(v))
  end
  local xs = tick_step(xmax - xmin, 8)
  for v = math.ceil(xmin / xs) * xs, xmax + xs * 1e-9, xs do
    add('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>', X(v), Y(ymin), X(v), Y(ymax))
    add('<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>', X(v), Y(ymin) + 18, fmt(v))
  end
  add('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>', MARGIN.left, MARGIN.top, pw, ph)
  add('<text x="%.1f" y="%d" text-anchor="middle">step</text>', MARGIN.left + pw / 2, H - 8)
  add('<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">loss</text>', MARGIN.top + ph / 2, MARGIN.top + ph / 2)
  -- one path per curve, then its legend entry
  local curves = { { "train", train, "#1f77b4" }, { "val", val, "#d62728" } }
  local row = 0
  for _, c in ipairs(curves) do
    local name, pts, color = c[1], c[2], c[3]
    if #pts > 0 then
      local d = {}
      for i, p in ipairs(pts) do d[i] = ("%s%.2f %.2f"):format(i == 1 and "M" or "L", X(p[1]), Y(p[2])) end
      add('<path id="%s" d="%s" fill="none" stroke="%s" stroke-width="1.5"/>', name, table.concat(d, " "), color)
      if #pts == 1 or name == "val" then
        for _, p in ipairs(pts) do add('<circle cx="%.2f" cy="%.2f" r="3" fill="%s"/>', X(p[1]), Y(p[2]), color) end
      end
      local ly = MARGIN.top + 12 + row * 18
      add('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>', W - MARGIN.right + 12, ly, W - MARGIN.right + 36, ly, color)
      add('<text x="%d" y="%d">%s</text>', W - MARGIN.right + 42, ly + 4, name)
      row = row + 1
    end
  end
  add("</svg>")
  return table.concat(out, "\n") .. "\n"
end

-------------------------------------------------------------------------------- main

if #arg ~= 2 then fail("usage: plot.lua FILE.jsonl OUT.svg (a train_gpt.lua --log file)") end
local train, val = read_log(arg[1])
if #train == 0 and #val == 0 then fail(("%s has no step with a loss or val_loss"):format(arg[1])) end
local title = arg[1]:match("[^/]*$"):gsub("[&<>]", { ["&"] = "&amp;", ["<"] = "&lt;", [">"] = "&gt;" })
local f, err = io.open(arg[2], "w")
if not f then fail(err) end
f:write(svg(train, val, title))
f:close()
print(("plot: %s: %d train and %d val points"):format(arg[2], #train, #val))
