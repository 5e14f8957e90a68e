"""PyTorch reference for spec/reference_spec.lua: the GPT-2 model of lua/flow/gpt.lua written
with torch ops, run in float64 on the weights flowlua saved.

usage: gpt_ref.py IN.safetensors OUT.safetensors N_HEAD

IN holds the model's parameters under flow.gpt's names (wte.weight, h.0.attn.c_attn.weight, ...,
Linear weights as [out, in]) plus int64 `idx` and `targets` [B, T]. OUT receives `logits`, `loss`
and `grad.<name>` for every parameter, in float64. Safetensors is read and written with struct
and json so no extra package is needed.
"""
import json
import math
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64, "I32": torch.int32,
          "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8, "BOOL": torch.bool}
NAMES = {v: k for k, v in DTYPES.items()}


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        buf = bytearray(body[start:end])
        t = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def save(tensors, path):
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def gelu(x):
    """GELU, tanh approximation (as flow.gelu(x, {approximate = "tanh"}) in the GPT MLP)."""
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(p, idx, targets, n_head):
    B, T = idx.shape
    n_layer = len({k.split(".")[1] for k in p if k.startswith("h.")})
    x = p["wte.weight"][idx] + p["wpe.weight"][torch.arange(T)]
    C = x.shape[-1]
    D = C // n_head
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(n_layer):
        w = lambda name: p[f"h.{i}.{name}"]
        h = F.layer_norm(x, (C,), w("ln_1.weight"), w("ln_1.bias"), 1e-5)
        q, k, v = F.linear(h, w("attn.c_attn.weight"), w("attn.c_attn.bias")).split(C, dim=2)
        q, k, v = (t.reshape(B, T, n_head, D).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + F.linear(y, w("attn.c_proj.weight"), w("attn.c_proj.bias"))
        h = F.layer_norm(x, (C,), w("ln_2.weight"), w("ln_2.bias"), 1e-5)
        h = F.linear(gelu(F.linear(h, w("mlp.c_fc.weight"), w("mlp.c_fc.bias"))),
                     w("mlp.c_proj.weight"), w("mlp.c_proj.bias"))
        x = x + h
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], 1e-5)
    logits = x @ p["wte.weight"].T
    loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))
    return logits, loss


def main():
    src, dst, n_head = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = load(src)
    idx, targets = t.pop("idx"), t.pop("targets")
    params = {k: v.double().requires_grad_(True) for k, v in t.items()}
    logits, loss = forward(params, idx, targets, n_head)
    loss.backward()
    out = {"logits": logits, "loss": loss.reshape(())}
    for k, v in params.items():
        out["grad." + k] = v.grad
    save(out, dst)


if __name__ == "__main__":
    main()
