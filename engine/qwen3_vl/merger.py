"""Patch mergers: 2x2 neighbouring patches -> one token of the text width.

The primary merger normalises each patch (LayerNorm over hidden) and then shuffles; the DeepStack
mergers shuffle first and normalise the 4·hidden row (`use_postshuffle_norm`). Both continue
fc1 -> exact-erf GELU -> fc2. The two orders are composed in `vision.VisionTower` (the primary
merger's norm output is a boundary of its own); the pieces are here.
"""
from __future__ import annotations

import torch

from .layers import gelu_erf, layer_norm


def norm(w: dict[str, torch.Tensor], pre: str, x: torch.Tensor) -> torch.Tensor:
    """The merger's LayerNorm over the last dimension (hidden, or m²·hidden after a shuffle)."""
    return layer_norm(x, w[f"{pre}.norm.weight"], w[f"{pre}.norm.bias"])


def project(backend, w: dict[str, torch.Tensor], pre: str, h: torch.Tensor, act=gelu_erf) -> torch.Tensor:
    """Shuffled, normed rows [N/m², m²·hidden] -> fc1 -> act -> fc2 -> [N/m², out_hidden]."""
    h = act(backend.linear(h, w[f"{pre}.linear_fc1.weight"], w[f"{pre}.linear_fc1.bias"]))
    return backend.linear(h, w[f"{pre}.linear_fc2.weight"], w[f"{pre}.linear_fc2.bias"])
