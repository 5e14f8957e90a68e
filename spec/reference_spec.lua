-- flow.gpt against PyTorch: a 2-layer GPT's logits, loss and every parameter gradient, from the
-- same weights and tokens, must agree with spec/reference/gpt_ref.py (float64 torch) to 1e-4
-- relative. Weights and results travel as safetensors files.
local flow = require "flow"
local gpt = require "flow.gpt"

local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local SCRIPT = here .. "reference/gpt_ref.py"
local RTOL = 1e-4

local function shell_quote(s) return "'" .. s:gsub("'", "'\\''") .. "'" end

-- The first interpreter that can import torch (FLOW_PYTHON, then python3, then the system one,
-- since a pyenv python3 on PATH does not see Debian's python3-torch).
local function find_python()
  local candidates = {"python3", "/usr/bin/python3"}
  if os.getenv("FLOW_PYTHON") then table.insert(candidates, 1, os.getenv("FLOW_PYTHON")) end
  for _, py in ipairs(candidates) do
    -- find_spec looks torch up without the second it takes to import
    local probe = " -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec(\"torch\") is None)'"
    if os.execute(py .. probe .. " >/dev/null 2>&1") then return py end
  end
end

local function numbers(t)
  local out = {}
  local function walk(v)
    if type(v) == "table" then for _, x in ipairs(v) do walk(x) end else out[#out + 1] = v end
  end
  walk(t:totable())
  return out
end

-- max |a - b| <= RTOL * max |b|: relative to the tensor's scale, so elements near zero do not
-- demand more than float32 can give.
local function assert_close(what, got, want)
  assert.are.same(want:shape(), got:shape(), what .. ": shape")
  local a, b = numbers(got), numbers(want)
  local err, scale, at = 0, 0, 1
  for i = 1, #b do
    scale = math.max(scale, math.abs(b[i]))
    local e = math.abs(a[i] - b[i])
    if e > err then err, at = e, i end
  end
  assert.is_true(err <= RTOL * scale,
    ("%s: max error %.3g at element %d (flow %.9g, torch %.9g), scale %.3g"):format(what, err, at, a[at], b[at], scale))
end

describe("GPT against PyTorch", function()
  local python = find_python()
  if not python then
    pending("python3-torch not installed")
    return
  end

  it("logits, loss and every parameter gradient match", function()
    local cfg = {vocab_size = 23, block_size = 8, n_layer = 2, n_head = 2, n_embd = 16, dropout = 0}
    local B, T = 2, 7
    flow.manual_seed(7)
    local model = gpt.GPT(cfg)
    -- GPT-2's init (std 0.02) makes attention nearly uniform and GELU nearly linear; weights of
    -- std 0.4 (LayerNorm gains around 1) exercise the softmax, the mask and the nonlinearity.
    flow.no_grad(function()
      for _, nt in ipairs(model:named_parameters()) do
        local name, p = nt[1], nt[2]
        local w = flow.randn(p:shape()) * 0.4
        if name:match("ln_%w+%.weight$") then w = w + 1 end
        p:copy_(w)
      end
    end)
    local idx = flow.randint(0, cfg.vocab_size, {B, T})
    local targets = flow.randint(0, cfg.vocab_size, {B, T})
    local logits, loss = model(idx, targets)
    loss:backward()

    local dir = os.tmpname()
    os.remove(dir)
    assert(os.execute("mkdir -p " .. shell_quote(dir)))
    local src, dst = dir .. "/in.safetensors", dir .. "/out.safetensors"
    local tensors = {idx = idx, targets = targets}
    local params = model:named_parameters()
    for _, nt in ipairs(params) do tensors[nt[1]] = nt[2]:detach() end
    flow.save(tensors, src)
    local cmd = ("%s %s %s %s %d 2>&1"):format(python, shell_quote(SCRIPT), shell_quote(src), shell_quote(dst), cfg.n_head)
    local p = io.popen(cmd)
    local log = p:read("a")
    local ok = p:close()
    assert.is_true(ok, "gpt_ref.py failed:\n" .. log)
    local ref = flow.load(dst)
    os.execute("rm -rf " .. shell_quote(dir))

    assert_close("logits", logits:double(), ref.logits)
    assert_close("loss", loss:double(), ref.loss)
    assert.are.equal(4 + 12 * cfg.n_layer, #params) -- wte, wpe, ln_f (2), 12 per block
    for _, nt in ipairs(params) do
      local name, param = nt[1], nt[2]
      local g = ref["grad." .. name]
      assert.is_not_nil(g, "torch returned no gradient for " .. name)
      assert.is_not_nil(param.grad, "flow computed no gradient for " .. name)
      assert_close("grad of " .. name, param.grad:double(), g)
    end
  end)
end)
