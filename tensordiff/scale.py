"""The scale a magnitude-aware tolerance is measured against (`Tolerance.atol_scale`).

    tol = scaled(tol, entry_a.stored)   # tol.scale = RMS of the reference's finite elements

One streamed pass over the reference tensor alone, chunk by chunk (memory bounded whatever its
size), done only for tensors whose tolerance declares a scale; the comparison pass that follows
then judges every element by the same, already known atol, so its counts stay exact.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .dtypes import to_float64
from .storage import StoredTensor
from .stream import CHUNK, release
from .tolerance import Tolerance


def rms(stored: StoredTensor) -> float:
    """Root mean square of the finite elements of a stored float tensor (0.0 when there are none)."""
    total, count = 0.0, 0
    r = stored.reader()
    try:
        for s in range(0, stored.numel, CHUNK):
            e = min(stored.numel, s + CHUNK)
            x = to_float64(r.read(s, e), stored.dtype)
            fin = np.isfinite(x)
            if not fin.all():
                x = x[fin]
            total += float(np.dot(x, x))
            count += x.size
            release(r, s, e)
    finally:
        r.close()
    return math.sqrt(total / count) if count else 0.0


def scaled(tol: Tolerance, reference: StoredTensor) -> Tolerance:
    """`tol` with its scale measured on the reference, when it declares one; else `tol` itself."""
    if tol.atol_scale == "rms":
        return replace(tol, scale=rms(reference))
    if tol.atol_scale:
        raise ValueError(f"unknown atol_scale {tol.atol_scale!r}")  # refused when a table is read
    return tol
