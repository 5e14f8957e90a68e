-- Drives the flowlua binary (FLOW_BIN, exported by scripts/test.sh) through pipes. One REPL
-- session serves several checks; should a child start MPI, it runs as an isolated singleton (no
-- orted) to keep it quick. Under AddressSanitizer the children skip the
-- exit-time leak check: MPI's unloaded plugins leave allocations the suppressions cannot name,
-- and this spec is about what the REPL prints (the runner process checks the library's leaks).
local flow = require "flow"
local bin = os.getenv("FLOW_BIN")
if not bin then
  describe("the flowlua REPL", function()
    it("needs the binary", function() pending("FLOW_BIN is not set (scripts/test.sh exports the flowlua path)") end)
  end)
  return
end

local function sh_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end
local env = "OMPI_MCA_ess_singleton_isolated=1 ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0 "
local flowlua = env .. sh_quote(bin)

-- Run a shell command line; returns everything it printed (stdout and stderr) and its exit code.
local function run(cmd)
  local p = assert(io.popen("{ " .. cmd .. "\n} 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

describe("the flowlua REPL", function()
  -- one session on a pipe; each input line's output is checked below in order
  local out, code
  setup(function()
    out, code = run(flowlua .. " <<'FLOW_EOF'\n" .. table.concat({
      "1+1",
      "return 1, 'a', nil",
      "flow.tensor({1, 2})",
      "function f(x)", "  return x * 2", "end", "f(21)",
      "1 +", "2",
      "t = {", "n = 5 }", "t.n",
      "error('boom')",
      "'still here'",
      "1 2",
      "'after'",
      "function g(",
    }, "\n") .. "\nFLOW_EOF")
  end)

  it("prints the value of an expression, every value of a multiple return", function()
    assert.equal(0, code)
    assert.matches("^2\n1\ta\tnil\n", out)
  end)

  it("prints tensors with their own tostring", function()
    assert.matches("\ntensor%(%[1, 2%], shape={2}, dtype=int64%)\n", out)
  end)

  it("continues an incomplete chunk over several lines", function()
    assert.matches("\n42\n3\n5\n", out)
  end)

  it("reports an error and goes on", function()
    assert.matches("\nflowlua: stdin:1: boom\nstack traceback:", out)
    assert.matches("\nstill here\nflowlua: stdin:1: unexpected symbol near '1'\nafter\n", out)
  end)

  it("reports a chunk left unfinished at the end of input", function()
    assert.matches("\nafter\nflowlua: stdin:1: <name> or '...' expected near <eof>\n$", out)
  end)

  it("interrupts a running chunk on SIGINT and reads on", function()
    -- the REPL reads from a fifo we hold open; the chunk says "ready" once it is running, and
    -- only then comes the signal (timeout passes it on, and kills the REPL if it never lands).
    -- --foreground: without it timeout also signals its process group, so the REPL would get a
    -- second SIGINT, which (as in lua.c) ends a run the first did not stop
    local dir = os.tmpname()
    os.remove(dir)
    local script = table.concat({
      "mkdir " .. dir .. " && mkfifo " .. dir .. "/in || exit 1",
      env .. "timeout --foreground -s KILL 20 " .. sh_quote(bin) .. " < " .. dir .. "/in > "
        .. dir .. "/out 2>&1 & pid=$!",
      "exec 3>" .. dir .. "/in",
      "echo 'print(\"ready\") while true do end' >&3",
      "i=0; until grep -qs ready " .. dir .. "/out || [ $i -ge 300 ]; do sleep 0.05; i=$((i+1)); done",
      "kill -INT $pid",
      "echo 'print(40 + 2)' >&3; exec 3>&-",
      "wait $pid; echo rc=$?",
      "cat " .. dir .. "/out; rm -r " .. dir,
    }, "\n")
    local res = run("sh -c " .. sh_quote(script))
    assert.matches("^rc=0\nready\n", res)
    assert.matches("flowlua: interrupted", res)
    assert.matches("\n42\n$", res)
  end)
end)

describe("the flowlua REPL on a terminal", function()
  it("opens with a banner: version, Lua release, build (CPU/CUDA, MPI) and world size", function()
    if run("command -v script >/dev/null; echo $?") ~= "0\n" then return pending("script (util-linux) is not installed") end
    -- script(1) gives flowlua a pseudo-terminal; HOME keeps the history file out of the user's
    local home = os.tmpname()
    os.remove(home)
    os.execute("mkdir " .. sh_quote(home))
    local out = run("printf 'print(6 * 7)\\n' | HOME=" .. sh_quote(home) .. " timeout 20 script -qec "
      .. sh_quote(flowlua) .. " /dev/null")
    os.execute("rm -rf " .. sh_quote(home))
    local want = ("flowlua %s %%(Lua 5%%.4%%.%%d+%%) | build: %s, %s | world: 1 rank | Ctrl%%-D exits"):format(
      flow.__version:gsub("%.", "%%."), flow.cuda.built and "CUDA" or "CPU", flow._has_mpi and "MPI" or "no MPI")
    assert.matches(want, out)
    assert.matches("[^%d]42\r?\n", out) -- after the echoed line and readline's escapes
  end)
end)

describe("the flowlua REPL under mpirun", function()
  it("runs what rank 0 reads on every rank, prints values once and tags errors by rank", function()
    if run("command -v mpirun >/dev/null; echo $?") ~= "0\n" then return pending("mpirun is not installed") end
    if not flow._has_mpi then return pending("this build has no MPI (FLOW_MPI=OFF)") end
    -- the spec runner is an MPI singleton: its OMPI_/PMIX_ variables would confuse a nested mpirun
    local out, code = run(table.concat({
      "for v in $(env | sed -n 's/^\\(OMPI_[^=]*\\|PMIX_[^=]*\\)=.*/\\1/p'); do unset $v; done",
      "printf '%s\\n' 'flow.world_size()' 'if flow.rank() == 1 then error(\"only one\") end' 'function h()'"
        .. " 'return flow.rank() + 10' 'end' 'h()' 'error(\"all\")' | "
        .. env .. "timeout 60 mpirun --allow-run-as-root --oversubscribe -np 2 " .. sh_quote(bin),
    }, "\n"))
    assert.equal(0, code)
    local values = {}
    for line in out:gmatch("[^\n]+") do
      if not (line:match("^%[rank") or line:match("^stack traceback:") or line:match("^%s") or line:match("^%[C%]")) then
        values[#values + 1] = line
      end
    end
    assert.same({"2", "10"}, values)
    assert.matches("%[rank 1%] stdin:1: only one\n", out)
    assert.matches("%[rank 0,1%] stdin:1: all\n", out)
    assert.not_matches("%[rank 0%] stdin:1: only one", out)
  end)
end)

describe("the flowlua command line", function()
  it("prints the version with -v and runs -e chunks in order", function()
    local out, code = run(flowlua .. " -v -e 'print(flow.arange(3):sum():item())' -e 'print(2)'")
    assert.equal(0, code)
    assert.matches("^flowlua %d+%.%d+%.%d+ %(Lua 5%.4[^\n]*%)\n3\n2\n$", out)
  end)

  it("runs a script from stdin with -, passing its arguments in arg and ...", function()
    local out, code = run("echo \"print(#arg, arg[0], arg[1], arg[2], select('#', ...), ...)\" | "
                          .. flowlua .. " - one two")
    assert.equal(0, code)
    assert.equal("2\t-\tone\ttwo\t2\tone\ttwo\n", out)
  end)

  it("exits 1 with a traceback when the script fails", function()
    local out, code = run(flowlua .. " -e 'local function inner() error(\"deep\") end inner()'")
    assert.equal(1, code)
    assert.matches("deep", out)
    assert.matches("stack traceback:", out)
    assert.matches("in local 'inner'", out)
  end)
end)
