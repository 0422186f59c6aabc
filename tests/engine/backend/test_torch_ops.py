"""engine/backend/torch_ops.py: the reference rope, written per half, gives the whole-width
formula's numbers bit for bit (it is the semantics every backend is held to)."""
from __future__ import annotations

import pytest
import torch

from engine.backend.torch_ops import TorchBackend


def whole_width_rope(x, cos, sin):
    """x*cos + rotate_half(x)*sin over the whole head width (the formula as first written)."""
    hd = x.shape[-1]
    if cos.shape[-1] * 2 == hd:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    c, s, xf = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2), x.float()
    rot = torch.cat([-xf[..., hd // 2:], xf[..., : hd // 2]], -1)
    return (xf * c + rot * s).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("table", ["half", "full", "full-uneven"])
def test_rope_per_half_is_the_whole_width_formula_bit_for_bit(dtype, table):
    g = torch.Generator().manual_seed(0)
    n, heads, hd = 37, 3, 16
    x = torch.randn(n, heads, hd, generator=g).to(dtype)
    ang = torch.rand(n, hd // 2, generator=g) * 50
    cos, sin = ang.cos(), ang.sin()
    if table != "half":  # Qwen3-VL's cat(rot, rot) table; 'uneven': halves that differ
        other = ang * 1.5 if table == "full-uneven" else ang
        cos, sin = torch.cat([cos, other.cos()], -1), torch.cat([sin, other.sin()], -1)
    got = TorchBackend().rope_rotate_half(x, cos, sin)
    want = whole_width_rope(x, cos, sin)
    assert got.dtype == dtype and torch.equal(got, want)
    # and it is a rotation at all: a swapped sign would not be (the fault this test would see)
    assert not torch.equal(got, whole_width_rope(x, cos, -sin))
