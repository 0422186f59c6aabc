"""Writes the two small sample dumps the README and tests use (run from the repo root).

`sample-oracle` and `sample-engine` hold a toy vision pipeline's five boundaries on a 6x9 patch
grid. The engine lays its RoPE table out interleaved instead of blocked (a real bug of this
field), so the earliest divergence is `rope`, and `block0` onwards are consequent.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from tensordiff import Recorder

GRID = (6, 9)


def pipeline(interleaved: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = GRID[0] * GRID[1]
    patches = (torch.rand(n, 588, generator=g) * 2 - 1).to(torch.bfloat16)
    inv = 1.0 / 10000 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16)
    ys, xs = torch.meshgrid(torch.arange(GRID[0]), torch.arange(GRID[1]), indexing="ij")
    fy, fx = ys.reshape(-1, 1).float() * inv, xs.reshape(-1, 1).float() * inv
    ang = torch.stack([fy, fx], -1).flatten(1) if interleaved else torch.cat([fy, fx], -1)
    w = torch.randn(588, 64, generator=g) / 588**0.5
    x = patches.float() @ w
    x1, x2 = x[:, :16], x[:, 16:32]
    rot = torch.cat([x1 * ang.cos() - x2 * ang.sin(), x2 * ang.cos() + x1 * ang.sin(), x[:, 32:]], -1)
    block0 = x + rot
    final = block0 * torch.rsqrt(block0.pow(2).mean(-1, keepdim=True) + 1e-6)
    cells = final.reshape(2, 3, 3, 3, 64).permute(0, 2, 1, 3, 4).reshape(6, 9 * 64)
    aligner = cells @ (torch.randn(9 * 64, 32, generator=g) / 24)
    return {"patches": patches, "rope.cos": ang.cos(), "rope.sin": ang.sin(), "block0": block0,
            "final_norm": final, "aligner": aligner}


def main(root: Path) -> None:
    for side, bug in (("oracle", False), ("engine", True)):
        run = {"inputs": {"image": "synthetic", "grid": list(GRID), "cells": [2, 3]}, "dtype": "float32",
               "device": "cpu", "weights": "sample-seed-0", "versions": {"torch": torch.__version__}}
        with Recorder(root / f"sample-{side}", model="tensordiff-sample", overwrite=True,
                      producer={"name": "dumps/make_samples.py", "side": side}, run=run) as rec:
            for name, t in pipeline(interleaved=bug).items():
                rec.record(name, t)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
