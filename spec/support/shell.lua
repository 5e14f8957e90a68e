-- Helpers for specs that run programs: quoting, a command's output and exit code, and the
-- environment a child flowlua needs to start on its own.
local M = {}

function M.quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

function M.has(cmd) return os.execute("command -v " .. cmd .. " >/dev/null 2>&1") == true end

-- The runner may itself be an MPI process: its OMPI_/PMIX_/PMI_ variables would make a child
-- join (or a nested mpirun refuse) that world. Under AddressSanitizer children skip the exit-time
-- leak check (MPI's unloaded plugins leave allocations the suppressions cannot name).
local clean = "for v in $(env | sed -n 's/^\\(OMPI_[^=]*\\|PMIX_[^=]*\\|PMI_[^=]*\\)=.*/\\1/p'); do unset $v; done; "
  .. "export ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0; "

-- A flowlua script file holding `local flow = require "flow"` and then text; its path.
function M.script(text)
  local f = os.tmpname()
  local h = assert(io.open(f, "w"))
  h:write('local flow = require "flow"\n', text)
  h:close()
  return f
end

-- Run a shell command line; returns its output (stdout, then stderr), its exit code and the
-- seconds it took.
function M.timed(cmd)
  local now = require("flow").now
  local t0 = now()
  local out, err, code = M.run(cmd)
  return out .. err, code, now() - t0
end

-- Run a shell command line; returns its stdout, its stderr and its exit code.
function M.run(cmd)
  local err = os.tmpname()
  local p = assert(io.popen(clean .. "{ " .. cmd .. "\n} 2>" .. err))
  local out = p:read("a")
  local _, _, code = p:close()
  local f = assert(io.open(err))
  local e = f:read("a")
  f:close()
  os.remove(err)
  return out, e, code
end

-- A fresh temporary folder's path.
function M.tmpdir()
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. M.quote(dir)))
  return dir
end

return M
