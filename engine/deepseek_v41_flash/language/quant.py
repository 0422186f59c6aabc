"""Activation fake-quantisation inside attention, as the released kernels do it in place:
FP8 (e4m3, power-of-two scale per 32 channels) for the window KV, FP4 (e2m1) for the indexer's
q / k (power-of-two scales per 32) and for the compressed KV (e4m3 scales per 16).
Values go to the low-precision grid and straight back to the activation dtype.
"""
from __future__ import annotations

import torch

FP8_MAX, FP4_MAX = 448.0, 6.0


def pow2_ceil(v: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 v) for positive normal fp32 v, from the bits: the exponent, plus one when the
    mantissa is not zero."""
    bits = v.float().contiguous().view(torch.int32)
    exp = (bits >> 23) & 0xFF
    exp = exp + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exp << 23).view(torch.float32)


def fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    g = x.float().reshape(*x.shape[:-1], -1, block)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2_ceil(amax * torch.tensor(1 / FP8_MAX, dtype=torch.float32))
    q = torch.clamp(g / s, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * s).reshape(x.shape).to(x.dtype)


def e2m1(v: torch.Tensor) -> torch.Tensor:
    """Round to the FP4 grid {0, .5, 1, 1.5, 2, 3, 4, 6} (|v| <= 6), ties to even codes: the grid
    is uniform within [0, 2), [2, 4), [4, 6] (steps .5, 1, 2), and an even code is an even multiple
    of the step there, so round-half-even per segment is the kernel's rounding."""
    a = v.abs()
    step = torch.where(a < 2, torch.full_like(a, 0.5), torch.where(a < 4, torch.ones_like(a), torch.full_like(a, 2.0)))
    r = torch.round(a / step) * step  # torch.round: half to even
    return torch.copysign(r, v)


def fp4(x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
    g = x.float().reshape(*x.shape[:-1], -1, block)
    amax = g.abs().amax(-1, keepdim=True)
    if e4m3_scale:
        s = torch.clamp(amax.clamp_min(6 * 2.0 ** -9) / FP4_MAX, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    else:
        s = pow2_ceil(amax.clamp_min(6 * 2.0 ** -126) * torch.tensor(1 / FP4_MAX, dtype=torch.float32))
    return (e2m1(torch.clamp(g / s, -FP4_MAX, FP4_MAX)) * s).reshape(x.shape).to(x.dtype)
