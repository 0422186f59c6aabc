"""The tower's 2D rotary embedding, one angle table per patch in merge order.

head_dim is split in halves for rotate_half; each half is [row angles | col angles], each of
head_dim/4 frequencies inv_freq_j = theta^(−2j/(head_dim/2)). So emb = cat(r·f, c·f, r·f, c·f),
and the boundary is cos(emb), sin(emb) in fp32, [N, head_dim].
"""
from __future__ import annotations

import torch

from ..runtime.spatial_merge import merge_order_coords


def inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    d = head_dim // 2
    return 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))


def vision_rope(gh: int, gw: int, t: int, merge: int, head_dim: int, theta: float,
                swap_hw: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """-> cos, sin: [t*gh*gw, head_dim] fp32. `swap_hw` is the planted bug (col, row)."""
    row, col = merge_order_coords(gh, gw, merge)
    if swap_hw:
        row, col = col, row
    f = inv_freq(head_dim, theta)
    fr = row.float()[:, None] * f  # [N, hd/4]
    fc = col.float()[:, None] * f
    half = torch.cat([fr, fc], -1)  # [N, hd/2]
    emb = torch.cat([half, half], -1).repeat(t, 1)  # [t*N, hd]
    return emb.cos(), emb.sin()
