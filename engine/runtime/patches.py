"""Pixels to patch rows: normalisation by lookup table, and the patch flatten.

Normalisation maps uint8 values, so a 256-entry table per channel is exact and cheap: each
entry is computed with the same fp32 operations a float pipeline would run on every pixel
(`(v * scale - mean) / std`), so the result is bit-identical to that pipeline, then cast once.
Patches are cut on the uint8 picture (4x less to move than floats) and the table is applied
last, on the device.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def normalize_table(mean: Sequence[float], std: Sequence[float], scale: float = 1 / 255,
                    dtype: torch.dtype = torch.float32, device=None) -> torch.Tensor:
    """[C, 256]: entry [c, v] = ((v / (1/scale)) - mean[c]) / std[c] in fp32, cast to `dtype`.

    With scale = 1/255 the division is by 255.0, as `x / 255` does it (not a multiply by the
    rounded reciprocal, which differs in the last fp32 bit for some v).
    """
    v = torch.arange(256, dtype=torch.float32)
    divisor = float(round(1 / scale)) if abs(round(1 / scale) * scale - 1) < 1e-12 else None
    base = v / divisor if divisor is not None else v * scale
    rows = [(base - float(m)) / float(s) for m, s in zip(mean, std)]
    return torch.stack(rows).to(dtype=dtype, device=device)


def patchify(pixels: torch.Tensor, patch: int, merge: int = 1) -> torch.Tensor:
    """pixels: [H, W, C] (any dtype), H and W multiples of patch*merge -> [N, C * patch * patch].

    Each row is one patch flattened as (c, y, x). Rows are in raster order over the patch grid
    when merge == 1; with merge == m, the m x m patches of each merge window are contiguous
    (window raster order, then raster order inside the window).
    """
    h, w, c = pixels.shape
    gh, gw = h // patch, w // patch
    assert gh * patch == h and gw * patch == w and gh % merge == 0 and gw % merge == 0, (pixels.shape, patch, merge)
    x = pixels.reshape(gh // merge, merge, patch, gw // merge, merge, patch, c)
    # -> [gh/m, gw/m, m, m, C, p, p]
    x = x.permute(0, 3, 1, 4, 6, 2, 5)
    return x.reshape(gh * gw, c * patch * patch)


def apply_table(rows: torch.Tensor, table: torch.Tensor, channels: int) -> torch.Tensor:
    """Normalise uint8 patch rows [N, C*k] (channel-major inside a row) through table [C, 256]."""
    n, width = rows.shape
    per = width // channels
    idx = rows.long().view(n, channels, per)
    # offset channel c into its own 256-entry stretch of the flat table
    offs = (torch.arange(channels, device=rows.device) * 256).view(1, channels, 1)
    return table.reshape(-1)[idx + offs].view(n, width)


def to_device_pixels(pixels: np.ndarray, device) -> torch.Tensor:
    """uint8 [H, W, C] numpy -> torch on `device` (pinned-free, one copy)."""
    return torch.from_numpy(np.ascontiguousarray(pixels)).to(device)
