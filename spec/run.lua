-- Runs busted under flowlua: `flowlua spec/run.lua [-j N] [busted options] [spec files or dirs]`.
-- Debian's busted keeps its Lua files under /usr/share/lua/5.1; they run unchanged on 5.4.
--
-- Given only spec files and folders, on a single rank, the files run in parallel: up to N worker
-- processes at a time (-j N, --jobs=N or FLOW_SPEC_JOBS; default: twice the number of cores, at
-- most 8, since most slow specs wait on the programs they start rather than compute), each a
-- `flowlua spec/run.lua` of its own on a few files, and this process prints each worker's output
-- whole as it ends, then one closing line "<label>: N passed, N failed, N skipped" adding them up
-- (spec/support/summary.lua's line). A worker that ends without its closing line (a crash) or with
-- a failing exit status while reporting no failure (a sanitizer's report) counts as one failure.
-- With busted options (--filter, -o, ...), -j 1, one file, or as a rank of a multi-rank job
-- (mpirun, flowlua --ranks) the specs run here, serially, as busted alone would run them.
package.path = table.concat({
  "./?.lua", "./spec/?.lua",
  "/usr/share/lua/5.4/?.lua", "/usr/share/lua/5.4/?/init.lua",
  "/usr/share/lua/5.1/?.lua", "/usr/share/lua/5.1/?/init.lua",
  package.path }, ";")
package.cpath = "/usr/lib/x86_64-linux-gnu/lua/5.4/?.so;" .. package.cpath

local function cores()
  local p = io.popen("nproc 2>/dev/null")
  local n = p and tonumber(p:read("a"):match("%d+"))
  if p then p:close() end
  return n or 1
end

-- -j N / -jN / --jobs N / --jobs=N are ours; everything else goes to busted
local jobs, rest = tonumber(os.getenv("FLOW_SPEC_JOBS") or ""), {}
do
  local i = 1
  while i <= #arg do
    local a = arg[i]
    local n = a:match("^%-j(%d+)$") or a:match("^%-%-jobs=(%d+)$")
    if n then jobs = tonumber(n)
    elseif a == "-j" or a == "--jobs" then
      jobs = tonumber(arg[i + 1]) or error("spec/run.lua: " .. a .. " needs a number of jobs")
      i = i + 1
    else rest[#rest + 1] = a end
    i = i + 1
  end
end

-- The spec files busted would run for these paths (its defaults: recursive, "_spec" in the name,
-- sorted), or nil when a path is neither a file nor a folder.
local function spec_files(paths)
  local pl_path, pl_dir = require "pl.path", require "pl.dir"
  local files = {}
  for _, root in ipairs(paths) do
    if pl_path.isfile(root) then files[#files + 1] = root
    elseif pl_path.isdir(root) then
      local found = {}
      for _, f in ipairs(pl_dir.getallfiles(root)) do
        if pl_path.basename(f):find("_spec") and not f:find("/%.%w+.%w+", #root) then found[#found + 1] = f end
      end
      table.sort(found)
      for _, f in ipairs(found) do files[#files + 1] = f end
    else return nil end
  end
  return files
end

-- A single process, not a rank of a job (mpirun sets these; flowlua --ranks sets world_size).
local function alone()
  for _, v in ipairs({ "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK" }) do
    if os.getenv(v) then return false end
  end
  return require("flow").world_size() == 1
end

local function parallel_files()
  jobs = jobs or math.min(8, 2 * cores())
  if jobs < 2 then return nil end
  for _, a in ipairs(rest) do if a:sub(1, 1) == "-" then return nil end end
  local files = spec_files(#rest > 0 and rest or { "spec" })
  if not files or #files < 2 or not alone() then return nil end
  return files
end

local files = parallel_files()
if files then
  -- the interpreter this runs under: arg's lowest index
  local lowest = 0
  while arg[lowest - 1] do lowest = lowest - 1 end
  os.exit(require("support.parallel").run(arg[lowest], files, jobs, cores()))
end

local args = { [0] = "busted", "-o", "spec/support/summary.lua" }
for i = 1, #rest do args[#args + 1] = rest[i] end
arg = args
require "busted.runner" ({ standalone = false })
