"""The language model's RoPE: adjacent channel pairs rotated, on the last `rope_head_dim`
channels of a head only; YaRN-stretched frequencies on layers with compressed KV.

Tables are real cos/sin [positions, rd/2] (the engine never builds complex tensors).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch


def _stretch(rd: int, original_seq_len: int, theta: float, beta_fast: int, beta_slow: int) -> torch.Tensor:
    """[rd/2] YaRN blend per channel pair: 0 keeps its frequency, 1 takes frequency / factor.

    Pair i turns original_seq_len * theta^(-2i/rd) / 2pi times over the original context; the
    blend ramps linearly over the pair indices between the one turning `beta_fast` times and
    the one turning `beta_slow` times (the latter rounded up, clipped to the channels)."""
    at = [rd * math.log(original_seq_len / (2 * math.pi * turns)) / (2 * math.log(theta))
          for turns in (beta_fast, beta_slow)]
    first, last = max(math.floor(at[0]), 0), min(math.ceil(at[1]), rd - 1)
    pairs = torch.arange(rd // 2, dtype=torch.float32)
    return ((pairs - first) / max(last - first, 1e-3)).clamp(0, 1)


@lru_cache(8)
def table(rd: int, n: int, original_seq_len: int, theta: float, factor: float, beta_fast: int,
          beta_slow: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, rd/2] fp32 for positions 0..n-1; YaRN-stretched when original_seq_len > 0."""
    inv = 1.0 / (theta ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if original_seq_len > 0:
        t = _stretch(rd, original_seq_len, theta, beta_fast, beta_slow)
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
