"""Resolving oneMKL VML's lazy kernel dispatch before two threads can race for it.

Why `rope.cos` could come out wrong under CPU load: ATen hands a
contiguous float32/float64 unary op (cos, sin, exp, sqrt, erf, ...) to MKL VML from every
intra-op thread, each on its own chunk, asking for high accuracy (VML_HA). oneMKL 2024.2, the
build linked into torch's CPU wheels, picks each VML function's kernel (ISA x accuracy) lazily on
that function's first call, and when that first call runs on two threads at once one of them can
run the low-accuracy kernel (VML_EP, ~11 bits) on its whole chunk. A fresh process's first large
`cos` is exactly that: the main thread's chunk of `rope.cos` (rows 1..N/2; row 0 is cos 0 = 1)
came out bit for bit equal to `vmsCos(..., VML_EP)`, max |cos^2 + sin^2 - 1| = 2.99e-4, on either
side, and once into the oracle cache. Every later call is right, so reruns look clean; load only
widens the window (upstream: pytorch/pytorch#188792).

`warm()` calls each VML-routed op once per dtype on a tiny tensor, below ATen's 2048-element
grain, so the call runs on one thread and resolves the dispatch before any parallel call can.
It runs once per process, before the first run of either side (`runs.make_request`,
`runs.run_side`), when a `Recorder` opens in a process that uses torch, and in the test session.
`TENSORDIFF_VML_WARMUP=0` skips it: only for demonstrating the race (`tests/tensordiff/vml_worker.py`).
"""
from __future__ import annotations

import os
import sys
import threading

# The ops ATen sends to MKL VML (aten/src/ATen/cpu/vml.h, IMPLEMENT_VML_MKL), with an input in
# each one's domain. Warming an op that a build does not route to VML costs a microsecond.
VML_OPS = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2",
           "sin", "sqrt", "tan", "tanh", "trunc")

_lock = threading.Lock()
_done = False


def enabled() -> bool:
    return os.environ.get("TENSORDIFF_VML_WARMUP", "1") != "0"


def warm() -> bool:
    """Resolve every VML op's dispatch on this thread, once per process; returns whether it ran
    now. Cheap after the first call (a flag)."""
    global _done
    if _done or not enabled():
        return False
    with _lock:
        if _done:
            return False
        import torch

        for dtype in (torch.float32, torch.float64):
            x = torch.full((8,), 0.5, dtype=dtype)
            for op in VML_OPS:
                getattr(torch, op)(x)
        _done = True
    return True


def warm_if_torch() -> bool:
    """`warm()` only in a process that already imported torch (a numpy-only producer stays
    torch-free)."""
    return "torch" in sys.modules and warm()
