"""The aligner: 3x3 patch cells -> one language-model token each, as a device index map.

Token t = (ty, tx) over a ceil(h/3) x ceil(w/3) cell grid (row-major) reads patch
(3*ty + ky, 3*tx + kx) for ky, kx in 0..2; a position past the grid's right or bottom edge
reads zeros (the official pad). The gather puts features channel-major (c*9 + ky*3 + kx), the
order the first linear's 9216 inputs were trained on. The map is built with tensor ops on the
device: no host loop, no host round trip.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def cell_index(grid_h: int, grid_w: int, r: int = 3, device="cpu", flat_pad: bool = False) -> torch.Tensor:
    """[T, r*r] int32: source patch row of each (token, ky*r + kx), -1 where the pad is.

    flat_pad=True is the fault `aligner-flat-pad`: the patches are treated as a flat list padded
    at its end with zero rows and re-read as a (ceil(h/r)*r) x (ceil(w/r)*r) grid, which shifts
    every row after the first whenever w is not a multiple of r.
    """
    ch, cw = -(-grid_h // r), -(-grid_w // r)
    ty = torch.arange(ch, device=device).view(ch, 1, 1, 1)
    tx = torch.arange(cw, device=device).view(1, cw, 1, 1)
    ky = torch.arange(r, device=device).view(1, 1, r, 1)
    kx = torch.arange(r, device=device).view(1, 1, 1, r)
    y = ty * r + ky  # [ch, 1, r, 1]
    x = tx * r + kx  # [1, cw, 1, r]
    if flat_pad:
        flat = y * (cw * r) + x  # row-major over the padded grid width
        src = torch.where(flat < grid_h * grid_w, flat, torch.full_like(flat, -1))
    else:
        inside = (y < grid_h) & (x < grid_w)
        src = torch.where(inside, y * grid_w + x, torch.full_like(y * x, -1))
    return src.expand(ch, cw, r, r).reshape(ch * cw, r * r).to(torch.int32)


@dataclass
class AlignerWeights:
    w1: torch.Tensor  # [dim, C*r*r]
    b1: torch.Tensor
    w2: torch.Tensor  # [dim, dim]
    b2: torch.Tensor


SPLIT_K = 64  # `splitk-bf16`: the width of one partial sum


def _splitk_rounded(cells: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The fault `splitk-bf16`: w1 as split-K partial sums, each rounded to bf16 and summed in
    bf16 (a split-K kernel that keeps its partials in the output dtype instead of fp32)."""
    acc = None
    for k in range(0, cells.shape[-1], SPLIT_K):
        part = (cells[:, k:k + SPLIT_K].float() @ w[:, k:k + SPLIT_K].float().T).to(torch.bfloat16)
        acc = part if acc is None else (acc + part).to(torch.bfloat16)
    return (acc.float() + b.float()).to(cells.dtype)


def align(x: torch.Tensor, index: torch.Tensor, w: AlignerWeights, backend, gelu_tanh: bool = False,
          splitk_bf16: bool = False) -> torch.Tensor:
    """x: [N, C] final-norm patches; index: [T, r*r] -> [T, dim]."""
    cells = backend.aligner_gather(x, index)  # [T, C*r*r] channel-major
    h = _splitk_rounded(cells, w.w1, w.b1) if splitk_bf16 else backend.linear(cells, w.w1, w.b1)
    h = F.gelu(h, approximate="tanh" if gelu_tanh else "none")
    return backend.linear(h, w.w2, w.b2)
