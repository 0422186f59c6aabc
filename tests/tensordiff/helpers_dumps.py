"""Small dump builders shared by the core tests."""
from __future__ import annotations

import torch

from tensordiff import Recorder


def write(path, tensors: dict, model="toy", run=None, fmt="safetensors", boundaries=None):
    with Recorder(path, model=model, run=run or {}, fmt=fmt, producer={"name": "test"}) as r:
        for k, v in tensors.items():
            r.record(k, v, boundary=(boundaries or {}).get(k))
    return path


def pipeline(seed=0, n=24, d=16):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g)
    return {"patches": x.clone(), "rope.cos": torch.cos(x[:, :4]), "rope.sin": torch.sin(x[:, :4]),
            "block0": x * 2, "final_norm": x * 3, "aligner": x[:6] * 4}
