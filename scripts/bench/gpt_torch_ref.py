"""The GPT-2 training step of gpt_gpu.lua in PyTorch (same shapes, bf16 autocast, fused AdamW,
flash SDPA), for the flowlua/PyTorch tokens-per-second ratio. Prints a line with tokens/s.
    python3 scripts/bench/gpt_torch_ref.py [--layers 12 --dim 768 --heads 12 --seq 1024 --batch 8 --steps 10]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.h = h
        self.ln_1, self.ln_2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, block, layers, d, h):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, h) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = argparse.ArgumentParser()
    for k, v in dict(layers=12, dim=768, heads=12, seq=1024, batch=8, vocab=50257, steps=10, warmup=2,
                     peak_tflops=989).items():
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT(a.vocab, a.seq, a.layers, a.dim, a.heads).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=True)
    x = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")
    y = torch.randint(0, a.vocab, (a.batch, a.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / a.steps
    tokens = a.batch * a.seq
    n = sum(q.numel() for q in model.parameters())
    mfu = tokens / dt * (6 * n + 12 * a.layers * a.seq * a.dim) / (a.peak_tflops * 1e12)
    print(f"gpt_torch_ref: {dt * 1e3:.1f} ms/step, tokens/s {tokens / dt:.0f}, MFU {100 * mfu:.1f}%, loss {loss:.3f}")


if __name__ == "__main__":
    main()
