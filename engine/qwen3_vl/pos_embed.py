"""The learned position embedding, resampled from its side x side table to the patch grid.

Bilinear with align_corners semantics: the table's corners land on the grid's corner patches
(src = i·(side−1)/(n−1)). Four taps per patch, (top, left), (top, right), (bottom, left),
(bottom, right); the rows are gathered in the table's dtype and weighted in fp32 (the pinned
transformers builds its interpolation weights in fp32 whatever the model dtype), then the sum is
cast to the tower dtype. Rows come out in merge order, like the patches.
"""
from __future__ import annotations

import torch

from ..runtime.interpolate import bilinear_taps
from ..runtime.spatial_merge import merge_order_coords


def interpolate_pos_embed(table: torch.Tensor, gh: int, gw: int, t: int, merge: int,
                          align_corners: bool = True, dtype: torch.dtype | None = None) -> torch.Tensor:
    """table: [side*side, D] -> [t*gh*gw, D] in merge order."""
    side = int(table.shape[0] ** 0.5)
    r_lo, r_hi, r_wlo, r_whi = bilinear_taps(gh, side, align_corners)
    c_lo, c_hi, c_wlo, c_whi = bilinear_taps(gw, side, align_corners)
    # The tap tables are small host tensors: index them on the host, move the results once.
    row, col = merge_order_coords(gh, gw, merge)
    row, col = row.to(r_lo.device), col.to(c_lo.device)
    taps = [
        (r_lo[row] * side + c_lo[col], r_wlo[row] * c_wlo[col]),
        (r_lo[row] * side + c_hi[col], r_wlo[row] * c_whi[col]),
        (r_hi[row] * side + c_lo[col], r_whi[row] * c_wlo[col]),
        (r_hi[row] * side + c_hi[col], r_whi[row] * c_whi[col]),
    ]
    acc = None
    for idx, w in taps:
        term = table[idx.to(table.device)] * w.to(table.device).unsqueeze(-1)  # promotes to fp32
        acc = term if acc is None else acc + term
    out = acc.to(dtype or table.dtype)  # [gh*gw, D]
    return out.repeat(t, 1)
