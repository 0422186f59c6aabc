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


def reduction_pair(seed=0, s=16, k=2048, v=8192):
    """A clean fp32 LM-head pair as measured on the H200 (Qwen3-VL full-2b): hidden [s, k] of RMS
    ~5.5 times a [k, v] matrix, logits of RMS ~45. B's hidden carries the fp32 noise of a deep
    stack (2e-6 relative, as `hidden.27` there) and B sums the k terms in another order (split-K):
    both fp32 routes are right, and their logits differ by ~2e-6 of the tensor's RMS everywhere."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(s, k, generator=g) * 5.5
    w = torch.randn(k, v, generator=g) * (45 / 5.5 / k ** 0.5)
    a = x @ w
    xb = x * (1 + 2e-6 * torch.randn(s, k, generator=g))
    h = k // 2
    b = xb[:, h:] @ w[h:] + xb[:, :h] @ w[:h]
    return a, b
