-- Helpers for specs that drive scripts/train_gpt.lua in the spec's own process (no interpreter
-- start-up; under mpirun every rank runs it, as the script would run).
local M = {}

-- A small repetitive text: a tiny model learns it within a few steps.
M.TEXT = string.rep("the quick brown fox jumps over the lazy dog. ", 60)

function M.text_file()
  local p = os.tmpname()
  local f = assert(io.open(p, "wb"))
  f:write(M.TEXT)
  f:close()
  return p
end

-- Run the script (scripts/train_gpt.lua unless named) with these flags: its print goes to a
-- buffer and os.exit becomes an error. Returns ok, the output.
function M.run(flags, script)
  local argv, out = {}, {}
  for w in flags:gmatch("%S+") do argv[#argv + 1] = w end
  local env = setmetatable({
    arg = argv,
    print = function(...) out[#out + 1] = table.concat({ ... }, "\t") end,
    os = setmetatable({ exit = function(code) error("exit " .. tostring(code), 0) end }, { __index = os }),
    io = setmetatable({ stderr = { write = function(_, ...) out[#out + 1] = table.concat({ ... }) end } }, { __index = io }),
  }, { __index = _G })
  local ok, err = pcall(assert(loadfile(script or "scripts/train_gpt.lua", "t", env)))
  return ok, table.concat(out, "\n") .. (ok and "" or "\n" .. tostring(err))
end

-- {step = "loss", ...} from the script's progress lines.
function M.losses(out)
  local l = {}
  for step, v in out:gmatch("step%s+(%d+)/%d+ | loss ([%d.]+)") do l[tonumber(step)] = v end
  return l
end

return M
