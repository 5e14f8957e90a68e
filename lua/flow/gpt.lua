-- flow.gpt: the GPT-2 model (learned positions, pre-LN blocks, GELU MLP 4x, tied embeddings),
-- with parameter names following Hugging Face's GPT-2 (wte, wpe, h.N.attn.c_attn, ...).
local flow = require "flow"
local nn = flow.nn
local F = nn.functional

local gpt = {}

local Block = nn.class("Block", nn.Module)
gpt.Block = Block
function Block:__init(cfg)
  self.ln_1 = nn.LayerNorm(cfg.n_embd)
  self.attn = nn.CausalSelfAttention(cfg.n_embd, cfg.n_head, cfg.dropout)
  self.ln_2 = nn.LayerNorm(cfg.n_embd)
  self.mlp = nn.MLP(cfg.n_embd, 4 * cfg.n_embd, cfg.dropout)
end
function Block:forward(x)
  x = x + self.attn(self.ln_1(x))
  return x + self.mlp(self.ln_2(x))
end

-- cfg: vocab_size, block_size (longest sequence), n_layer, n_head, n_embd, dropout (0).
local GPT = nn.class("GPT", nn.Module)
gpt.GPT = GPT
function GPT:__init(cfg)
  for _, k in ipairs({ "vocab_size", "block_size", "n_layer", "n_head", "n_embd" }) do
    if not math.tointeger(cfg[k]) or cfg[k] < 1 then error(("GPT: config.%s must be a positive integer"):format(k), 3) end
  end
  self.config = cfg
  self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
  self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)
  self.drop = nn.Dropout(cfg.dropout or 0)
  local blocks = {}
  for i = 1, cfg.n_layer do blocks[i] = Block(cfg) end
  self.h = nn.ModuleList(blocks)
  self.ln_f = nn.LayerNorm(cfg.n_embd)
  self:init_weights()
end

-- GPT-2's init: weights N(0, 0.02), biases 0, LayerNorm (1, 0); the projections that write into
-- the residual stream (attn.c_proj, mlp.c_proj) get std 0.02/sqrt(2 n_layer), so the residual's
-- variance does not grow with depth.
function GPT:init_weights()
  local resid_std = 0.02 / math.sqrt(2 * self.config.n_layer)
  for _, nt in ipairs(self:named_parameters()) do
    local name, p = nt[1], nt[2]
    if name:match("ln_%w+%.weight$") then nn.init.ones_(p)
    elseif name:match("%.bias$") then nn.init.zeros_(p)
    elseif name:match("c_proj%.weight$") then nn.init.normal_(p, 0, resid_std)
    else nn.init.normal_(p, 0, 0.02) end
  end
end

