-- Threads on the CPU: flowlua's own kernels run on the threads oneDNN uses (kernels/cpu/iter.h) and
-- give the same bits on 2 threads as on 1; a fresh flowlua has libgomp spin briefly between
-- parallel regions unless the user chose OMP_WAIT_POLICY or GOMP_SPINCOUNT (lua/main.c).
local shell = require "support.shell"
local bin = os.getenv("FLOW_BIN")
local here = debug.getinfo(1, "S").source:match("^@(.*)/[^/]*$") or "."

describe("CPU threads", function()
  if not bin then
    it("need FLOW_BIN", function() pending("FLOW_BIN is not set") end)
    return
  end

  -- libgomp's settings as it read them when flowlua started (OMP_DISPLAY_ENV=verbose prints them
  -- on stderr), and what os.getenv says in the script, with `env` the only OpenMP settings given
  local function omp_settings(env)
    local out, err, code = shell.run("env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT " .. env ..
      " OMP_DISPLAY_ENV=verbose " .. shell.quote(bin) .. " -e 'print(os.getenv(\"GOMP_SPINCOUNT\"))'")
    assert.equal(0, code, err)
    return { spin = err:match("GOMP_SPINCOUNT = '(%d+)'"), policy = err:match("OMP_WAIT_POLICY = '(%u+)'"),
             getenv = out:match("^(%S+)") }
  end

  it("spin 1000 times before sleeping by default (libgomp's own default is 300000)", function()
    assert.same({ spin = "1000", policy = "PASSIVE", getenv = "1000" }, omp_settings(""))
  end)

  it("keep the user's OMP_WAIT_POLICY", function()
    assert.same({ spin = "0", policy = "PASSIVE", getenv = "nil" }, omp_settings("OMP_WAIT_POLICY=passive"))
    assert.same({ spin = "30000000000", policy = "ACTIVE", getenv = "nil" }, omp_settings("OMP_WAIT_POLICY=active"))
  end)

  it("keep the user's GOMP_SPINCOUNT", function()
    assert.same({ spin = "300000", policy = "PASSIVE", getenv = "300000" }, omp_settings("GOMP_SPINCOUNT=300000"))
    assert.same({ spin = "7", policy = "PASSIVE", getenv = "7" }, omp_settings("GOMP_SPINCOUNT=7"))
  end)

  it("give every threaded kernel's result the same bits on 2 threads as on 1", function()
    local flow = require "flow"
    local function run(threads)
      local file = os.tmpname()
      local out, err, code = shell.run(("FLOW_NUM_THREADS=%d %s %s %s"):format(threads, shell.quote(bin),
        shell.quote(here .. "/support/threaded_ops.lua"), shell.quote(file)))
      assert.equal(0, code, err)
      assert.equal("threads\t" .. threads .. "\n", out)
      local results = flow.load(file)
      os.remove(file)
      return results
    end
    local one, two = run(1), run(2)
    local count = 0
    for name, a in pairs(one) do
      local b = assert(two[name], name)
      assert.same(a:shape(), b:shape())
      assert.equal(0, a:ne(b):sum():item(), name) -- no NaN among them: ne is exact inequality
      count = count + 1
    end
    assert.is_true(count > 30)
  end)

  -- attention on a batch of one runs its "team" on the calling thread, outside any parallel
  -- region: inside one, every GEMM's pieces opened a nested team of new threads, and on 1 thread a
  -- fresh process cut them by OpenMP's default count (the cores) before FLOW_NUM_THREADS applied
  it("cut no GEMM inside a parallel region, nor on 1 thread: attention on a batch of one", function()
    local script = "local flow = require 'flow' local q = flow.randn(1, 8, 256, 64):requires_grad_(true) " ..
      "for _ = 1, 3 do flow.scaled_dot_product_attention(q, q, q, { causal = true }):sum():backward() end " ..
      "local o = flow._bench.onednn() print(o.threads, o.cut, o.cut_nested)"
    for _, threads in ipairs { 1, 2 } do
      local out, err, code = shell.run(("env -u OMP_NUM_THREADS FLOW_NUM_THREADS=%d %s -e %s"):format(threads,
        shell.quote(bin), shell.quote(script)))
      assert.equal(0, code, err)
      local t, cut, nested = out:match("^(%d+)%s+(%d+)%s+(%d+)")
      assert.equal(tostring(threads), t, out)
      assert.equal("0", nested, out)
      if threads == 1 then assert.equal("0", cut, out) else assert.is_true(tonumber(cut) > 0, out) end
    end
  end)

  it("cut big GEMMs into one piece per thread and match the reference loop", function()
    for _, threads in ipairs { 2, 4 } do
      local out, err, code = shell.run(("FLOW_NUM_THREADS=%d %s %s"):format(threads, shell.quote(bin),
        shell.quote(here .. "/support/cut_gemms.lua")))
      assert.equal(0, code, err)
      local n = tonumber(out:match("^cut (%d+)\n$"))
      assert.is_true(n ~= nil and n >= 20, out)
    end
  end)

end)
