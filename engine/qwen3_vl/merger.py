"""Patch mergers: 2x2 neighbouring patches -> one token of the text width.

The primary merger normalises each patch (LayerNorm over hidden) and then shuffles; the DeepStack
mergers shuffle first and normalise the 4·hidden row (`use_postshuffle_norm`). Both continue
fc1 -> exact-erf GELU -> fc2.
"""
from __future__ import annotations

import torch

from ..runtime.spatial_merge import shuffle
from .layers import gelu_erf, layer_norm


def merge(backend, w: dict[str, torch.Tensor], pre: str, x: torch.Tensor, m: int, postshuffle: bool,
          taps: dict | None = None, act=gelu_erf) -> torch.Tensor:
    """x: [N, hidden] in merge order -> [N/m², out_hidden]. `taps` receives the norm output."""
    if postshuffle:
        h = layer_norm(shuffle(x, m), w[f"{pre}.norm.weight"], w[f"{pre}.norm.bias"])
    else:
        normed = layer_norm(x, w[f"{pre}.norm.weight"], w[f"{pre}.norm.bias"])  # [N, hidden]
        if taps is not None:
            taps["norm"] = normed
        h = shuffle(normed, m)
    h = act(backend.linear(h, w[f"{pre}.linear_fc1.weight"], w[f"{pre}.linear_fc1.bias"]))
    return backend.linear(h, w[f"{pre}.linear_fc2.weight"], w[f"{pre}.linear_fc2.bias"])
