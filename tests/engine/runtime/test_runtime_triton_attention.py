"""The Triton flash kernel (the runtime's `triton` attention) computes attention: run
through Triton's CPU interpreter (TRITON_INTERPRET=1) where Triton is installed, against SDPA, on
a token count that leaves the last key block partly masked. (The interpreter's bf16 `tl.dot` is
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
from engine.runtime.triton_attention import flash_attention
g = torch.Generator().manual_seed(0)
for n, dt, tol in ((70, torch.float32, 1e-5), (130, torch.float16, 2e-3)):
    q, k, v = (torch.randn(2, 3, n, 64, generator=g).to(dt) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.2)
    err = (flash_attention(q, k, v, scale=0.2).float() - ref).abs().max().item()
    assert err < tol, (n, dt, err)
    # a kernel that dropped the masked tail's -inf (or the scale) would be off by far more
    assert (flash_attention(q, k, v).float() - ref).abs().max().item() > 10 * tol
print("ok")
"""


def test_triton_flash_matches_sdpa_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
