-- spec/run.lua's parallel runner: spec files run in worker processes, `jobs` at a time, each
-- worker a `flowlua spec/run.lua` (serial: FLOW_SPEC_JOBS=1) on a few files with its output in a
-- file of its own; each worker's output is printed whole when it ends (never interleaved), then
-- one closing line adding the workers' closing lines up, as spec/support/summary.lua prints it.
local M = {}

-- Seconds a file takes on its own (scripts/bench/spec-times.sh), for the ones that take long:
-- they start first and alone, and the others share workers in bundles of about a second.
local known = {
  ["spec/train_cnn_spec.lua"] = 4, ["spec/ranks_transport_spec.lua"] = 4.5, ["spec/cli_spec.lua"] = 4.5,
  ["spec/ranks_spec.lua"] = 4, ["spec/failure_job_spec.lua"] = 4, ["spec/repl_mpi_spec.lua"] = 4,
  ["spec/conformance_spec.lua"] = 3, ["spec/reference_spec.lua"] = 2.5, ["spec/print_spec.lua"] = 1.6,
  ["spec/startup_spec.lua"] = 1.6, ["spec/threads_spec.lua"] = 1.6, ["spec/train_spec.lua"] = 1.3,
  ["spec/repl_spec.lua"] = 1.2, ["spec/actor_spec.lua"] = 1, ["spec/fuzz_spec.lua"] = 0.8,
}
local bundle_s, other_s = 1.2, 0.2

local sh = require "support.shell"
local quote = sh.quote

-- The files in tasks (lists of files), the slowest first.
local function plan(files)
  local tasks, open = {}, nil
  for _, f in ipairs(files) do
    local s = known[f:gsub("^%./", "")] or other_s
    if s >= bundle_s then
      tasks[#tasks + 1] = { s = s, f }
    else
      if not open or open.s + s > bundle_s then
        open = { s = 0 }
        tasks[#tasks + 1] = open
      end
      open[#open + 1], open.s = f, open.s + s
    end
  end
  table.sort(tasks, function(a, b) return a.s > b.s end)
  return tasks
end

local marker = "flow-spec-worker"

-- Run the files; returns the exit status (0: every spec passed). The workers share the cores as
-- flowlua --ranks's ranks do (core/comm_launch.c): unless the user chose, each one's OpenMP team
-- gets its share of them (at least 1), instead of every worker's team spinning on every core.
-- (spec/threads_spec.lua sets its own thread counts.)
function M.run(bin, files, jobs, cores)
  local dir = sh.tmpdir()
  local tasks = plan(files)
  local threads = ""
  if not os.getenv("FLOW_NUM_THREADS") and not os.getenv("OMP_NUM_THREADS") then
    threads = ("FLOW_NUM_THREADS=%d "):format(math.max(1, cores // math.min(jobs, #tasks)))
  end
  -- task i's shell script, $dir/i.sh
  local function write(i, t)
    local h = assert(io.open(("%s/%d.sh"):format(dir, i), "w"))
    local quoted = {}
    for j, f in ipairs(t) do quoted[j] = quote(f) end
    h:write(("FLOW_SPEC_JOBS=1 FLOW_SPEC_LABEL=%s %sexec %s spec/run.lua %s\n"):format(marker, threads, quote(bin),
      table.concat(quoted, " ")))
    h:close()
  end
  for i, t in ipairs(tasks) do write(i, t) end
  -- each task, when it ends, writes one short line (atomic on the pipe): index, status, ns, ns
  -- (and its CPU time in $dir/i.times: the shell's `times`, without a fork)
  local task = 's=$(date +%s%N); sh "$0/$1.sh" >"$0/$1.out" 2>&1 </dev/null; rc=$?; times >"$0/$1.times"; '
    .. 'echo "$1 $rc $s $(date +%s%N)"'
  local t0 = require("flow").now()
  local p = assert(io.popen(("seq 1 %d | xargs -P %d -n 1 sh -c %s %s"):format(#tasks, jobs, quote(task), quote(dir))))
  local passed, failed, skipped, bad, done, again = 0, 0, 0, {}, 0, {}
  -- print a task's output whole, add its counts up
  local function report(i, t, rc, seconds)
    local h = io.open(("%s/%d.out"):format(dir, i))
    local out = h and h:read("a") or ""
    if h then h:close() end
    local counts
    out = out:gsub("\n?" .. marker:gsub("%p", "%%%0") .. ": (%d+) passed, (%d+) failed, (%d+) skipped\n", function(np, nf, ns)
      counts = { tonumber(np), tonumber(nf), tonumber(ns) }
      return ""
    end)
    local names, cpu = table.concat(t, " "), ""
    h = io.open(("%s/%d.times"):format(dir, i))
    if h then
      local um, us, sm, ss = h:read("a"):match("\n(%d+)m([%d.]+)s (%d+)m([%d.]+)s")
      if um then cpu = (", %.1f s CPU"):format(60 * (um + sm) + us + ss) end
      h:close()
    end
    io.stdout:write(("== %s (%.1f s%s)\n%s%s"):format(names, seconds, cpu, out, out:sub(-1) == "\n" and "" or "\n"))
    if not counts and #t > 1 then
      -- a crash in a bundle: its files again one by one, to say which one
      io.stdout:write(("(exit %d before the closing line: these files run again one at a time)\n"):format(rc))
      for _, f in ipairs(t) do again[#again + 1] = { f } end
    elseif not counts then
      failed = failed + 1
      bad[#bad + 1] = ("%s: exit %d before its closing line"):format(names, rc)
    else
      passed, failed, skipped = passed + counts[1], failed + counts[2], skipped + counts[3]
      if counts[2] > 0 then
        bad[#bad + 1] = ("%s: %d failed"):format(names, counts[2])
      elseif rc ~= 0 then
        failed = failed + 1
        bad[#bad + 1] = ("%s: no spec failed, but exit %d"):format(names, rc)
      end
    end
    io.stdout:flush()
  end
  for line in p:lines() do
    local i, rc, s, e = line:match("^(%d+) (%d+) (%d+) (%d+)$")
    if i then
      done = done + 1
      report(tonumber(i), tasks[tonumber(i)], tonumber(rc), (tonumber(e) - tonumber(s)) * 1e-9)
    end
  end
  p:close()
  for k, t in ipairs(again) do
    local i, started = #tasks + k, require("flow").now()
    write(i, t)
    local _, _, rc = os.execute(('sh %s/%d.sh >%s/%d.out 2>&1 </dev/null'):format(quote(dir), i, quote(dir), i))
    report(i, t, rc, require("flow").now() - started)
  end
  os.execute("rm -rf " .. quote(dir))
  if done < #tasks then
    failed = failed + 1
    bad[#bad + 1] = ("%d of %d workers did not report"):format(#tasks - done, #tasks)
  end
  io.stdout:write(("\n%d spec files in %d workers, %d at a time: %.1f s\n"):format(#files, #tasks, math.min(jobs, #tasks),
    require("flow").now() - t0))
  for _, b in ipairs(bad) do io.stdout:write("FAILED ", b, "\n") end
  io.stdout:write(("\n%s: %d passed, %d failed, %d skipped\n"):format(os.getenv("FLOW_SPEC_LABEL") or "specs",
    passed, failed, skipped))
  io.stdout:flush()
  return failed == 0 and 0 or 1
end

return M
