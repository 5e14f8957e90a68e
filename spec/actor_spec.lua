-- The actor runtime (actor/runtime.c) through flow._actor_chain: task i produces register i,
-- read by task i + 1. Tasks and pieces are 0-based, as in the runtime's trace events.
local flow = require "flow"

local chain = flow._actor_chain

-- trace events grouped by task, each list in start order
local function by_task(events)
  local t = {}
  for _, e in ipairs(events) do
    t[e.task] = t[e.task] or {}
    table.insert(t[e.task], e)
  end
  for _, list in pairs(t) do table.sort(list, function(a, b) return a.t0 < b.t0 end) end
  return t
end

-- the event of `task` for `piece`
local function event(events, task, piece)
  for _, e in ipairs(events) do
    if e.task == task and e.piece == piece then return e end
  end
  error(("no event for task %d piece %d"):format(task, piece))
end

local function overlap(a, b) return a.t0 < b.t1 and b.t0 < a.t1 end

local function error_of(fn, ...)
  local ok, err = pcall(fn, ...)
  assert.is_false(ok, "expected an error")
  return tostring(err)
end

describe("actor runtime: acting", function()
  it("every task acts exactly `pieces` times, in piece order, reading what its producer wrote", function()
    for _, c in ipairs{
      {streams = 1, layout = "blocks", register_num = 1},
      {streams = 2, layout = "roundrobin", register_num = 1},
      {streams = 3, layout = "blocks", register_num = 2},
      {streams = 3, layout = "roundrobin", register_num = 3},
    } do
      local r = chain{tasks = 7, pieces = 5, streams = c.streams, layout = c.layout,
                      register_num = c.register_num, trace = true}
      assert.is_nil(r.error)
      assert.are.equal(35, r.acts)
      assert.is_true(r.in_order)
      assert.is_true(r.data_ok)
      assert.are.equal(35, #r.events)
      local tasks = by_task(r.events)
      for task = 0, 6 do
        assert.are.equal(5, #tasks[task])
        for p = 0, 4 do assert.are.equal(p, tasks[task][p + 1].piece) end
      end
    end
  end)

  it("a stream acts its tasks in the order they were added, piece after piece", function()
    local r = chain{tasks = 6, streams = 2, layout = "roundrobin", pieces = 4, register_num = 2, trace = true}
    for stream = 0, 1 do
      local seq = {}
      for _, e in ipairs(r.events) do
        if e.stream == stream then seq[#seq + 1] = e end
      end
      assert.are.equal(12, #seq)
      for i, e in ipairs(seq) do
        -- stream s holds tasks s, s + 2, s + 4: the i-th act is task (i-1) % 3 of piece (i-1) // 3
        assert.are.equal(stream + 2 * ((i - 1) % 3), e.task)
        assert.are.equal((i - 1) // 3, e.piece)
        assert.are.equal(stream, e.stream)
        if i > 1 then assert.is_true(seq[i - 1].t1 <= e.t0) end
      end
    end
  end)

  it("a consumer acts on a piece only after its producer finished it", function()
    local r = chain{tasks = 5, streams = 5, pieces = 6, register_num = 2, work_us = 50, trace = true}
    for task = 1, 4 do
      for p = 0, 5 do
        assert.is_true(event(r.events, task - 1, p).t1 <= event(r.events, task, p).t0)
      end
    end
  end)

  it("a 1000-task chain completes, on one stream and over several", function()
    for _, c in ipairs{{streams = 1, layout = "blocks"}, {streams = 4, layout = "roundrobin"}} do
      local r = chain{tasks = 1000, streams = c.streams, layout = c.layout, pieces = 20, register_num = 2}
      assert.is_nil(r.error)
      assert.are.equal(20000, r.acts)
      assert.is_true(r.in_order)
      assert.is_true(r.data_ok)
    end
  end)
end)

describe("actor runtime: register_num", function()
  -- Two stages of 2 ms each on two streams, six pieces. The acts sleep rather than spin, as an act
  -- waiting on a device or the network does: they need no core, so the timing holds on a loaded
  -- machine (scripts/bench/actor.lua measures the same with busy acts).
  local function two_stage(register_num)
    return chain{tasks = 2, streams = 2, pieces = 6, sleep_us = 2000, register_num = register_num, trace = true}
  end

  it("with one slot the producer waits for the consumer: the two stages never overlap", function()
    local r = two_stage(1)
    local tasks = by_task(r.events)
    for _, a in ipairs(tasks[0]) do
      for _, b in ipairs(tasks[1]) do
        assert.is_false(overlap(a, b), ("stage 0 piece %d overlaps stage 1 piece %d"):format(a.piece, b.piece))
      end
    end
  end)

  it("with two slots stage 0 acts piece k+1 while stage 1 acts piece k, and the run is faster", function()
    -- A wake-up delayed on a busy machine (the suite runs files side by side) can spoil a try: it
    -- passes when one of six tries overlaps and is faster.
    local overlapped, serial, piped
    for _ = 1, 6 do
      serial, piped, overlapped = two_stage(1), two_stage(2), 0
      for k = 0, 4 do
        if overlap(event(piped.events, 0, k + 1), event(piped.events, 1, k)) then overlapped = overlapped + 1 end
      end
      -- 12 acts of 2 ms in series against 7 steps of a two-stage pipeline: a ratio near 0.58
      if overlapped >= 4 and piped.seconds < 0.8 * serial.seconds then break end
    end
    assert.is_true(overlapped >= 4, ("only %d of 5 pieces overlapped"):format(overlapped))
    assert.is_true(piped.seconds < 0.8 * serial.seconds,
      ("pipelined %.4f s vs serial %.4f s"):format(piped.seconds, serial.seconds))
  end)

  it("back-pressure: the producer runs at most register_num pieces ahead of its consumer", function()
    for R = 1, 3 do
      -- a fast producer and a slow consumer: only the free slots hold the producer back
      local r = chain{tasks = 2, streams = 2, pieces = 8, sleep_us = {0, 1000}, register_num = R, trace = true}
      assert.is_true(r.data_ok)
      for p = R, 7 do
        assert.is_true(event(r.events, 1, p - R).t1 <= event(r.events, 0, p).t0,
          ("R=%d: producer started piece %d before the consumer finished piece %d"):format(R, p, p - R))
      end
      -- and it does get R ahead: pieces 0 .. R-1 all start before the consumer is done with piece 0
      assert.is_true(event(r.events, 0, R - 1).t0 < event(r.events, 1, 0).t1)
    end
  end)
end)

describe("actor runtime: failure", function()
  local function as_set(acts)
    local s = {}
    for _, a in ipairs(acts) do s[a.task .. ":" .. a.piece] = true end
    return s
  end

  it("names the failing task, runs to the end with failed=true for every later act", function()
    local r = chain{tasks = 4, streams = 1, pieces = 4, fail_at = {task = 2, piece = 1}}
    assert.matches("^chain2: injected failure at piece 1", r.error)
    assert.are.equal(16, r.acts)
    -- one stream: the acts are totally ordered, and exactly those after the failure see it
    local saw = as_set(r.failed_acts)
    for p = 0, 3 do
      for task = 0, 3 do
        local later = p > 1 or (p == 1 and task > 2)
        assert.are.equal(later, saw[task .. ":" .. p] == true, ("task %d piece %d"):format(task, p))
      end
    end
  end)

  it("over several streams every act that follows the failure sees it, none that precedes it", function()
    local r = chain{tasks = 6, streams = 3, layout = "roundrobin", pieces = 5, fail_at = {task = 3, piece = 2}}
    assert.matches("^chain3: injected failure at piece 2", r.error)
    assert.are.equal(30, r.acts)
    local saw = as_set(r.failed_acts)
    for task = 0, 5 do
      for p = 0, 4 do
        local key = task .. ":" .. p
        -- (task, p) follows (3, 2) through the chain and the task's own order; it precedes it
        -- when it feeds it (task <= 3, p <= 2)
        if task >= 3 and p >= 2 and key ~= "3:2" then assert.is_true(saw[key] == true, key) end
        if task <= 3 and p <= 2 then assert.is_nil(saw[key], key) end
      end
    end
  end)

  it("the runtime runs again afterwards, and succeeds", function()
    local r = chain{tasks = 6, streams = 2, layout = "roundrobin", pieces = 5, register_num = 2,
                    fail_at = {task = 0, piece = 4}, runs = 3}
    assert.matches("^chain0: injected failure", r.runs[1].error)
    for i = 2, 3 do
      assert.is_nil(r.runs[i].error)
      assert.are.equal(30, r.runs[i].acts)
      assert.is_true(r.runs[i].in_order)
      assert.is_true(r.runs[i].data_ok)
    end
  end)
end)

describe("flow._actor_chain options", function()
  it("an unknown option is an error naming it", function()
    local err = error_of(chain, {tasks = 2, piece = 3})
    assert.matches("_actor_chain", err)
    assert.matches("'piece'", err)
    assert.matches("'taks'", error_of(chain, {tasks = 2, fail_at = {taks = 0, piece = 0}}))
  end)

  it("bad values are errors that say what is wrong", function()
    assert.matches("tasks must be an integer", error_of(chain, {tasks = 0}))
    assert.matches("register_num must be an integer", error_of(chain, {register_num = 0}))
    assert.matches("streams must be an integer", error_of(chain, {streams = 1.5}))
    assert.matches("pieces must be an integer", error_of(chain, {pieces = -1}))
    assert.matches("layout must be", error_of(chain, {layout = "diagonal"}))
    assert.matches("work_us", error_of(chain, {work_us = -1}))
    assert.matches("sleep_us", error_of(chain, {sleep_us = "long"}))
    assert.matches("one entry per task", error_of(chain, {tasks = 3, work_us = {1, 2}}))
    assert.matches("task must be an integer in %[0, 1%]", error_of(chain, {tasks = 2, fail_at = {task = 2, piece = 0}}))
  end)
end)
