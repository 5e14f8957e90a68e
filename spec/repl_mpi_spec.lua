-- The REPL under `mpirun -np 2 flowlua`, and under `flowlua --ranks 2` (no mpirun), which behaves
-- the same: rank 0 reads, every rank runs the line, a line that fails
-- on one rank is reported with that rank and the session goes on with its state, a global tensor
-- shows its gathered values; EOF ends every
-- rank with status 0. Driven through a pipe, and on a terminal under tmux (prompt, completion,
-- Ctrl-C interrupting a line that runs on both ranks).
local flow = require "flow"
local bin = os.getenv("FLOW_BIN")

local sh = require "support.shell"
local sh_quote, has = sh.quote, sh.has

-- Run a shell command line; returns everything it printed (stdout and stderr) and its exit code.
local function run(cmd)
  local p = assert(io.popen("{ " .. cmd .. "\n} 2>&1"))
  local out = p:read("a")
  local _, _, code = p:close()
  return out, code
end

-- nil when the multi-rank REPL can run here, else why not
local function cannot()
  if not bin then return "FLOW_BIN is not set (scripts/test.sh exports the flowlua path)" end
  if not has("mpirun") then return "mpirun is not installed" end
  if not flow._has_mpi then return "this build has no MPI (FLOW_MPI=OFF)" end
end

-- The two ways to start 2 ranks: the command line (up to the options), and why it cannot run here.
-- `timeout --foreground` leaves --ranks's rank 0 in the terminal's foreground group (mpirun's rank 0
-- takes the terminal itself).
local launchers = {
  { name = "mpirun -np 2", cannot = cannot,
    start = "OPENBLAS_NUM_THREADS=1 timeout -s KILL 15 mpirun --allow-run-as-root --oversubscribe -np 2 " },
  { name = "flowlua --ranks 2", ranks = " --ranks 2",
    cannot = function() return not bin and "FLOW_BIN is not set (scripts/test.sh exports the flowlua path)" end,
    start = "OPENBLAS_NUM_THREADS=1 timeout --foreground -s KILL 15 " },
}

local session = {
  'x = flow.ones({4, 4}, {placement = flow.placement("cpu", {0, 1}), sbp = flow.sbp.split(0)})',
  "x:sum():to_local()",
  'if flow.rank() == 1 then error("boom") end',
  'if flow.rank() == 1 then error("boom2") end; z = x:to_global(x.placement, flow.sbp.broadcast)',
  "(x * 2):sum():to_local()",
  "x:sum(1)",
  -- a placement of its own (rank 1 leads its communicator): a line failing on one rank ends the
  -- other's wait there at once too, and the communicator is in step again on the next line
  'Q = flow.placement("cpu", {1, 0}); xq = flow.ones({4, 4}, {placement = Q, sbp = flow.sbp.split(0)})',
  "(xq:to_global(Q, flow.sbp.broadcast) * 5):sum():to_local()",
  'if flow.rank() == 1 then error("boom3") end; z = xq:to_global(Q, flow.sbp.broadcast)',
  "(xq:to_global(Q, flow.sbp.broadcast) * 6):sum():to_local()",
  -- rank 0 computes for 20 s without waiting on a peer: rank 1's failure ends its line too
  'if flow.rank() == 1 then error("boom4") end; local t = flow.now(); while flow.now() - t < 20 do end',
  "(x * 7):sum():to_local()",
}

