"""A deliberately different reimplementation of reference.py, as a port to another engine would
be: no modules, its own tensor names, patches cut by one reshape/permute, attention and
LayerNorm written out, weights read by name from a safetensors file. It writes its tensors as a
plain safetensors file: no tensordiff in it at all.

Two layout bugs can be planted, each a real porting mistake; everything after the patches is
computed correctly on the misordered data:
- `transposed-grid`: the patches are walked column by column (x outer, y inner), so the rows
  are the (h, w) grid transposed;
- `channels-last`: each patch is flattened (y, x, c) instead of (c, y, x), so the columns of
  every row are permuted.
"""
from __future__ import annotations

import math

import torch
from safetensors.torch import load_file, save_file

PATCH = 8
BUGS = ("transposed-grid", "channels-last")
# the order of (c, gy, y, gx, x) that makes the patch matrix: rows (gy, gx), columns (c, y, x)
ORDER = {None: (1, 3, 0, 2, 4), "transposed-grid": (3, 1, 0, 2, 4), "channels-last": (1, 3, 2, 4, 0)}


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def attention(x, W, prefix, heads):
    n, d = x.shape
    qkv = x @ W[f"{prefix}.attn.in_proj_weight"].T + W[f"{prefix}.attn.in_proj_bias"]
    q, k, v = (t.reshape(n, heads, d // heads).transpose(0, 1) for t in qkv.split(d, dim=-1))
    p = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(d // heads), dim=-1)
    o = (p @ v).transpose(0, 1).reshape(n, d)
    return o @ W[f"{prefix}.attn.out_proj.weight"].T + W[f"{prefix}.attn.out_proj.bias"]


def gelu(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def run(image: torch.Tensor, weights_file: str, out_file: str, *, bug: str | None = None, depth: int = 2,
        heads: int = 2) -> None:
    W = load_file(weights_file)
    c, hh, ww = image.shape
    h, w = hh // PATCH, ww // PATCH
    grid = image.reshape(c, h, PATCH, w, PATCH)  # c, gy, y, gx, x
    patches = grid.permute(*ORDER[bug]).reshape(h * w, c * PATCH * PATCH)
    out = {"tokens.patches": patches}
    x = patches @ W["embed.proj.weight"].T + W["embed.proj.bias"] + W["embed.pos"]
    out["tokens.embedded"] = x
    for i in range(depth):
        p = f"blocks.{i}"
        x = x + attention(layer_norm(x, W[f"{p}.norm1.weight"], W[f"{p}.norm1.bias"]), W, p, heads)
        hdn = gelu(layer_norm(x, W[f"{p}.norm2.weight"], W[f"{p}.norm2.bias"]) @ W[f"{p}.mlp.0.weight"].T
                   + W[f"{p}.mlp.0.bias"])
        x = x + hdn @ W[f"{p}.mlp.2.weight"].T + W[f"{p}.mlp.2.bias"]
        out[f"layer{i}.out"] = x
    out["out.norm"] = layer_norm(x, W["norm.weight"], W["norm.bias"])
    save_file({k: v.contiguous() for k, v in out.items()}, out_file)
