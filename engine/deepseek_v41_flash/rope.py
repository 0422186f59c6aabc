"""2D RoPE tables for a patch grid, built on the device.

For patch (row, col) of an h x w grid, with f_j = theta^(-2j/d) for j < d/2 (d = the rope dim,
half a head): angles = [row * f_0 .. row * f_{d/2-1}, col * f_0 .. col * f_{d/2-1}] (blocked:
all row angles, then all column angles). The tables are [N, d] fp32 and are applied rotate-half
over the whole head (the first half of the head pairs with the second), so one table row serves
both halves.
"""
from __future__ import annotations

import torch


def rope_tables(grid_h: int, grid_w: int, dim: int, theta: float, device="cpu",
                interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [grid_h * grid_w, dim] fp32, rows in raster order.

    interleaved=True is the fault `rope-interleaved`: (row, col) alternate per frequency.
    """
    half = dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))  # [half]
    idx = torch.arange(grid_h * grid_w, device=device)
    rows = (idx // grid_w).float()
    cols = (idx % grid_w).float()
    row_ang = rows[:, None] * inv_freq  # [N, half]
    col_ang = cols[:, None] * inv_freq
    if interleaved:
        angles = torch.stack([row_ang, col_ang], dim=-1).reshape(-1, dim)
    else:
        angles = torch.cat([row_ang, col_ang], dim=-1)
    assert angles.shape[-1] == 2 * half
    return angles.cos(), angles.sin()
