"""Resampling: bicubic image resizes (both Qwen2-VL processors) and bilinear taps for position tables.

Two bicubic image resizes, because the two Qwen2-VL image processors differ exactly here:
`resize_bicubic_pil` (the slow/PIL processor) and `resize_bicubic_aa_torch` (the fast/torchvision
processor on the CPU: torch's antialiased uint8 bicubic, a = -0.75), which differ by a few levels.

`bilinear_taps` gives, per output index, the two source indices and weights of a 1-D bilinear
resample with `align_corners` semantics (the learned 48x48 position table of Qwen3-VL).
"""
from __future__ import annotations

import numpy as np
import torch


def resize_bicubic_pil(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """img: [H, W, 3] uint8 -> [height, width, 3] uint8 with Pillow's BICUBIC (a = -0.5, support
    scaled when downscaling, 22-bit fixed point, clipped to uint8 after each pass).

    Pillow itself runs the filter: its choice of pass order (horizontal or vertical first) changes
    the last bit and is not documented, so a re-implementation would only approximate it."""
    from PIL import Image

    assert img.dtype == np.uint8 and img.ndim == 3
    out = Image.fromarray(np.ascontiguousarray(img)).resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(out, dtype=np.uint8).copy()


def resize_bicubic_aa_torch(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """img: [H, W, C] uint8 -> uint8, torch's antialiased bicubic on uint8 (a = -0.75).

    This is what torchvision's `resize(uint8 tensor, BICUBIC, antialias=True)` runs on the CPU
    (the fast Qwen2-VL image processor); it differs from Pillow by a few levels where one axis is
    upsampled."""
    t = torch.from_numpy(np.ascontiguousarray(img)).permute(2, 0, 1)[None]
    o = torch.nn.functional.interpolate(t, size=(height, width), mode="bicubic", antialias=True, align_corners=False)
    return o[0].permute(1, 2, 0).contiguous().numpy()


def bilinear_taps(n_out: int, n_in: int, align_corners: bool = True) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """1-D bilinear resample of n_in samples to n_out: (lo, hi, w_lo, w_hi), each [n_out].

    align_corners=True maps the end points onto each other (src = i·(n_in−1)/(n_out−1));
    False uses half-pixel centres (src = (i+0.5)·n_in/n_out − 0.5, clamped at 0), the
    F.interpolate default. Weights are fp32."""
    i = torch.arange(n_out, dtype=torch.float32)
    if align_corners:
        src = i * (n_in - 1) / max(n_out - 1, 1)
    else:
        src = ((i + 0.5) * n_in / n_out - 0.5).clamp(min=0.0)
    lo = src.floor().long().clamp(max=n_in - 1)
    hi = (lo + 1).clamp(max=n_in - 1)
    w_hi = src - lo.float()
    w_lo = 1.0 - w_hi
    return lo, hi, w_lo, w_hi
