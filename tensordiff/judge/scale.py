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

from tensordiff.format.dtypes import to_float64
from tensordiff.format.storage import StoredTensor
from tensordiff.judge.stream import CHUNK, release
from tensordiff.judge.tolerance import Tolerance


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


def scaled(tol: Tolerance, reference: StoredTensor, memo: dict | None = None, sha256: str | None = None) -> Tolerance:
    """`tol` with its scale measured on the reference, when it declares one; else `tol` itself.
    `memo` (with the reference's manifest `sha256`): scales already measured, by tensor, so one
    reference judged twice (a case's comparison, then its local error) is read once."""
    if tol.atol_scale == "rms":
        if memo is None or sha256 is None:
            return replace(tol, scale=rms(reference))
        k = (str(reference.file), reference.key, reference.offset, sha256)
        if k not in memo:
            memo[k] = rms(reference)
        return replace(tol, scale=memo[k])
    if tol.atol_scale:
        raise ValueError(f"unknown atol_scale {tol.atol_scale!r}")  # refused when a table is read
    return tol