-- idx int64 [B, T] -> logits [B, T, vocab]; with targets [B, T] also the mean cross-entropy.
function GPT:forward(idx, targets)
  local s = idx:shape()
  local T = s[2]
  if T > self.config.block_size then
    error(("GPT: sequence length %d is longer than block_size %d"):format(T, self.config.block_size), 2)
  end
  local pos = flow.arange(0, T, 1, { dtype = "int64", device = idx.device })
  local x = self.drop(self.wte(idx) + self.wpe(pos))
  for i = 1, #self.h do x = self.h[i](x) end
  x = self.ln_f(x)
  -- tied: logits = x wte^T. On a pipeline the head's stage reads the embedding's weight from the
  -- first stage (boxed between the placements; its gradient goes back the same way).
  local w = self.wte.weight
  if x.is_global and w.is_global and x.placement ~= w.placement then w = w:to_global(x.placement, w.sbp) end
  -- logits [B*T, V] (the rows F.linear multiplies anyway), returned as [B, T, V]; the loss takes
  -- them flat with targets [B*T] (PyTorch's cross_entropy has its class axis at 1, not last)
  local xs = x:shape()
  local logits = F.linear(flow.reshape(x, { xs[1] * xs[2], xs[3] }), w)
  local out = flow.reshape(logits, { xs[1], xs[2], logits:shape()[2] })
  if targets then
    if targets.is_global and logits.is_global and targets.placement ~= logits.placement then
      targets = targets:to_global(logits.placement, targets.sbp)
    end
    return out, F.cross_entropy(logits, flow.reshape(targets, { xs[1] * xs[2] }))
  end
  return out
end

-- Megatron-style tensor parallelism from SBP annotations alone: the first Linear of attention
-- (c_attn) and of the MLP (c_fc) split their output features (weight [out, in] and bias: S(0)),
-- the second (c_proj) splits its input features (weight S(1)), so the pair needs one reduction
-- (a partial_sum boxed where it is consumed). The tied token table wte splits its vocabulary
-- (S(0)): the lookup gives partial sums, the logits x wte^T come out split on the vocabulary
-- (when moving the activations costs less than moving the table) and the loss is flow.parallel's
-- vocab-parallel cross-entropy. Everything else is broadcast.
-- Pipeline stages for nn.Graph: the embeddings and the first blocks on placements[1], ..., the
-- last blocks and the final layer norm on placements[#placements] (blocks spread evenly).
-- Returns {{module, placement}, ...} for G:set_stage.
function gpt.pipeline_stages(model, placements)
  local n, L = #placements, #model.h
  if n < 1 or n > L then error(("gpt.pipeline_stages: %d stages for %d blocks"):format(n, L), 2) end
  local stages = { { model.wte, placements[1] }, { model.wpe, placements[1] } }
  for i = 1, L do stages[#stages + 1] = { model.h[i], placements[(i - 1) * n // L + 1] } end
  stages[#stages + 1] = { model.ln_f, placements[n] }
  return stages
end

function gpt.tensor_parallel_sbp(name)
  local S, B = flow.sbp.split, flow.sbp.broadcast
  if name:match("c_attn%.[wb]") or name:match("c_fc%.[wb]") then return S(0) end
  if name:match("c_proj%.weight$") then return S(1) end
  if name == "wte.weight" then return S(0) end
  return B
end

-- AdamW over the model: 2-D weights decay, biases/LayerNorm/... do not (GPT-2 practice).
function GPT:configure_optimizer(opts)
  local decay, no_decay = {}, {}
  for _, p in ipairs(self:parameters()) do
    if #p:shape() >= 2 then decay[#decay + 1] = p else no_decay[#no_decay + 1] = p end
  end
  return flow.optim.AdamW({ { params = decay, weight_decay = opts.weight_decay or 0.1 }, { params = no_decay, weight_decay = 0 } },
    { lr = opts.lr, betas = opts.betas or { 0.9, 0.95 }, eps = opts.eps or 1e-8 })
end

-- Sample n tokens after prompt (a Lua list of token ids) with temperature, each drawn from
-- softmax(logits / temperature) with a uniform number from flow's RNG. Returns the new tokens.
function GPT:generate(prompt, n, temperature)
  local was_training = self.training
  self:eval()
  local ctx = { table.unpack(prompt) }
  local out = {}
  flow.no_grad(function()
    for _ = 1, n do
      local start = math.max(1, #ctx - self.config.block_size + 1)
      local window = table.move(ctx, start, #ctx, 1, {})
      local logits = self(flow.tensor({ window }, { dtype = "int64", device = self.wte.weight.device }))
      local last = flow.select(flow.select(logits, 0, 0), 0, #window - 1)
      local probs = flow.softmax(last / (temperature or 1.0), -1):totable()
      local u, acc, tok = flow.rand({ 1 }, { dtype = "float64" }):item(), 0, #probs - 1
      for i, p in ipairs(probs) do
        acc = acc + p
        if u < acc then tok = i - 1; break end
      end
      ctx[#ctx + 1], out[#out + 1] = tok, tok
    end
  end)
  self:train(was_training)
  return out
end

-- Count of parameter elements.
function GPT:num_parameters()
  local n = 0
  for _, p in ipairs(self:parameters()) do n = n + p:numel() end
  return n
end

return gpt
