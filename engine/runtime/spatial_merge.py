"""Spatial merge: the 2x2 (m x m) grouping of patches that a merger turns into one token.

Rows in "merge order" list the patches of one m x m block contiguously, blocks in raster order:
row r -> (block_row, block_col, in_row, in_col), patch (block_row*m + in_row, block_col*m + in_col).
A merger then only reshapes [N, C] -> [N/m², m²·C]: the order IS the grouping.
"""
from __future__ import annotations

import torch


def merge_order_coords(gh: int, gw: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each patch in merge order, each [gh*gw] int64."""
    if gh % m or gw % m:
        raise ValueError(f"grid {gh}x{gw} is not a multiple of the merge size {m}")
    r = torch.arange(gh).view(gh // m, m, 1, 1).expand(gh // m, m, gw // m, m)
    c = torch.arange(gw).view(1, 1, gw // m, m).expand(gh // m, m, gw // m, m)
    # [block_row, in_row, block_col, in_col] -> [block_row, block_col, in_row, in_col]
    return r.permute(0, 2, 1, 3).reshape(-1), c.permute(0, 2, 1, 3).reshape(-1)


def raster_coords(gh: int, gw: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, col) of each patch in plain raster order."""
    return torch.arange(gh).repeat_interleave(gw), torch.arange(gw).repeat(gh)


def merge_order_index(gh: int, gw: int, m: int) -> torch.Tensor:
    """Raster index of each merge-order row: x_merge = x_raster[index]."""
    r, c = merge_order_coords(gh, gw, m)
    return r * gw + c


def shuffle(x: torch.Tensor, m: int) -> torch.Tensor:
    """x: [N, C] in merge order -> [N/m², m²·C] (one row per merged token, in-block row-major)."""
    n, c = x.shape
    assert n % (m * m) == 0, f"{n} rows do not form whole {m}x{m} groups"
    return x.reshape(n // (m * m), m * m * c)
