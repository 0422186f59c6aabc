"""The vision tower and aligner as the official `inference/vision.py` defines them.

Module and parameter names are the checkpoint's (`vision.blocks.N.attn.wqkv.weight`, ...), so
an official checkpoint's vision tensors load by name. This is the yardstick: it keeps the
official 3-D `scaled_dot_product_attention` call (PyTorch's math path), fp32 RMSNorm and fp32
rotary, and nothing clever.

Shapes: N = n_h * n_w patches, D = vision_dim, H heads of hd = D / H.
"""
from __future__ import annotations

from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn


@lru_cache(8)
def get_vision_cos_sin(n_h: int, n_w: int, dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """2D RoPE tables for an n_h x n_w grid: cos, sin of shape [N, 1, dim] (the 1 spans heads).

    Blocked layout: the first dim/2 angles rotate by the patch row, the last dim/2 by the
    column, each with the same dim/2 frequencies (not interleaved).
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))  # [dim/2]
    rows = torch.arange(n_h).view(n_h, 1).expand(n_h, n_w)
    cols = torch.arange(n_w).view(1, n_w).expand(n_h, n_w)
    pos = torch.stack([rows, cols], dim=-1).reshape(-1, 2, 1).float()  # [N, 2, 1]
    angles = (pos * inv_freq).flatten(1)  # [N, dim]: row angles, then column angles
    return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half over the whole head in fp32: x: [N, H, hd], cos/sin: [N, 1, hd/2]."""
    dtype = x.dtype
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(dtype)


class RMSNorm(nn.Module):
    """fp32 weight, fp32 math, result in the input dtype."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
        return (self.weight * x).to(dtype)


class PatchEmbed(nn.Module):
    """A linear layer over the flattened (c, y, x) patch, not a convolution."""

    def __init__(self, args):
        super().__init__()
        self.proj = nn.Linear(3 * args.vision_patch_size ** 2, args.vision_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.flatten(1))  # [N, 3, p, p] -> [N, D]


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.n_heads = args.vision_n_heads
        self.head_dim = args.vision_dim // args.vision_n_heads
        self.wqkv = nn.Linear(args.vision_dim, 3 * args.vision_dim)
        self.wo = nn.Linear(args.vision_dim, args.vision_dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        n = x.size(0)
        q, k, v = (t.view(n, self.n_heads, self.head_dim) for t in self.wqkv(x).chunk(3, dim=-1))
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)
        # The official call: 3-D [H, N, hd] operands (no batch), which PyTorch only runs on its
        # math path. Full bidirectional attention, no mask, default 1/sqrt(hd) scale.
        o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return self.wo(o.transpose(0, 1).reshape(n, -1))


class MLP(nn.Module):
    """SwiGLU without biases; w1 holds gate and up stacked."""

    def __init__(self, args):
        super().__init__()
        self.w1 = nn.Linear(args.vision_dim, 2 * args.vision_inter_dim, bias=False)
        self.w2 = nn.Linear(args.vision_inter_dim, args.vision_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w1(x).chunk(2, dim=-1)
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.norm1 = RMSNorm(args.vision_dim)
        self.attn = Attention(args)
        self.norm2 = RMSNorm(args.vision_dim)
        self.mlp = MLP(args)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Full bidirectional attention over one image with 2D RoPE; no CLS token, no absolute
    position embedding."""

    def __init__(self, args):
        super().__init__()
        self.rope_dim = args.vision_dim // args.vision_n_heads // 2
        self.rope_theta = args.vision_rope_theta
        self.patch_embed = PatchEmbed(args)
        self.blocks = nn.ModuleList([Block(args) for _ in range(args.vision_n_layers)])
        self.norm = RMSNorm(args.vision_dim)

    def forward(self, patches: torch.Tensor, n_h: int, n_w: int) -> torch.Tensor:
        x = self.patch_embed(patches)
        cos, sin = get_vision_cos_sin(n_h, n_w, self.rope_dim, self.rope_theta)
        cos, sin = cos.to(x.device), sin.to(x.device)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x)


class Aligner(nn.Module):
    """3x3 downsample into the language model's width: pad, unfold, two linears, erf GELU."""

    def __init__(self, args):
        super().__init__()
        self.downsample_ratio = args.vision_downsample_ratio
        in_dim = args.vision_dim * self.downsample_ratio ** 2
        self.w1 = nn.Linear(in_dim, args.dim)
        self.w2 = nn.Linear(args.dim, args.dim)

    def forward(self, x: torch.Tensor, n_h: int, n_w: int) -> torch.Tensor:
        r = self.downsample_ratio
        x = x.view(n_h, n_w, -1).permute(2, 0, 1)  # [C, n_h, n_w]
        x = F.pad(x, (0, -n_w % r, 0, -n_h % r))  # zeros right and bottom to whole cells
        # unfold: features channel-major (c * r*r + ky * r + kx), tokens row-major over cells
        x = F.unfold(x.unsqueeze(0), r, stride=r).squeeze(0).transpose(0, 1)  # [T, C*r*r]
        return self.w2(F.gelu(self.w1(x)))
