-- Random-API fuzzer for flow (driven by spec/fuzz_spec.lua in a child flowlua, so the allocation
-- cap can be set low): `flowlua spec/support/fuzz.lua SEED COUNT`. Calls the module's functions,
-- the tensor methods and the nn layers with huge, negative and mistyped arguments and freed
-- tensors; every call must return or raise. Prints "calls N", "errors N", "unnamed N", then one
-- "unnamed <fn>: <message>" line per distinct error that does not name its function.
package.path = "./lua/?.lua;./lua/?/init.lua;" .. package.path
local flow = require "flow"
local nn, F = flow.nn, flow.nn.functional

local seed, count = tonumber(arg[1]) or 1, tonumber(arg[2]) or 1000

-- xorshift64*: the sequence is the same everywhere (math.random is left alone for other specs).
local state = seed * 0x9E3779B97F4A7C15 | 1
local function rand(n)
  state = state ~ (state >> 12); state = state ~ (state << 25); state = state ~ (state >> 27)
  return ((state * 0x2545F4914F6CDD1D) >> 33) % n + 1
end
local function pick(list) return list[rand(#list)] end

-- Functions that are not part of the user API under test: collectives, graph internals, global
-- state printers, file writers (flow.load is fuzzed on its own in spec/io_spec.lua), and
-- _check_opts, whose errors name the function that calls it by design.
local skip = {
  _mpi = true, barrier = true, _allgather_strings = true, _graph = true, _bench = true, _actor_chain = true,
  _defer_backward = true, _run_deferred_backward = true, _partial_leaf_grads = true, save = true,
  read_file = true, load = true, print_all = true, set_printoptions = true, set_check_consistency = true,
  manual_seed = true, set_rng_state = true, _create_shard = true, _check_opts = true,
}

local targets = {}
for name, f in pairs(flow) do
  if type(f) == "function" and not skip[name] then targets[#targets + 1] = { "flow." .. name, f, name } end
end
for name, f in pairs(F) do
  if type(f) == "function" then targets[#targets + 1] = { "F." .. name, f, name } end
end
for _, name in ipairs({ "Linear", "Embedding", "LayerNorm", "Conv2d", "Dropout", "Sequential" }) do
  if nn[name] then targets[#targets + 1] = { "nn." .. name, nn[name], name } end
end
local methods = {}
do
  local probe = flow.ones({ 1 })
  for _, t in ipairs(targets) do
    if t[1]:sub(1, 5) == "flow." and probe[t[3]] then methods[#methods + 1] = t[3] end
  end
  for _, m in ipairs({ "item", "numel", "shape", "size", "clone", "detach", "float", "to", "fill_", "zero_",
                       "add_", "mul_", "copy_", "totable", "backward", "requires_grad_", "type", "tolist",
                       "t", "norm", "prod", "repeat_", "std", "to_global", "to_local" }) do
    if probe[m] then methods[#methods + 1] = m end
  end
  table.sort(methods)
  table.sort(targets, function(a, b) return a[1] < b[1] end) -- pairs order must not decide the sequence
end

local huge = { 1 << 62, math.maxinteger, math.mininteger, 1 << 40, -(1 << 40), 1 << 32 }
local function int()
  local r = rand(10)
  if r <= 6 then return rand(6) - 2 end -- -1..4
  return pick(huge)
end
local function shape()
  local n = rand(4) - 1
  local s = {}
  for i = 1, n do s[i] = rand(4) <= 3 and rand(4) - 1 or int() end
  return s
end
local dtypes = { "float32", "float64", "int64", "int32", "uint8", "bool", "float16", "bfloat16", "float8" }
local function tensor()
  local r = rand(8)
  local s = {}
  for i = 1, rand(4) - 1 do s[i] = rand(4) - 1 end
  local ok, t = pcall(flow.randn, s, { dtype = rand(3) == 1 and "float64" or "float32" })
  if not ok then return flow.ones({ 2 }) end
  if r == 1 then t:free() -- freed tensors must be refused by every entry point
  elseif r == 2 then local ok2, c = pcall(t.to, t, pick(dtypes)); if ok2 then t = c end
  elseif r == 3 then t.requires_grad = true end
  return t
end
local function value()
  local r = rand(14)
  if r <= 3 then return tensor()
  elseif r <= 6 then return int()
  elseif r == 7 then return shape()
  elseif r == 8 then return pick({ 0.5, -1.5, 0 / 0, math.huge, -math.huge, 1e300 })
  elseif r == 9 then return pick({ "x", "float32", "cpu", "cuda:7", "", "a\0b" })
  elseif r == 10 then return { dtype = pick(dtypes), device = pick({ "cpu", "cuda", "tpu" }), keepdim = rand(2) == 1 }
  elseif r == 11 then return rand(2) == 1
  elseif r == 12 then return { tensor(), tensor() }
  elseif r == 13 then return setmetatable({}, { __len = function() return pick({ -1, 1 << 40, math.mininteger }) end })
  end
  return nil
end

local calls, errors, unnamed, seen, out = 0, 0, 0, {}, {}
local function names_op(msg, name)
  local low = msg:lower()
  name = name:lower():gsub("_$", "")
  return low:find(name, 1, true) ~= nil
end
for _ = 1, count do
  local args, n = {}, rand(5) - 1
  for i = 1, n do args[i] = value() end
  local label, f, name
  if rand(3) == 1 and #methods > 0 then
    name = pick(methods)
    label = "t:" .. name
    local t = tensor()
    f = function(...) return t[name](t, ...) end
  else
    local tg = pick(targets)
    label, f, name = tg[1], tg[2], tg[3]
  end
  calls = calls + 1
  local ok, err = pcall(f, table.unpack(args, 1, n))
  if not ok then
    errors = errors + 1
    local msg = tostring(err)
    if not names_op(msg, name) then
      unnamed = unnamed + 1
      local key = label .. ": " .. msg:gsub("0x%x+", "0x?"):sub(1, 160)
      if not seen[key] then seen[key] = true; out[#out + 1] = key end
    end
  end
  if calls % 200 == 0 then collectgarbage() end
end
print("calls " .. calls)
print("errors " .. errors)
print("unnamed " .. unnamed)
table.sort(out)
for _, k in ipairs(out) do print("unnamed " .. k:gsub("\n", " ")) end
