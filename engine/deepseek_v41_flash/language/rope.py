"""The language model's RoPE: adjacent channel pairs rotated, on the last `rope_head_dim`
channels of a head only; YaRN-stretched frequencies on layers with compressed KV.

Tables are real cos/sin [positions, rd/2] (the engine never builds complex tensors).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch


@lru_cache(8)
def table(rd: int, n: int, original_seq_len: int, theta: float, factor: float, beta_fast: int,
          beta_slow: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, rd/2] fp32 for positions 0..n-1."""
    inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if original_seq_len > 0:
        # channel index whose wavelength fits `turns` rotations into the original context
        def channel(turns: float) -> float:
            return rd * math.log(original_seq_len / (turns * 2 * math.pi)) / (2 * math.log(theta))

        lo = max(math.floor(channel(beta_fast)), 0)
        hi = min(math.ceil(channel(beta_slow)), rd - 1)
        t = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
        inv = inv * (1 - t) + (inv / factor) * t
    ang = torch.arange(n, dtype=torch.float32).unsqueeze(1) * inv.unsqueeze(0)
    return torch.cos(ang), torch.sin(ang)


def rotate_pairs(x: torch.Tensor, rd: int, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x: [n, ..., hd]; cos/sin: [n, rd/2] for x's positions. Pairs (2i, 2i+1) of the last `rd`
    channels rotate by the angle (by minus the angle when `inverse`); returns x.dtype."""
    shape = (cos.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[1],)
    c, s = cos.view(shape), sin.view(shape)
    if inverse:
        s = -s
    tail = x[..., -rd:].float()
    even, odd = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack([even * c - odd * s, even * s + odd * c], dim=-1).flatten(-2)
    return torch.cat([x[..., :-rd], rot.to(x.dtype)], dim=-1)
