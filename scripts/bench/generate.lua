-- GPT:generate (batch 1, a full window each token) with float32 weights against the same model cast
-- to bfloat16 (model:to("bfloat16"): oneDNN's bf16 GEMMs, the other ops on bf16 tensors), in one
-- process, rounds alternating; prints each one's best tokens/s, and how far the bf16 model's logits
-- for the prompt are from float32's.
--   flowlua scripts/bench/generate.lua [--layers 6 --dim 512 --heads 8 --prompt 200 --tokens 20 --rounds 3]
local flow = require "flow"
local gpt = require "flow.gpt"
local utils = require "flow.utils"

local args = utils.parse_args(arg, { layers = 6, dim = 512, heads = 8, prompt = 200, tokens = 20, rounds = 3 })
local function model(dtype)
  flow.manual_seed(0)
  local m = gpt.GPT({ vocab_size = 256, block_size = args.prompt + args.tokens, n_layer = args.layers,
                      n_head = args.heads, n_embd = args.dim })
  if dtype then m:to(dtype) end
  return m
end
local models = { { "float32", model(nil) }, { "bfloat16", model("bfloat16") } }
local prompt = {}
for i = 1, args.prompt do prompt[i] = (i * 7) % 256 end
local best = {}
for _, c in ipairs(models) do c[2]:generate(prompt, 2) end -- warm-up: primitives, allocator
for _ = 1, args.rounds do
  for _, c in ipairs(models) do
    flow.manual_seed(1)
    local t0 = utils.now()
    c[2]:generate(prompt, args.tokens)
    best[c[1]] = math.max(best[c[1]] or 0, args.tokens / (utils.now() - t0))
  end
end
print(("generate: L=%d D=%d H=%d, %d-token prompt, %d tokens, %d thread(s), best of %d rounds"):format(args.layers,
  args.dim, args.heads, args.prompt, args.tokens, flow._bench.onednn().threads, args.rounds))
print(("  float32:  %.1f tokens/s"):format(best.float32))
print(("  bfloat16: %.1f tokens/s (%.2fx)"):format(best.bfloat16, best.bfloat16 / best.float32))
local logits = {}
flow.no_grad(function()
  for i, c in ipairs(models) do logits[i] = c[2](flow.tensor({ prompt }, { dtype = "int64" })):float() end
end)
print(("  the prompt's logits: bf16 within %.3g of float32's (their largest magnitude %.3g)"):format(
  (logits[2] - logits[1]):abs():max():item(), logits[1]:abs():max():item()))
