"""Resampling: bicubic image resizes (both Qwen2-VL processors) and bilinear taps for position tables.

Two bicubic image resizes, because the two Qwen2-VL image processors differ exactly here:
`resize_bicubic_pil` (the slow/PIL processor; our own implementation of Pillow's
fixed-point resampler, checked bit for bit against Pillow) and `resize_bicubic_aa_torch` (the fast/torchvision
processor on the CPU: torch's antialiased uint8 bicubic, a = -0.75), which differ by a few levels.

`bilinear_taps` gives, per output index, the two source indices and weights of a 1-D bilinear
resample with `align_corners` semantics (the learned 48x48 position table of Qwen3-VL).
"""
from __future__ import annotations

import math

import numpy as np
import torch


PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed point for 8-bit images (two bits of headroom)


def _bicubic(x: float) -> float:
    # Keys kernel with a = -0.5 (Pillow's choice; torch and torchvision use -0.75)
    a = -0.5
    x = abs(x)
    if x < 1.0:
        return ((a + 2.0) * x - (a + 3.0)) * x * x + 1
    if x < 2.0:
        return (((x - 5) * x + 8) * x - 4) * a
    return 0.0


def _coeffs(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel: first source index [out] and fixed-point weights [out, ksize].

    All in Python floats (C doubles), in Pillow's order of operations: the kernel is stretched by
    the downscale factor (multiplying by its reciprocal), weights are normalised by their
    sequential sum, then rounded half away from zero to 22-bit fixed point."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 2.0 * filterscale
    ksize = int(math.ceil(support)) * 2 + 1
    inv = 1.0 / filterscale
    xmins = np.zeros(out_size, np.int64)
    kk = np.zeros((out_size, ksize), np.int64)
    one = float(1 << PRECISION_BITS)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)  # int() truncates toward zero, as C does
        xmax = min(int(center + support + 0.5), in_size) - xmin
        w = [_bicubic((x + xmin - center + 0.5) * inv) for x in range(xmax)]
        ww = 0.0
        for v in w:
            ww += v
        if ww != 0.0:
            w = [v / ww for v in w]
        kk[xx, :xmax] = [int(-0.5 + v * one) if v < 0 else int(0.5 + v * one) for v in w]
        xmins[xx] = xmin
    return xmins, kk


def _pass(img: np.ndarray, out_size: int, axis: int) -> np.ndarray:
    """One separable pass along `axis` (0 rows, 1 columns) of an [H, W, C] uint8 array."""
    xmins, kk = _coeffs(img.shape[axis], out_size)
    src = np.moveaxis(img, axis, 0).astype(np.int64)  # [in, other, C]
    ksize = kk.shape[1]
    # taps past the last source row carry weight 0; pad so their reads stay in bounds
    src = np.concatenate([src, np.zeros((ksize,) + src.shape[1:], np.int64)], 0)
    acc = np.full((out_size,) + src.shape[1:], 1 << (PRECISION_BITS - 1), np.int64)
    for j in range(ksize):
        acc += src[xmins + j] * kk[:, j, None, None]
    out = np.clip(acc >> PRECISION_BITS, 0, 255).astype(np.uint8)  # clip8
    return np.moveaxis(out, 0, axis)


def resize_bicubic_pil(img: np.ndarray, height: int, width: int) -> np.ndarray:
    """img: [H, W, C] uint8 -> [height, width, C] uint8, Pillow's `resize(BICUBIC)` bit for bit.

    Two separable passes, each rounded and clipped to uint8. Pillow 13 runs the vertical pass
    first when the height shrinks by more than twice as many pixels as the width does (older
    Pillow always went horizontal first: the last bit can differ there)."""
    assert img.dtype == np.uint8 and img.ndim == 3
    h_in, w_in = img.shape[:2]
    need_h, need_v = width != w_in, height != h_in
    vertical_first = (h_in - height) > 0 and (h_in - height) > (w_in - width) * 2
    out = img
    if vertical_first:
        out = _pass(out, height, 0) if need_v else out
        out = _pass(out, width, 1) if need_h else out
    else:
        out = _pass(out, width, 1) if need_h else out
        out = _pass(out, height, 0) if need_v else out
    return np.ascontiguousarray(out)


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
