"""PyTorch reference for scripts/bench/gpt_step.lua: the same GPT-2 (learned positions, pre-LN,
GELU tanh, tied embeddings, causal attention), float32, AdamW, one training step timed. Debian's
torch 1.13 has no fused attention, so attention is the masked softmax of q k^T (as nanoGPT's).
Prints one line: `torch_ms <median> <min>`. Usage: python3 gpt_step_torch.py L D H T B V steps [amp]
with amp `bf16` for the forward and backward under torch.autocast("cpu", bfloat16)."""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch_step_timer import report, set_threads

L, D, H, T, B, V, STEPS = (int(a) for a in sys.argv[1:8])
AMP = len(sys.argv) > 8 and sys.argv[8] == "bf16"
torch.manual_seed(0)
set_threads()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.c_attn, self.attn_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.c_fc, self.mlp_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, H, c // H).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(D)

    def forward(self, idx, tgt):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for blk in self.h:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, V), tgt.view(-1))


model = GPT()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
x, y = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))


def step():
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=AMP):
        loss = model(x, y)
        loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


report(step, STEPS)
