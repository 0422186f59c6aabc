"""The Triton flash kernels (the runtime's `triton` attention: v1, tuned, tuned_ws) compute
attention: run through Triton's CPU interpreter (TRITON_INTERPRET=1) where Triton is installed,
against SDPA, on token counts that leave the last key block partly masked or not, at head dims 64
and 72. (The interpreter's bf16 `tl.dot` is
wrong on its own, so bf16 is left to the GPU run, which compares every kernel to flash SDPA.)"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")

CODE = """
import torch
from engine.runtime import triton_attention as T
g = torch.Generator().manual_seed(0)
assert T.head_split(64) == (64, 0) and T.head_split(72) == (64, 16) and T.head_split(96) == (64, 32)
# token counts: a partly masked last key block (70, 130) and none (64); head dims 64 and 72 (Qwen3-VL's,
# not a power of 2: the tuned kernels' padded tail); every kernel variant this Triton has
for variant in T.VARIANTS:
    for hd in (64, 72):
        if variant == "v1" and hd == 72:
            continue
        for n, dt, tol in ((70, torch.float32, 1e-5), (64, torch.float32, 1e-5), (130, torch.float16, 2e-3)):
            q, k, v = (torch.randn(2, 3, n, hd, generator=g).to(dt) for _ in range(3))
            ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.2)
            cfg = (32, 32, 4, 2, variant)
            err = (T.flash_attention(q, k, v, scale=0.2, config=cfg).float() - ref).abs().max().item()
            assert err < tol, (variant, hd, n, dt, err)
            # a kernel that dropped the masked tail's -inf (or the scale) would be off by far more
            assert (T.flash_attention(q, k, v, config=cfg).float() - ref).abs().max().item() > 10 * tol
# the default (no config) on the CPU is the tuned kernel, at a power-of-2 head dim only: 72's padded
# tail faulted on the GPU, so it is declined (unavailable) and never chosen without a named config
q, k, v = (torch.randn(1, 2, 70, 64, generator=g) for _ in range(3))
ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
assert (T.flash_attention(q, k, v) - ref).abs().max().item() < 1e-5
q72 = torch.randn(1, 2, 70, 72, generator=g)
assert "head size 72" in T.unavailable(q72) and T.unavailable(q.bfloat16()) is None
try:
    T.flash_attention(q72, q72, q72)
except ValueError as e:
    assert "power-of-2" in str(e)
else:
    raise AssertionError("a head dim of 72 got a default config")
# out-of-bounds reads: every operand a narrow view into a buffer whose guard region (rows before and
# after, columns either side) holds NaN, so a load past the view's rows or its head dim shows as NaN
def guarded(n, hd, pad_rows=40, pad_cols=24):
    big = torch.full((1, 2, n + pad_rows, hd + pad_cols), float("nan"))
    view = big[:, :, 8:8 + n, 4:4 + hd]
    view.copy_(torch.randn(1, 2, n, hd, generator=g))
    return view
for variant in T.VARIANTS:
    for hd in (64, 72):
        if (variant == "v1" and hd == 72) or variant.startswith("tuned_tma"):  # TMA needs 16-byte rows
            continue
        for n in (70, 64, 33):
            q, k, v = (guarded(n, hd) for _ in range(3))
            o = T.flash_attention(q, k, v, config=(32, 32, 4, 2, variant))
            assert not torch.isnan(o).any(), ("read out of bounds", variant, hd, n)
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            assert (o - ref).abs().max().item() < 1e-5, (variant, hd, n)
# the guard proves itself: one row past the view (a last key block read unmasked) brings NaN in
q, k, v = (guarded(70, 64) for _ in range(3))
wide = k.as_strided((1, 2, 71, 64), k.stride())
assert torch.isnan(torch.nn.functional.scaled_dot_product_attention(q[:, :, :1], wide, wide)).all()
# tensor descriptors refuse a misaligned row stride before launching (a device fault would poison the process)
if T.TENSOR_DESCRIPTORS:
    q = torch.randn(1, 2, 70, 73, generator=g)[..., :72]
    try:
        T.flash_attention(q, q, q, config=(32, 32, 4, 2, "tuned_tma"))
    except ValueError as e:
        assert "16-byte" in str(e)
    else:
        raise AssertionError("a misaligned stride reached the TMA kernel")
print("ok")
"""


def test_triton_flash_matches_sdpa_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
