"""The reference: a small vision encoder written the usual PyTorch way (modules, nn.LayerNorm,
nn.MultiheadAttention). Its boundaries are recorded with `tensordiff.tap`, by module path."""
from __future__ import annotations

import torch
from torch import nn

PATCH = 8


class Patchify(nn.Module):
    """(C, H, W) -> (h*w, C*P*P): patches in raster order of the grid, (c, y, x) inside a patch."""

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        c, hh, ww = image.shape
        h, w = hh // PATCH, ww // PATCH
        rows = []
        for gy in range(h):
            for gx in range(w):
                rows.append(image[:, gy * PATCH:(gy + 1) * PATCH, gx * PATCH:(gx + 1) * PATCH].reshape(-1))
        return torch.stack(rows)


class Embed(nn.Module):
    def __init__(self, n_patches: int, dim: int, width: int):
        super().__init__()
        self.proj = nn.Linear(dim, width)
        self.pos = nn.Parameter(torch.randn(n_patches, width) * 0.02)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.proj(patches) + self.pos


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)[None]
        x = x + self.attn(h, h, h, need_weights=False)[0][0]
        return x + self.mlp(self.norm2(x))


class PatchModel(nn.Module):
    def __init__(self, grid: tuple[int, int], channels: int = 3, width: int = 32, heads: int = 2, depth: int = 2):
        super().__init__()
        self.patchify = Patchify()
        self.embed = Embed(grid[0] * grid[1], channels * PATCH * PATCH, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(width)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        x = self.embed(self.patchify(image))
        for b in self.blocks:
            x = b(x)
        return self.norm(x)


# The reference's boundaries: tensor name -> module path (what `tensordiff.tap` hooks)
TAPS = {"patches": "patchify", "embed": "embed", "block.0": "blocks.0", "block.1": "blocks.1", "final_norm": "norm"}