for _, launcher in ipairs(launchers) do
  local cannot, flowlua = launcher.cannot, function() return launcher.start .. sh_quote(bin) .. (launcher.ranks or "") end
  describe("the flowlua REPL under " .. launcher.name, function()
    it("runs each line on every rank, reports a failure on rank 1 and goes on; exits 0 at EOF", function()
      local why = cannot()
      if why then return pending(why) end
      local t0 = flow.now()
      local out, code = run(flowlua() .. " <<'FLOW_EOF'\n" .. table.concat(session, "\n") .. "\nFLOW_EOF")
      assert.equal(0, code)
      -- a line failing on rank 1 before a global op fails on rank 0 at once with rank 1's message,
      -- not after the REPL's FLOW_TIMEOUT (30 s)
      -- (named by the op that waited, or by the line when the watcher's interrupt came first)
      assert.matches("%[rank 0%] [%w_ ]+: rank 1 failed: stdin:1: boom2", out)
      assert.matches("tensor%(80%.0000, shape={}", out)
      assert.matches("%[rank 0%] [%w_ ]+: rank 1 failed: stdin:1: boom3", out)
      assert.matches("tensor%(96%.0000, shape={}", out)
      assert.matches("%[rank 0%] REPL line: rank 1 failed: stdin:1: boom4", out)
      assert.matches("tensor%(56%.0000, shape={}", out)
      assert.is_true(flow.now() - t0 < 10, "the session took " .. (flow.now() - t0) .. " s")
      assert.matches("tensor%(8%.0000, shape={}", out)
      assert.matches("%[rank 1%] stdin:1: boom", out)
      assert.not_matches("%[rank 0[^%]]*%] stdin:1: boom", out)
      -- x survived the failed line: the next line still sees it
      assert.matches("tensor%(16%.0000, shape={}", out)
      -- a global tensor shows its values, gathered from both ranks
      assert.matches("tensor%(%[4%.0000, 4%.0000, 4%.0000, 4%.0000%], shape={4}, dtype=float32, "
        .. "placement=cpu{0, 1}, sbp=S%(0%)%)\n  rank 0: %[0:2%]\n  rank 1: %[2:4%]", out)
    end)

    -- the REPL in a tmux terminal (env: variables for it), driven by steps: each a list of keys to
    -- send, then what to wait for before the next step: `prompts = n` (n prompts on screen: the
    -- line ended) or `shows = text`. Waits poll the screen, up to 10 s each, instead of sleeping
    -- a fixed time. Returns what the terminal shows at the end, after Ctrl-D's "EXIT=".
    local function terminal(env, steps)
      local dir = sh.tmpdir()
      local s = "flowlua_repl_mpi_" .. tostring(os.time()) .. "_" .. tostring(math.random(1e6))
      local function screen() return (run("tmux capture-pane -p -t " .. s)) end
      local function prompts(text)
        local _, n = ("\n" .. text):gsub("\n>[^\n]?", "")
        return n
      end
      local function await(step)
        local deadline, text = flow.now() + 10, nil
        repeat
          text = screen()
          if step.shows and text:find(step.shows, 1, true) or step.prompts and prompts(text) >= step.prompts then
            return
          end
          os.execute("sleep 0.05")
        until flow.now() > deadline
        error(("the terminal did not show %s within 10 s:\n%s"):format(
          step.shows and ("'" .. step.shows .. "'") or (step.prompts .. " prompts"), text))
      end
      -- HOME keeps the history file out of the user's
      run("tmux new-session -d -s " .. s .. " -x 200 -y 50 " .. sh_quote("HOME=" .. dir .. " " .. env .. " "
        .. flowlua() .. "; echo EXIT=$?; sleep 60"))
      local ok, err = pcall(function()
        await({ prompts = 1 })
        for _, step in ipairs(steps) do
          local args = {}
          for i, k in ipairs(step) do args[i] = sh_quote(k) end
          run("tmux send-keys -t " .. s .. " " .. table.concat(args, " "))
          await(step)
        end
      end)
      local out = screen()
      run("tmux kill-session -t " .. s .. "; rm -rf " .. dir)
      assert(ok, err)
      return out
    end

    -- a line that runs until Ctrl-C, once it shows it runs on both ranks
    local spin = { 'flow.print_all("spinning") while true do end', "Enter", shows = "[rank 1] spinning" }

    it("on a terminal: a prompt, completion, Ctrl-C interrupts a line on both ranks, Ctrl-D ends", function()
      local why = cannot() or (not has("tmux") and "tmux is not installed")
      if why then return pending(why) end
      local out = terminal("", {
        { session[1], "Enter", prompts = 2 }, { session[3], "Enter", prompts = 3 },
        { "flow.world_si", "Tab", shows = "> flow.world_size" }, { "()", "Enter", prompts = 4 },
        spin, { "C-c", prompts = 5 },
        { session[5], "Enter", prompts = 6 }, { "C-d", shows = "EXIT=" },
      })
      assert.matches("world: 2 ranks", out)
      assert.matches("\n> flow%.world_size%(%)\n2\n", out)
      assert.matches("%[rank 1%] stdin:1: boom", out)
      assert.matches("%[rank 0,1%] interrupted", out)
      assert.matches("tensor%(16%.0000, shape={}", out)
      assert.matches("EXIT=0", out)
    end)

    it("on a terminal, Ctrl-C reaches a rank that rank 0 cannot signal (another node) through its notice", function()
      local why = cannot() or (not has("tmux") and "tmux is not installed")
      if why then return pending(why) end
      -- FLOW_REPL_FORWARD_SIGINT=0: rank 1 is reached as a rank on another node is
      local out = terminal("FLOW_REPL_FORWARD_SIGINT=0", {
        { session[1], "Enter", prompts = 2 },
        spin, { "C-c", prompts = 3 },
        -- rank 0 waits in a handshake for rank 1, which computes
        { 'flow.print_all("computing") if flow.rank() == 1 then while true do end end; '
          .. "y = x:to_global(x.placement, flow.sbp.broadcast)", "Enter", shows = "[rank 1] computing" },
        { "C-c", prompts = 4 },
        { "(x * 3):sum():to_local()", "Enter", prompts = 5 }, { "C-d", shows = "EXIT=" },
      })
      local _, n = out:gsub("%[rank 1%] REPL line: rank 0 failed: interrupted", "")
      assert.equal(2, n, out)
      assert.matches("tensor%(24%.0000, shape={}", out)
      assert.matches("EXIT=0", out)
    end)
  end)
end
