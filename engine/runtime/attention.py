"""Attention over packed sequences: [N, H, hd] in, [N, H, hd] out, through 4-D SDPA.

PyTorch's fused attention kernels (flash, memory-efficient, cuDNN) accept only 4-D
[B, H, N, hd] operands; a 3-D call silently runs the math path, which materialises the N x N
score matrix (the official DeepSeek tower does that: 674 ms vs 62 ms at 8,910 patches on an
H200). So everything here goes through a 4-D call with B = 1, built from strided views (no
copies of q, k or v). On CUDA the kernel order is cuDNN, flash, efficient, math: the first that
supports the call runs.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

try:  # torch >= 2.3
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # pragma: no cover - older torch: let PyTorch choose
    SDPBackend = None
    sdpa_kernel = None


def _kernel_context(backends):
    """The allowed kernels, tried in the given order where torch supports an order."""
    try:
        return sdpa_kernel(backends, set_priority=True)
    except TypeError:  # torch < 2.6: the set only, in PyTorch's own order
        return sdpa_kernel(backends)

# Names accepted by `prefer`, in the default CUDA order.
KERNELS = ("cudnn", "flash", "efficient", "math")


def _backends(prefer: Sequence[str]):
    table = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
             "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    return [getattr(SDPBackend, table[name]) for name in prefer if hasattr(SDPBackend, table[name])]


_BROKEN: set[str] = set()  # kernels that raised at run time in this process: not asked for again


def _sdpa(q4, k4, v4, scale, prefer):
    if sdpa_kernel is None or q4.device.type != "cuda":
        return F.scaled_dot_product_attention(q4, k4, v4, scale=scale)
    names = [n for n in (prefer or KERNELS) if n not in _BROKEN]
    try:
        with _kernel_context(_backends(names)):
            return F.scaled_dot_product_attention(q4, k4, v4, scale=scale)
    except RuntimeError:
        # a kernel that accepted the call can still fail inside (cuDNN graph build): drop the
        # first choice for this process and let the next one take the call
        if len(names) < 2:
            raise
        _BROKEN.add(names[0])
        return _sdpa(q4, k4, v4, scale, [n for n in names if n != names[0]])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
              cu_seqlens: Sequence[int] | None = None, prefer: Sequence[str] | None = None) -> torch.Tensor:
    """Full (bidirectional) attention. q, k, v: [N, H, hd] with a unit last stride.

    cu_seqlens: optional host list of sequence boundaries [0, n1, n1+n2, ..., N]; each sequence
    attends only within itself (several images packed in one call). Default scale 1/sqrt(hd).
    prefer: CUDA kernel names from KERNELS to try, in order.
    Returns [N, H, hd], a view of the kernel's output (the fused kernels lay it out [1, N, H, hd],
    so a following reshape to [N, H * hd] is free there).
    """
    if cu_seqlens is None:
        bounds = [0, q.shape[0]]
    else:
        bounds = [int(b) for b in cu_seqlens]
        assert bounds[0] == 0 and bounds[-1] == q.shape[0], bounds
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        # [n, H, hd] -> [1, H, n, hd]: a strided view, no copy
        q4, k4, v4 = (t[a:b].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        o = _sdpa(q4, k4, v4, scale, prefer)  # [1, H, n, hd]
        outs.append(o.squeeze(0).transpose(0, 1))
    return outs[0] if len(outs) == 1 else torch.cat(outs, 0)
